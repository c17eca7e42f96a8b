"""The weight EMA (algorithm.ema): the released update at the value level, evaluation and export with the average,
a bit-identical resume, and the run identity.

Released Flow-GRPO (flow_grpo/ema.py:33-49, scripts/train_sd3.py:445 at ac4c86e), transcribed here by hand: after
optimizer step s (from 1), when (s + 1) % every == 0, ema += (1 - min((1 + s) / (10 + s), decay)) (theta - ema).
"""

from pathlib import Path

import pandas as pd
import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.engine.base import Algorithm
from flowzoo.algorithms.engine.ema import WeightEMA, load_average
from flowzoo.benchmark.run.checkpoints import run_identity
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.runner import TIMING_COLUMNS
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
ARGS = ["train.steps=8", "train.prompts_per_step=4", "train.eval_every=2", "train.eval_samples_per_prompt=4",
        "train.save_samples=false", "algorithm.group_size=4", "--quiet"]


def released_average(snapshots, decay, every, start):
    """The released EMA over the parameter values after each optimizer step (``snapshots[s - 1]`` after step s)."""
    average = start.clone()
    for s, theta in enumerate(snapshots, start=1):
        d = min((1 + s) / (10 + s), decay)
        if (s + 1) % every == 0:
            average = average + (1 - d) * (theta - average)
    return average


def test_update_is_the_released_formula():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    start = p.detach().clone()
    ema = WeightEMA([p], decay=0.9, every=3)
    snapshots = []
    for _ in range(20):
        with torch.no_grad():
            p.add_(torch.randn(5))
        snapshots.append(p.detach().clone())
        ema.update()
    assert ema.steps == 20
    torch.testing.assert_close(ema.shadow[0], released_average(snapshots, 0.9, 3, start), rtol=0, atol=1e-6)
    # the first move comes after step 2 (every 3: (2 + 1) % 3 == 0) with d = 3/12; before it the average is the start
    first = WeightEMA([torch.nn.Parameter(start.clone())], decay=0.9, every=3)
    first.update()
    torch.testing.assert_close(first.shadow[0], start)
    assert first.current_decay(2) == pytest.approx(3 / 12) and first.current_decay(1000) == 0.9


def build(model, **config):
    base = {"clip_range": 0.2, "lr": 1e-2, "kl_beta": 0.0, "group_size": 4}
    return algorithms.get("flow_grpo")(model, rewards.build("toy_mode"), {**base, **config}, seed=0)


def test_the_algorithm_averages_after_every_optimizer_step(toy_model, toy_prompts):
    alg = build(toy_model, ema=True, ema_decay=0.9, ema_every=2, minibatches=2)
    params = list(toy_model.trainable_parameters())
    start = [p.detach().clone() for p in params]
    snapshots = []
    step = alg.optimizer.step

    def recorded_step(*args, **kwargs):  # the parameters after each optimizer step, as the EMA sees them
        out = step(*args, **kwargs)
        snapshots.append([p.detach().clone() for p in params])
        return out

    alg.optimizer.step = recorded_step
    for _ in range(3):
        alg.step(*toy_prompts)
    assert alg.ema.steps == len(snapshots) == 6  # 2 minibatches x 3 iterations
    for i, p in enumerate(params):
        expected = released_average([snap[i] for snap in snapshots], 0.9, 2, start[i])
        torch.testing.assert_close(alg.ema.shadow[i], expected, rtol=0, atol=1e-6)
        assert not torch.equal(alg.ema.shadow[i], p)  # the average lags the trained weights


def test_evaluation_weights_swap_in_the_average_and_restore(toy_model, toy_prompts):
    alg = build(toy_model, ema=True, ema_every=1)
    alg.step(*toy_prompts)
    trained = [p.detach().clone() for p in toy_model.trainable_parameters()]
    with alg.evaluation_weights():
        for p, average in zip(toy_model.trainable_parameters(), alg.ema.shadow):
            assert torch.equal(p, average)
    for p, value in zip(toy_model.trainable_parameters(), trained):
        assert torch.equal(p, value)
    plain = build(toy_model)
    assert plain.ema is None and "ema" not in plain.state_dict()
    before = [p.detach().clone() for p in plain.model.trainable_parameters()]
    with plain.evaluation_weights():  # without an EMA, evaluation uses the trained weights themselves
        assert all(torch.equal(p, b) for p, b in zip(plain.model.trainable_parameters(), before))


def test_export_loads_the_average(toy_model, toy_prompts):
    alg = build(toy_model, ema=True, ema_every=1)
    alg.step(*toy_prompts)
    state = alg.state_dict()
    from flowzoo import models

    fresh = models.get("toy2d")()
    fresh.load_trainable_state_dict(state["model"])
    assert load_average(fresh, state)
    for p, average in zip(fresh.trainable_parameters(), alg.ema.shadow):
        assert torch.equal(p, average)
    assert not load_average(fresh, build(toy_model).state_dict())  # no average: the trained weights stay


def _metrics(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "metrics.csv")
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])


def test_a_run_evaluates_with_the_average(tmp_path, capsys):
    # an average that never moves (its first move would come after 999 optimizer steps, the run takes 8) would be the
    # initial model at every evaluation: refused at load (issue 44); one that first moves at step 7 is the initial
    # model at every evaluation before it, while the trained weights (the training reward) move
    assert main(["train", str(CONFIG), *ARGS, "algorithm.ema=true", "algorithm.ema_every=1000",
                 f"run_dir={tmp_path / 'never'}"]) == 2
    assert "ema_every 1000" in capsys.readouterr().err and not (tmp_path / "never").exists()
    frozen = tmp_path / "frozen"
    assert main(["train", str(CONFIG), *ARGS, "algorithm.ema=true", "algorithm.ema_every=8",
                 f"run_dir={frozen}"]) == 0
    rows = _metrics(frozen)
    evals = rows["eval_reward"].dropna()
    assert len(evals) == 5 and (evals.iloc[:4] == evals.iloc[0]).all() and evals.iloc[4] != evals.iloc[0]
    plain = tmp_path / "plain"
    assert main(["train", str(CONFIG), *ARGS, f"run_dir={plain}"]) == 0
    other = _metrics(plain)
    # the same training (the EMA never feeds back into it), another evaluation
    pd.testing.assert_series_equal(rows["reward_mean"], other["reward_mean"])
    assert other["eval_reward"].dropna().iloc[-1] != evals.iloc[-1]


def test_resume_with_the_average_matches_the_uninterrupted_run(tmp_path, monkeypatch):
    args = [*ARGS, "algorithm.ema=true", "algorithm.ema_every=2", "train.checkpoint_every=3"]
    real_step = Algorithm.step

    def fail_at_five(self, *a, **k):
        if self.iteration == 4:  # the 5th iteration: after the checkpoint at step 3
            raise MemoryError()
        return real_step(self, *a, **k)

    monkeypatch.setattr(Algorithm, "step", fail_at_five)
    resumed = tmp_path / "resumed"
    assert main(["train", str(CONFIG), *args, f"run_dir={resumed}"]) == 2
    monkeypatch.undo()
    assert main(["train", str(CONFIG), *args, f"run_dir={resumed}"]) == 0
    reference = tmp_path / "reference"
    assert main(["train", str(CONFIG), *args, f"run_dir={reference}"]) == 0
    pd.testing.assert_frame_equal(_metrics(resumed), _metrics(reference))
    state_a = torch.load(resumed / "checkpoint.pt", weights_only=False)["algorithm"]["ema"]
    state_b = torch.load(reference / "checkpoint.pt", weights_only=False)["algorithm"]["ema"]
    assert state_a["steps"] == state_b["steps"] == 8
    for a, b in zip(state_a["shadow"], state_b["shadow"]):
        assert torch.equal(a, b)


def test_identity_holds_the_ema_keys_only_when_it_is_on():
    before = {"task": "t", "algorithm": {"name": "flow_grpo", "lr": 1e-3}}  # a config.yaml from before the knob
    off = {"task": "t", "algorithm": {"name": "flow_grpo", "lr": 1e-3, "ema": False, "ema_decay": 0.9,
                                      "ema_every": 8}}
    on = {"task": "t", "algorithm": {**off["algorithm"], "ema": True}}
    other_decay = {"task": "t", "algorithm": {**on["algorithm"], "ema_decay": 0.5}}
    assert run_identity(before, set()) == run_identity(off, set())
    assert run_identity(on, set()) != run_identity(off, set())
    assert run_identity(on, set()) != run_identity(other_decay, set())


@pytest.mark.parametrize("key, value, message", [
    ("ema_decay", 1.0, "ema_decay must be in"), ("ema_decay", -0.1, "ema_decay must be in"),
    ("ema_every", 0, "ema_every must be a positive integer"),
])
def test_bad_ema_settings_are_refused(toy_model, key, value, message):
    with pytest.raises(ConfigError, match=message):
        build(toy_model, ema=True, **{key: value})


def test_export_writes_the_average_of_a_tiny_run(tmp_path):
    """``flowzoo export`` of a run with the EMA on writes the average, the weights its evaluations used."""
    pytest.importorskip("peft")
    from flowzoo.benchmark.run.export_lora import WEIGHTS_NAME
    from flowzoo.models.tiny import TinyModel, build_networks, load_networks, read_weights, transformer_velocity

    run, out = tmp_path / "run", tmp_path / "lora"
    config = ROOT / "benchmark" / "configs" / "tiny_flow_grpo.yaml"
    # every = 1: the average moves after each of the 2 optimizer steps by 1 - d (d = 2/11, then 3/12), so it is
    # neither the trained weights nor the base
    assert main(["train", str(config), "train.steps=2", "train.prompts_per_step=2", "algorithm.group_size=2",
                 "algorithm.lr=0.05", "algorithm.ema=true", "algorithm.ema_every=1", "train.eval_prompts=2",
                 "train.eval_every=1", f"run_dir={run}", "--quiet"]) == 0
    assert main(["export", str(run), "--out", str(out)]) == 0
    state = torch.load(run / "checkpoint.pt", weights_only=False)["algorithm"]
    averaged, trained = TinyModel(data="shapes"), TinyModel(data="shapes")
    trained.load_trainable_state_dict(state["model"])
    averaged.load_trainable_state_dict(state["model"])
    assert load_average(averaged, state)
    arch, tensors, _ = read_weights(averaged.path)
    _, text_encoder, transformer = build_networks(arch)
    load_networks(transformer, text_encoder, tensors)
    transformer.load_lora_adapter(out, weight_name=WEIGHTS_NAME, prefix="transformer")

    torch.manual_seed(2)
    x = torch.randn(2, *averaged.latent_shape)
    sigma = torch.tensor([0.8, 0.3])
    cond = averaged.encode(["a red circle", "two blue squares"])
    with torch.no_grad():
        expected = averaged.predict(x, sigma, cond)
        other = trained.predict(x, sigma, cond)
        got = transformer_velocity(transformer.eval(), x, sigma * 1000, cond.tensors)
    assert (got - expected).abs().max() < 1e-5
    assert (got - other).abs().max() > 1e-5
