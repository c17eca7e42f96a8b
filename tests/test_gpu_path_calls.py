"""The GPU path at the paper recipes: transformer calls and rows per call of one training iteration, per GPU, against
the loop structure of each algorithm's released trainer (issue: 28 calls per Flow-GRPO iteration where the release
makes 19).

The models are random transformers of the same classes at tiny sizes on the CPU, so an iteration at a paper suite's
real per-GPU batch (144 samples for paper-sd3-ocr's Flow-GRPO at 8 GPUs) costs seconds: the calls' structure does not
depend on the sizes, and ``cfg_batch: auto`` decides by the device, batching on a GPU at every size
(``test_auto_batches_the_cfg_pair_on_a_gpu_at_every_paper_size``) as it does here at the tiny size.

Released structures (per GPU and iteration):

* Flow-GRPO, SD3 (yifan123/flow_grpo scripts/train_sd3.py at ac4c86e; config/grpo.py at 31c71b9, e.g. lines 96-102:
  ``sample.train_batch_size`` 9, ``train.batch_size = sample.train_batch_size``): the rollout samples 9 at a time, one
  call of [uncond; cond] (18 rows) per step; the update takes the samples 9 at a time and, per trained timestep, one
  call of 18 rows with the unconditional half detached, plus with ``train.beta`` > 0 one reference call of 18 rows
  under ``disable_adapter``. OP-GRPO has no release and keeps Flow-GRPO's structure.
* DanceGRPO, FLUX (XueZeyue/DanceGRPO fastvideo/train_grpo_flux.py at 22b85ef, ``sample_reference_model``:
  ``batch_size = 1``; ``train_one_step``: one ``grpo_one_step`` per sample and trained timestep): T calls of 1 row per
  sample in the rollout, ``int((T - 1) * timestep_fraction)`` calls of 1 row per sample in the update, no CFG.
* MixGRPO, FLUX (Tencent-Hunyuan/MixGRPO fastvideo/train_grpo_flux.py at 10293dd, the same two functions): T calls of
  1 row per sample, and one call of 1 row per sample and window step.
"""

from __future__ import annotations

import math

import pytest

from flowzoo import algorithms
from flowzoo.benchmark.perf import gpu, gpu_large
from flowzoo.models.diffusers_common import cfg_split_pays

PROMPT = "a photo of a cat"


class Calls:
    """Rows of each transformer call, by phase (``rollout``: everything before the update; ``update``)."""

    def __init__(self, alg):
        self.phase = "rollout"
        self.rows = {"rollout": [], "update": []}
        transformer = alg.model.transformer
        self.handle = transformer.register_forward_pre_hook(self._hook, with_kwargs=True)
        update = alg.update

        def counted_update(*args, **kwargs):
            self.phase = "update"
            try:
                return update(*args, **kwargs)
            finally:
                self.phase = "rollout"

        alg.update = counted_update

    def _hook(self, module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        self.rows[self.phase].append(hidden.shape[0])

    def close(self):
        self.handle.remove()


def iteration(model, name: str, config: dict, prompts: int) -> dict[str, list[int]]:
    """The rows of every transformer call of the second training iteration (the first fills caches and, for
    OP-GRPO, its buffer) on ``prompts`` prompts."""
    alg = algorithms.get(name)(model, gpu_large.MeanBrightness(), config, seed=0)
    assert not model.split_cfg_pays()  # batched, as on a GPU
    batch = [f"{PROMPT} {i}" for i in range(prompts)]
    alg.step(batch)
    calls = Calls(alg)
    try:
        alg.step(batch)
    finally:
        calls.close()
    return calls.rows


def suite_cell(suite: str, name: str, tmp_path, **overrides) -> tuple[dict, int]:
    """(the algorithm config, prompts per GPU) of a paper suite's cell at its released GPU count, as ``bench``
    resolves it (recipe, suite defaults, per-algorithm batch), with ``overrides``."""
    from flowzoo.benchmark.run.suite import expand, load_suite
    from flowzoo.cells import base_task

    for split in ("train", "test"):
        (tmp_path / f"{split}.txt").write_text("a photo of a cat\n")
    loaded = load_suite(suite)
    configs = expand(loaded, tmp_path / "runs", [f"prompts.train={tmp_path}", f"prompts.test={tmp_path}"])
    cell = next(c for c in configs if c.algorithm_name == name and c.task == base_task(c.task))
    params = {k: v for k, v in cell.algorithm.items() if k != "name"}
    gpus = loaded.released_gpus
    assert cell.train.prompts_per_step % gpus == 0
    return {**params, **overrides}, cell.train.prompts_per_step // gpus


@pytest.fixture(scope="module")
def sd3():
    return gpu.RandomSD3(gpu.TINY, resolution=32, device="cpu", dtype="float32", lora_rank=4, text_tokens=6)


@pytest.fixture(scope="module")
def flux():
    return gpu_large.RandomFlux(gpu_large.TINY_FLUX, 32, "cpu", "float32", lora_rank=4, text_tokens=6)


def test_auto_batches_the_cfg_pair_on_a_gpu_at_every_paper_size():
    """``cfg_batch: auto`` never splits the CFG pair on an accelerator (the release's one batched call), whatever the
    size: SD3.5-Medium 2.5 B, Wan2.1 1.3 B / 14 B, FLUX.1-dev 11.9 B, Qwen-Image 20.4 B; on the CPU the measured
    rule still splits from 1 M parameters (the tiny tier)."""
    for params in (2_500_000_000, 1_300_000_000, 14_000_000_000, 11_900_000_000, 20_400_000_000):
        assert not cfg_split_pays("cuda", params)
        assert cfg_split_pays("cpu", params)
    assert not cfg_split_pays("cpu", 20_000)


def test_flow_grpo_sd3_makes_the_released_calls(sd3, tmp_path):
    """paper-sd3-ocr's Flow-GRPO cell at 8 GPUs: 6 prompts x G 24 = 144 samples per GPU, T 10, 9 trained steps, CFG
    4.5, KL 0.04, 2 optimizer steps, micro_batch 9. The release: 16 rollout batches x 10 steps = 160 calls of 18
    rows; 16 training batches x 9 steps x (policy + reference) = 288 calls of 18 rows. Ours makes the same."""
    config, prompts = suite_cell("paper-sd3-ocr", "flow_grpo", tmp_path)
    assert (prompts, config["group_size"], config["num_steps"], config["minibatches"]) == (6, 24, 10, 2)
    assert config["micro_batch"] == 9 and config["kl_beta"] > 0
    rows = iteration(sd3, "flow_grpo", config, prompts=prompts)
    samples, chunk = 144, 9
    released_rollout = math.ceil(samples / chunk) * 10
    released_update = math.ceil(samples / chunk) * 9 * 2
    assert len(rows["rollout"]) == released_rollout and set(rows["rollout"]) == {2 * chunk}
    assert len(rows["update"]) == released_update and set(rows["update"]) == {2 * chunk}


def test_the_split_cfg_pair_made_more_calls(sd3, tmp_path):
    """What the issue measured: with the CFG pair split (the former ``auto`` at SD3.5's size) the policy's call is
    two, so the update makes 3 calls per chunk and trained step instead of the release's 2."""
    config, prompts = suite_cell("paper-sd3-ocr", "flow_grpo", tmp_path, cfg_batch="split")
    rows = iteration(sd3, "flow_grpo", config, prompts=prompts)
    assert len(rows["update"]) == 16 * 9 * 3


def test_op_grpo_sd3_makes_no_more_calls_than_flow_grpos_release(sd3, tmp_path):
    """OP-GRPO (no release; Flow-GRPO's structure): with half the groups replaying 12 of their 24 samples, the
    replayed samples skip the steps before t_off in the rollout and train their kept steps like fresh ones."""
    config, prompts = suite_cell("paper-sd3-ocr", "op_grpo", tmp_path)
    rows = iteration(sd3, "op_grpo", config, prompts=prompts)
    assert len(rows["rollout"]) <= 16 * 10 and max(rows["rollout"]) <= 18
    assert len(rows["update"]) <= 16 * 9 * 2 and max(rows["update"]) <= 18


@pytest.mark.parametrize("name, prompts_per_gpu", [("dance_grpo", 2), ("mix_grpo", 4)])
def test_flux_recipes_make_fewer_calls_than_their_releases(flux, name, prompts_per_gpu, tmp_path):
    """paper-flux-hpsv2 at 8 GPUs: DanceGRPO 16 prompts (2 per GPU), MixGRPO 32 (4 per GPU), G 12, micro_batch 4.
    The releases call the transformer on one sample at a time, in the rollout (T per sample) and in the update (one
    per sample and trained step); ours rolls out ``rollout_batch`` samples per call (FLUX's default: 1, as
    released) and trains up to ``micro_batch`` samples per call, so it makes no more calls than the release."""
    config, prompts = suite_cell("paper-flux-hpsv2", name, tmp_path)
    assert prompts == prompts_per_gpu and config["micro_batch"] == 4
    samples, steps = prompts_per_gpu * config["group_size"], config["num_steps"]
    rows = iteration(flux, name, config, prompts=prompts_per_gpu)
    if name == "dance_grpo":
        trained = int((steps - 1) * config["timestep_fraction"])
    else:
        trained = config["window_size"]
    assert len(rows["rollout"]) <= samples * steps and max(rows["rollout"]) == 1
    assert len(rows["update"]) <= samples * trained and max(rows["update"]) <= 4
    assert sum(rows["update"]) == samples * trained  # every trained (sample, step) pair once
