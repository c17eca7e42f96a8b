"""The training rollout, decode and reward in sample batches (``algorithm.rollout_batch``, the model's
``default_rollout_batch``): a chunked iteration is the one-call iteration up to float rounding, and the calls it
makes hold at most the chunk's rows.

The equivalence runs on the tiny tier in float64 (a random SD3 transformer, CFG on), chunks of 3 over batches of 8 (so
the last chunk is short): latents, log-probs, the decoded state, rewards, advantages and the update's gradient of
Flow-GRPO (with and without its kept rollout graphs), Flow-GRPO-Fast's branched prefix, DanceGRPO's shared noise and
predicted-x0 reward, MixGRPO's window and OP-GRPO's replayed samples (its second iteration). The call bounds are
counted with forward hooks on a tiny random diffusers SD3 pipeline (benchmark/perf/pipeline.py).
"""

from __future__ import annotations

import types

import pytest
import torch

from flowzoo import algorithms, models
from flowzoo.algorithms.engine.base import AlgorithmConfig
from flowzoo.algorithms.engine.rollout import chunk_spans
from flowzoo.errors import ConfigError
from flowzoo.rewards.base import Reward, RewardOutput

TINY_ARCH = dict(layers=1, heads=2, head_dim=8, text_width=16, text_layers=1, text_heads=2)
PROMPTS = ["a red circle", "two blue squares"]
CHUNK = 3  # 2 prompts x G 4 = 8 samples: chunks of 3, 3 and 2


class Brightness(Reward):
    """A dense reward with a component: the mean pixel value and its square; records the samples of every call."""

    name = "brightness"
    accepts = ("image",)

    def __init__(self):
        self.calls: list[int] = []

    def score(self, samples, prompts, metadata):
        assert len(samples) == len(prompts) == len(metadata)
        self.calls.append(len(samples))
        mean = samples.double().mean(dim=(1, 2, 3))
        return RewardOutput(mean.float(), {"square": (mean ** 2).float()})


#: per algorithm: its config on the tiny tier at T = 4, and the iterations to compare (OP-GRPO's second replays)
CASES = {
    "flow_grpo": ({"reuse_rollout_graph": False}, 1),
    "flow_grpo-kept-graphs": ({"reuse_rollout_graph": True}, 1),
    "flow_grpo_fast-branched": ({"shared_prefix": True, "sde_window_size": 1, "sde_window_start": 1}, 1),
    "dance_grpo": ({}, 1),
    "mix_grpo": ({"window_size": 2}, 1),
    "op_grpo": ({"t_off": 2}, 2),
}


def _tiny():
    pytest.importorskip("diffusers")
    return models.get("tiny")(weights=None, arch=TINY_ARCH, lora_rank=2, lora_alpha=4, dtype="float64")


def _iterations(case: str, rollout_batch: int | None):
    """What each iteration of ``case`` computed: (trajectory fields, advantages, gradients after the update)."""
    name = case.split("-")[0]
    config, iterations = CASES[case]
    model = _tiny()
    assert model.default_rollout_batch is None  # the tiny tier rolls out in one call
    reward = Brightness()
    alg = algorithms.get(name)(model, reward, {"group_size": 4, "num_steps": 4, "lr": 1e-3, "kl_beta": 0.04,
                                               "rollout_batch": rollout_batch, **config}, seed=0)
    seen = []
    update = alg.update

    def recorded(traj, advantages):
        record = {"latents": traj.latents.clone(), "log_probs": traj.log_probs.clone(),
                  "rewarded": traj.rewarded.clone(), "rewards": traj.rewards.clone(),
                  "square": traj.reward_components["square"].clone(), "advantages": advantages.clone(),
                  "off_policy": traj.off_policy.clone(), "log_weight": traj.log_weight.clone(),
                  "kept": sorted(traj.live or {})}
        result = update(traj, advantages)
        record["grads"] = [p.grad.clone() for p in model.trainable_parameters()]
        seen.append(record)
        return result

    alg.update = recorded
    rows, collecting = [], []  # per iteration, the rows of every transformer call made while its batch is collected
    predict, collect = model.predict, alg.collect

    def counted_predict(x, sigma, cond):
        if collecting:
            rows[-1].append(x.shape[0])
        return predict(x, sigma, cond)

    def counted_collect(*args):
        collecting.append(True)
        rows.append([])
        try:
            return collect(*args)
        finally:
            collecting.clear()

    model.predict, alg.collect = counted_predict, counted_collect
    for _ in range(iterations):
        alg.step(PROMPTS, [{} for _ in PROMPTS])
    return seen, reward.calls, rows, alg


@pytest.mark.parametrize("case", list(CASES))
def test_a_chunked_iteration_is_the_one_call_iteration(case):
    whole, whole_calls, whole_rows, _ = _iterations(case, None)
    chunked, chunked_calls, chunked_rows, _ = _iterations(case, CHUNK)
    assert whole_calls == [8] * len(whole)  # one reward call of all 8 samples per iteration
    assert chunked_calls == [3, 3, 2] * len(chunked)
    # the rollout's transformer calls (CFG: [cond; uncond]) hold at most a chunk's pair, where one call held them all
    whole_rows, chunked_rows = sum(whole_rows, []), sum(chunked_rows, [])
    assert max(whole_rows) == 16 and max(chunked_rows) == 2 * CHUNK and sum(chunked_rows) == sum(whole_rows)
    if case.startswith("op_grpo"):
        assert bool(chunked[-1]["off_policy"].any()), "the second iteration replays buffer samples"
    if case == "flow_grpo-kept-graphs":
        assert chunked[0]["kept"] == whole[0]["kept"] == [0, 1, 2]  # the graphs of every chunk, concatenated
    for one, other in zip(whole, chunked):
        for key in ("latents", "rewarded", "log_weight"):
            torch.testing.assert_close(other[key], one[key], rtol=1e-10, atol=1e-12, msg=f"{case}: {key}")
        for key in ("log_probs", "rewards", "square", "advantages"):  # float32 by contract
            torch.testing.assert_close(other[key], one[key], rtol=1e-5, atol=1e-6, msg=f"{case}: {key}")
        assert torch.equal(other["off_policy"], one["off_policy"])
        assert any(g.abs().sum() > 0 for g in one["grads"])
        for g_chunked, g_whole in zip(other["grads"], one["grads"]):
            torch.testing.assert_close(g_chunked, g_whole, rtol=1e-5, atol=1e-9, msg=f"{case}: gradient")


@pytest.mark.parametrize("rollout_batch", [None, 1, CHUNK])
def test_op_grpo_counts_the_calls_its_rows_decide_for_lockstep_padding(rollout_batch):
    """``_uneven_calls`` (what a sharded process pads to) is the collect's calls beyond the ones every process makes
    (the regenerated steps t_off .. T-1 of its equal share of the batch), chunked or not."""
    seen, _, rows, alg = _iterations("op_grpo", rollout_batch)
    off_policy = seen[-1]["off_policy"]
    n_replayed = int(off_policy.sum())
    n_fresh = len(off_policy) - n_replayed
    assert n_replayed and n_fresh
    shared = (alg.num_steps - alg.t_off) * len(chunk_spans(len(off_policy), rollout_batch))
    assert len(rows[-1]) == shared + alg._uneven_calls(n_fresh, n_replayed)
    assert max(rows[-1]) == 2 * min(rollout_batch or len(off_policy), len(off_policy))


def test_branched_prefix_padding_runs_uncounted_calls_that_change_nothing():
    """A sharded Flow-GRPO-Fast process with fewer prefix chunks than another pads with one-row prefix runs, right
    after its own prefix: the same samples, the NFE of the real calls only."""
    from flowzoo.algorithms.engine.rollout import branched_rollout

    model = _tiny()
    alg = algorithms.get("flow_grpo_fast")(model, Brightness(), {"group_size": 4, "num_steps": 4, "sde_window_size": 1,
                                                                "sde_window_range": 3, "sde_window_start": 2,
                                                                "shared_prefix": True}, seed=0)
    calls = []
    predict = model.predict
    model.predict = lambda x, sigma, cond: calls.append(x.shape[0]) or predict(x, sigma, cond)
    out = {}
    for padding in (0, 2):
        inputs = alg.fresh_inputs(PROMPTS, [{}, {}], shared_noise=True)  # fresh generators, the same noise
        calls.clear()
        model.nfe = 0
        out[padding] = branched_rollout(model, inputs.cond, inputs.plan, inputs.x, inputs.generators, inputs.group, 2,
                                        chunk=1, prefix_padding=padding)
        out[padding] += (list(calls), model.nfe)
    # 2 groups, chunk 1: 2 prefix steps x 2 head chunks, (2 padding runs x 2 steps), then 2 steps x 8 samples; every
    # call one sample's CFG pair
    assert out[0][2] == [2] * (4 + 16) and out[2][2] == [2] * (4 + 4 + 16)
    assert out[0][3] == out[2][3]
    assert torch.equal(out[0][0], out[2][0]) and torch.equal(out[0][1], out[2][1])


def test_chunk_spans_cover_the_batch_in_order():
    assert chunk_spans(8, 3) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    assert chunk_spans(8, None) == [slice(0, 8)] and chunk_spans(8, 8) == [slice(0, 8)] == chunk_spans(8, 20)
    assert chunk_spans(0, 3) == [slice(0, 0)]
    with pytest.raises(ValueError, match="at least one row, got 0"):
        chunk_spans(4, 0)


@pytest.mark.parametrize("bad", [0, -2])
def test_rollout_batch_below_one_is_one_clear_error(bad):
    with pytest.raises(ConfigError, match=f"algorithm.rollout_batch must be >= 1 or null .*got {bad}"):
        AlgorithmConfig(rollout_batch=bad)


def test_the_chunk_is_the_config_value_else_the_model_default():
    alg = types.SimpleNamespace(config=AlgorithmConfig(), model=models.get("sd3"))
    assert algorithms.Algorithm.rollout_chunk(alg) == 9  # Flow-GRPO's SD3 sample.train_batch_size
    alg.config = AlgorithmConfig(rollout_batch=5)
    assert algorithms.Algorithm.rollout_chunk(alg) == 5
    defaults = {name: models.get(name).default_rollout_batch for name in ("sd3", "wan", "flux", "qwen_image",
                                                                         "tiny", "toy2d")}
    assert defaults == {"sd3": 9, "wan": 8, "flux": 1, "qwen_image": 4, "tiny": None, "toy2d": None}


# ---- rows per call, counted on a tiny random diffusers SD3 pipeline ---------------------------------------------

@pytest.fixture(scope="module")
def sd3_model(tmp_path_factory):
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from flowzoo.benchmark.perf.pipeline import MAX_SEQ, RESOLUTION, build_tiny_sd3
    from flowzoo.models.sd3 import SD3Model

    directory = build_tiny_sd3(tmp_path_factory.mktemp("chunk_sd3"), tmp_path_factory.mktemp("chunk_tok"))
    return SD3Model(path=directory, resolution=RESOLUTION, max_sequence_length=MAX_SEQ, lora_rank=4, lora_alpha=8,
                    device="cpu")


class _Rows:
    """Rows of every transformer forward and every VAE decoder forward while installed."""

    def __init__(self, model):
        self.transformer: list[int] = []
        self.decoder: list[int] = []
        self.handles = [
            model.transformer.register_forward_hook(
                lambda module, args, kwargs, out: self.transformer.append(kwargs["hidden_states"].shape[0]),
                with_kwargs=True),
            model.pipe.vae.decoder.register_forward_hook(
                lambda module, args, out: self.decoder.append(args[0].shape[0])),
        ]

    def close(self):
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("name,rollout_batch,expected", [
    ("flow_grpo", None, 9),  # the SD3 adapter's default: Flow-GRPO's 9 samples per sampling call
    ("flow_grpo", 4, 4),
    ("dance_grpo", 5, 5),
])
def test_rollout_decode_and_reward_calls_hold_at_most_the_chunk(sd3_model, name, rollout_batch, expected):
    reward = Brightness()
    alg = algorithms.get(name)(sd3_model, reward, {"group_size": 10, "num_steps": 2, "rollout_batch": rollout_batch},
                               seed=0)
    assert alg.rollout_chunk() == expected
    prompts = ["a photo of a cat", "two red dogs"]  # 20 samples, more than a chunk
    rows = _Rows(sd3_model)
    try:
        traj = alg.collect(prompts, [{}, {}])
        rollout_calls = list(rows.transformer)
        alg.score(traj)
    finally:
        rows.close()
    batch = len(prompts) * 10
    chunks = -(-batch // expected)
    assert len(traj) == batch and traj.samples.shape[0] == batch and traj.rewards.shape == (batch,)
    # CFG 4.5: each call holds a chunk's [cond; uncond] pair, 2 x its samples
    assert max(rollout_calls) == 2 * expected and sum(rollout_calls) == 2 * batch * 2  # 2 steps, every row once
    assert len(rollout_calls) == 2 * chunks
    assert max(rows.decoder) <= expected and sum(rows.decoder) == batch and len(rows.decoder) == chunks
    assert max(reward.calls) <= expected and sum(reward.calls) == batch and len(reward.calls) == chunks


# ---- the paper recipes ------------------------------------------------------------------------------------------

def test_the_paper_sd3_ocr_flow_grpo_cell_rolls_out_far_below_its_share_of_the_batch(tmp_path):
    """At 8 processes paper-sd3-ocr's Flow-GRPO cell holds 144 samples per GPU (48 prompts x G 24 / 8), which one
    decode call does not fit on an 80 GB GPU (docs/perf.md); its rollout, decode and reward take 9 at a time."""
    from flowzoo.benchmark.run.suite import expand, load_suite
    from flowzoo.cells import base_task

    for split in ("train", "test"):
        (tmp_path / f"{split}.txt").write_text("a photo of a cat\n")
    configs = expand(load_suite("paper-sd3-ocr"), tmp_path / "runs", [f"prompts.train={tmp_path}",
                                                                      f"prompts.test={tmp_path}"])
    cell = next(c for c in configs if c.algorithm_name == "flow_grpo" and c.task == base_task(c.task))
    per_gpu = cell.train.prompts_per_step * cell.algorithm["group_size"] // 8
    assert per_gpu == 144
    params = {k: v for k, v in cell.algorithm.items() if k != "name"}
    assert "rollout_batch" not in params or params["rollout_batch"] is None  # the recipe leaves it to the model
    resolved = types.SimpleNamespace(config=algorithms.get("flow_grpo").typed_config(params),
                                     model=models.get(cell.model.name))
    chunk = algorithms.Algorithm.rollout_chunk(resolved)
    assert chunk == 9 and per_gpu // chunk == 16


def test_rollout_batch_is_no_part_of_a_runs_identity():
    """A run made before the key existed, or with another chunk, is the same run (its results differ by rounding)."""
    from flowzoo.benchmark.run.checkpoints import run_identity

    before = {"algorithm": {"name": "flow_grpo", "lr": 1e-3}, "train": {}}
    chunked = {"algorithm": {"name": "flow_grpo", "lr": 1e-3, "rollout_batch": 4}, "train": {}}
    unset = {"algorithm": {"name": "flow_grpo", "lr": 1e-3, "rollout_batch": None}, "train": {}}
    assert run_identity(before, set()) == run_identity(chunked, set()) == run_identity(unset, set())
    assert run_identity(before, set()) != run_identity({**chunked, "algorithm": {**chunked["algorithm"], "lr": 2e-3}},
                                                       set())
