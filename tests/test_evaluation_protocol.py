"""One evaluation sampler for every cell (``train.eval_sampler``, benchmark/measures/evaluation.py): cells that
train with different shifts or CFG scales are scored by the same sampler, unless a config asks for each algorithm's
own; the algorithm's own evaluation is an extra column when asked for; the protocol is part of a run's identity only
where it changes the samples; each paper suite states one protocol for all its cells; reports name it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowzoo.algorithms.engine.sde import sigma_schedule
from flowzoo.benchmark.analysis.runs import evaluation_protocol, protocol_line
from flowzoo.benchmark.run.checkpoints import config_digest
from flowzoo.benchmark.run.loading import load_config
from flowzoo.benchmark.run.runner import Runner
from flowzoo.benchmark.run.suite import expand, load_suite
from flowzoo.errors import ConfigError
from tests.test_recipes import PAPER_SUITES, prompt_dir  # noqa: F401 (prompt_dir: the paper suites' prompt files)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
SMALL = ["model.args.hidden=32", "model.args.pretrain_steps=50", "train.eval_samples_per_prompt=40",
         "train.save_samples=false"]


def _evaluate(tmp_path, name, overrides):
    runner = Runner(load_config(CONFIG, SMALL + [f"run_dir={tmp_path / name}", *overrides]), progress=False)
    runner.build()
    return runner, runner.evaluate(0)


def test_cells_with_other_training_shifts_are_scored_by_one_sampler(tmp_path):
    plain, at_one = _evaluate(tmp_path, "a", [])
    shifted, at_three = _evaluate(tmp_path, "b", ["algorithm.shift=3.0"])
    assert shifted.algorithm.shift == 3.0 and plain.algorithm.shift == 1.0  # they train on other grids
    assert torch.equal(shifted.eval_sampler.sigmas, plain.eval_sampler.sigmas)  # the model's own, shift 1
    assert torch.equal(shifted.eval_sampler.sigmas, sigma_schedule(20, 1.0, grid=shifted.model.default_sigma_grid,
                                                                   terminal=shifted.model.shift_terminal))
    assert at_three["eval_reward"] == at_one["eval_reward"]  # same weights, same sampler, same samples
    own, at_own = _evaluate(tmp_path, "c", ["algorithm.shift=3.0", "train.eval_sampler=algorithm"])
    assert own.eval_sampler.shift == 3.0 and at_own["eval_reward"] != at_one["eval_reward"]
    chosen, _ = _evaluate(tmp_path, "d", ["train.eval_shift=2.0", "train.eval_guidance=1.5"])
    assert chosen.eval_sampler.shift == 2.0 and chosen.eval_sampler.effective_guidance(chosen.model) == 1.5


def test_the_algorithms_own_evaluation_is_an_extra_column(tmp_path):
    _, own = _evaluate(tmp_path, "own", ["algorithm.shift=3.0", "train.eval_sampler=algorithm"])
    runner, both = _evaluate(tmp_path, "both", ["algorithm.shift=3.0", "train.eval_own=true"])
    assert both["eval_own_reward"] == pytest.approx(own["eval_reward"], abs=1e-7)
    assert both["eval_own_reward"] != both["eval_reward"]
    _, same = _evaluate(tmp_path, "same", ["train.eval_own=true"])  # the algorithm keeps the model's sampler
    assert "eval_own_reward" not in same


def test_the_protocol_is_part_of_a_runs_identity_only_where_it_changes_the_samples(tmp_path):
    run = [f"run_dir={tmp_path / 'r'}"]
    default = config_digest(load_config(CONFIG, run))
    assert config_digest(load_config(CONFIG, run + ["train.eval_sampler=algorithm"])) == default
    shifted = config_digest(load_config(CONFIG, run + ["algorithm.shift=3.0"]))
    shifted_own = config_digest(load_config(CONFIG, run + ["algorithm.shift=3.0", "train.eval_sampler=algorithm"]))
    assert shifted != shifted_own
    assert config_digest(load_config(CONFIG, run + ["train.eval_guidance=2.0"])) != default


@pytest.mark.parametrize("override, message", [
    ("train.eval_sampler=mine", "train.eval_sampler must be one of pipeline, algorithm, got 'mine'"),
    ("train.eval_guidance=-1", "train.eval_guidance must be a finite number >= 0"),
    ("train.eval_shift=0", "train.eval_shift must be a finite number > 0"),
])
def test_a_bad_protocol_is_one_clear_error(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG, [override])
    with pytest.raises(ConfigError, match="belong to eval_sampler: pipeline"):
        load_config(CONFIG, ["train.eval_sampler=algorithm", "train.eval_shift=2.0"])


@pytest.mark.parametrize("name", PAPER_SUITES)
def test_every_cell_of_a_paper_suite_is_scored_by_the_pipelines_sampler(name, prompt_dir, tmp_path):
    suite = load_suite(name)
    by_task: dict[str, set] = {}
    for config in expand(suite, tmp_path, prompt_dir):
        train = config.train
        assert train.eval_sampler == "pipeline" and train.eval_shift is None and train.eval_guidance is None
        protocol = (train.eval_num_steps, train.eval_samples_per_prompt, train.eval_seed, repr(config.model))
        by_task.setdefault(config.task.split("@")[0], set()).add(protocol)
    assert by_task and all(len(protocols) == 1 for protocols in by_task.values()), by_task


def test_reports_name_the_protocol():
    old = {"train": {}, "algorithm": {"name": "dance_grpo", "shift": 3.0}}  # a run made before the protocol
    assert evaluation_protocol(old) == "algorithm (the model's steps)"
    assert evaluation_protocol({"train": {}, "algorithm": {"name": "flow_grpo"}}) == "pipeline (the model's steps)"
    assert evaluation_protocol({"train": {"eval_sampler": "pipeline", "eval_shift": 2.2, "eval_num_steps": 28},
                                "algorithm": {"shift": 3.0}}) == "pipeline (shift 2.2, 28 steps)"
    one = protocol_line({"a": "pipeline (28 steps)", "b": "pipeline (28 steps)"})
    assert one.startswith("Evaluation protocol: `pipeline (28 steps)` for every run")
    mixed = protocol_line({"a": "pipeline (28 steps)", "b": "algorithm (28 steps)"})
    assert "`algorithm (28 steps)` (1 runs)" in mixed and "not comparable" in mixed
    # protocols that differ only between tasks are listed per task; a task of two protocols still warns
    tasks = {"a": "toy", "b": "edit", "c": "toy"}
    per_task = protocol_line({"a": "pipeline (the model's steps)", "b": "pipeline (6 steps)",
                              "c": "pipeline (the model's steps)"}, tasks)
    assert per_task == ("Evaluation protocol, one per task: `edit`: `pipeline (6 steps)`; `toy`: `pipeline (the "
                        "model's steps)` (every run of a task under the same sampler; docs/harness.md).")
    within = protocol_line({"a": "pipeline (28 steps)", "b": "pipeline (6 steps)", "c": "algorithm (28 steps)"}, tasks)
    assert "not comparable" in within


@pytest.mark.parametrize("name", PAPER_SUITES)
def test_each_suite_names_the_protocol_for_what_it_is(name):
    """``pipeline`` is each model's reference evaluation sampler with its source (evaluation.py, docs/harness.md),
    not a diffusers pipeline's defaults: SD3.5 evaluates at Flow-GRPO's CFG 4.5 and 40 steps (the pipeline's are 7.0
    and 28), FLUX with truncated timesteps, Wan on its UniPC sigmas."""
    text = (ROOT / "benchmark" / "suites" / f"{name}.yaml").read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("eval_sampler:"))
    assert "eval_sampler: pipeline" in line and "reference evaluation sampler" in line
    assert "Pipeline's own" not in line and "'s own," not in line
    expected = {"sd3": ("CFG 4.5, 40 steps", "config/base.py:43,45 at 27b6ef8"), "wan": ("UniPC",), "flux": ("truncated",),
                "qwen_image": ("config/grpo.py:527-528",), "qwen_image_edit": ("true CFG 4, 50 steps",),
                "flux_kontext": ("distilled guidance 2.5, 28 steps",)}
    family = next(m for m in expected if f"name: {m}\n" in text)
    assert all(phrase in line for phrase in expected[family]), (family, line)
