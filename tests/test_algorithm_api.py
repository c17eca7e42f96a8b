"""The algorithm API a newcomer follows (docs/adding-an-algorithm.md): the name stated once, ``self.log``, the
declarations the report reads (``family``, ``ablation_of``, ``diagnostics``), and the doc's example end to end."""

import importlib.util
import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import Algorithm, StepStats
from flowzoo.algorithms.methods.op_grpo import OPGRPO
from flowzoo.benchmark.config import recipes
from flowzoo.benchmark.render import report
from flowzoo.benchmark.cli import main
from flowzoo.errors import ConfigError
from tests.test_report import baseline_curve, fast_curve, section, write_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "noise_decay_grpo.py"
DOC = ROOT / "docs" / "adding-an-algorithm.md"
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
FAST = ["train.steps=4", "train.prompts_per_step=4", "train.eval_every=2", "train.eval_samples_per_prompt=8",
        "train.save_samples=false", "algorithm.group_size=4"]


@pytest.fixture
def registered():
    """Register classes for one test; unregister them after it."""
    names = []

    def add(name, cls):
        out = register(name)(cls)
        names.append(name)
        return out

    yield add
    for name in names:
        algorithms.REGISTRY._entries.pop(name, None)


@pytest.fixture(scope="module")
def example():
    """docs/examples/noise_decay_grpo.py imported as it is (it registers itself), unregistered afterwards."""
    spec = importlib.util.spec_from_file_location("noise_decay_grpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    algorithms.REGISTRY._entries.pop("noise_decay_grpo", None)
    sys.modules.pop(spec.name, None)


# ------------------------------------------------------------------------------------------------------ the name


def test_every_registered_class_carries_its_registry_name():
    for name in algorithms.names():
        assert algorithms.get(name).name == name
    assert Algorithm.name is None  # the base class is not an algorithm


def test_register_sets_the_name_and_refuses_a_different_one(registered):
    class Plain(Algorithm):
        pass

    assert registered("test_api_plain", Plain).name == "test_api_plain"
    assert Plain.family == "test_api_plain" and Plain.ablation_of is None  # a method of its own family

    class Misnamed(Algorithm):
        name = "test_api_other"

    with pytest.raises(ValueError, match="registered as 'test_api_misnamed' but declares name 'test_api_other'"):
        register("test_api_misnamed")(Misnamed)
    assert "test_api_misnamed" not in algorithms.names() and "test_api_other" not in algorithms.names()


def test_recipes_are_looked_up_by_the_registered_name(registered):
    """A subclass registered without a name of its own reads its base's recipe file and then its own name's."""

    class FastChild(algorithms.get("flow_grpo_fast")):
        pass

    registered("test_api_fast_child", FastChild)
    assert FastChild.family == "flow_grpo"  # inherited from the registered base
    assert recipes.recipe_paths("test_api_fast_child") == recipes.recipe_paths("flow_grpo_fast")
    assert recipes.recipe("test_api_fast_child", "sd3_pickscore", "sd3") == recipes.recipe(
        "flow_grpo_fast", "sd3_pickscore", "sd3")
    assert recipes.recipe("flow_grpo_fast", "sd3_pickscore", "sd3")["sde_window_size"] == 3


# ------------------------------------------------------------------------------------------------------ self.log


def test_log_refuses_the_template_columns(toy_model):
    alg = algorithms.get("flow_grpo")(toy_model, rewards.build("toy_mode"), {"group_size": 4}, seed=0)
    for key in ("loss", "clip_frac", "step", "eval_reward", "nfe_step", ""):
        with pytest.raises(ValueError, match="must be a non-empty string other than the columns"):
            alg.log(key, 1.0)


def test_on_policy_rows_keep_their_columns(toy_model, toy_prompts):
    """flow_grpo's metrics row: StepStats' fields, nfe_step and what the template logs, with where its clip binds by
    advantage sign (``logs_clip_sides``); nothing off-policy."""
    prompts, meta = toy_prompts
    alg = algorithms.get("flow_grpo")(toy_model, rewards.build("toy_mode"), {"group_size": 4}, seed=0)
    row = alg.step(prompts, meta).row()
    fields = {f for f in StepStats.__dataclass_fields__ if f != "extra"}
    assert set(row) == fields | {"nfe_step", "zero_std_frac", "onpolicy_max_abs_log_ratio", "clip_frac_pos_adv",
                                 "clip_frac_neg_adv"}


def test_off_policy_frac_is_the_realised_share_every_iteration(toy_model, toy_prompts):
    """OP-GRPO logs off_policy_frac from the gathered batch: 0 before the buffer fills, k/G of the replayed groups
    after."""
    prompts, meta = toy_prompts
    config = {"group_size": 4, "num_steps": 6, "t_off": 2, "kl_beta": 0.0, "buffer_admission": "any"}
    alg = algorithms.get("op_grpo")(toy_model, rewards.build("toy_mode"), config, seed=0)
    first, second = alg.step(prompts, meta), alg.step(prompts, meta)
    assert first.extra["off_policy_frac"] == 0.0 and "clip_frac_off" not in first.extra
    replayed = second.extra["replay_groups"]
    assert replayed > 0 and second.extra["off_policy_frac"] == pytest.approx(replayed / len(prompts) / 4)
    assert {"clip_frac_off", "clip_frac_on", "abs_log_ratio_t0", "abs_log_ratio_t1"} <= set(second.extra)


# -------------------------------------------------------------------------------------------------- declarations


def test_presets_are_ablations_unless_told_otherwise():
    assert algorithms.ablations() == {
        "op_grpo": ["op_grpo_naive_is", "op_grpo_no_correction", "op_grpo_no_decay", "op_grpo_no_truncation"]}
    star = algorithms.get("mix_grpo_flash_star")
    assert star.ablation_of is None and star.family == "mix_grpo"
    assert algorithms.get("flow_grpo_fast").family == "flow_grpo" and algorithms.get("op_grpo").ablation_of is None
    assert "abs_log_ratio_t{k}" in algorithms.get("op_grpo_naive_is").diagnostics


def test_report_reads_declarations_not_names(registered, tmp_path):
    """An ``op_grpo_*`` name that is no ablation stays out of the ablation table; a new algorithm's declared
    diagnostic column is in the report with its description."""

    class Lookalike(OPGRPO):  # OP-GRPO's family and diagnostics, but a method of its own rather than an ablation
        pass

    class Fresh(Algorithm):
        diagnostics = {"my_metric": "what my_metric measures"}

    registered("op_grpo_lookalike", Lookalike)
    registered("test_api_fresh", Fresh)
    runs = tmp_path / "runs"
    for seed in range(2):
        for algorithm in ("flow_grpo", "op_grpo", "op_grpo_no_decay", "op_grpo_lookalike", "test_api_fresh"):
            curve = baseline_curve if algorithm == "flow_grpo" else fast_curve
            write_run(runs / f"{algorithm}_s{seed}", task="toy_a", algorithm=algorithm, seed=seed, curve=curve,
                      nfe_per_step=100, wall_per_step=1.0)
        metrics = pd.read_csv(runs / f"test_api_fresh_s{seed}" / "metrics.csv")
        metrics["my_metric"] = 0.5 + 0.1 * seed
        metrics["undeclared_metric"] = 1.0
        metrics.to_csv(runs / f"test_api_fresh_s{seed}" / "metrics.csv", index=False)
    markdown = report.write_report(runs, tmp_path / "out", baseline="flow_grpo").read_text()
    ablations = section(markdown, "OP-GRPO ablations")
    assert "`op_grpo`" in ablations and "`op_grpo_no_decay`" in ablations
    assert "op_grpo_lookalike" not in ablations and "test_api_fresh" not in ablations
    diagnostics = section(markdown, "Diagnostics")
    assert "| `my_metric` | `test_api_fresh` | what my_metric measures |" in diagnostics
    assert "| `clip_frac_off` | `op_grpo`, `op_grpo_lookalike`, `op_grpo_no_decay` |" in diagnostics
    assert "undeclared_metric" not in markdown
    assert (tmp_path / "out" / "figures" / "toy_a_diagnostics.png").is_file()


# ---------------------------------------------------------------------------------------------- the doc's example


def test_the_doc_shows_the_example_file_whole():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 2 and blocks[0] == EXAMPLE.read_text()  # the second: the prompt-sampler example


def test_the_doc_s_prompt_sampler_example_registers_draws_and_resumes():
    from flowzoo.algorithms import prompt_samplers
    from tests.value_helpers import build

    block = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)[1]
    namespace = {"__name__": "rested_example"}
    try:
        exec(compile(block, "docs/adding-an-algorithm.md", "exec"), namespace)
        assert "rested" in prompt_samplers.names()
        pool = [(f"class {i % 4}", {}) for i in range(6)]
        alg = build()
        alg.use_prompts(pool, 2, {"name": "rested", "window": 2})
        first, second = (alg.train_step(step).nfe_sampling for step in (1, 2))
        assert first == second > 0
        drawn = alg.prompt_sampler.draw(3, 2, alg).indices
        assert drawn == [4, 5]  # prompts 0-3 were drawn at steps 1-2, inside the window
        assert alg.state_dict()["prompt_sampler"] == {"last": [1, 1, 2, 2, 3, 3]}
    finally:
        prompt_samplers.REGISTRY._entries.pop("rested", None)


def test_the_example_checks_its_keys(example):
    with pytest.raises(ConfigError, match="algorithm.noise_decay must be in"):
        example.NoiseDecayConfig(noise_decay=0.0)
    with pytest.raises(ConfigError, match=r"algorithm.noise_floor must be in \[1e-6, noise_level\]"):
        example.NoiseDecayConfig(noise_floor=0.9)


def test_the_example_trains_with_the_runner_and_appears_in_the_report(example, tmp_path):
    """The doc's file, imported as it is, trains a few steps on the toy tier through `flowzoo train`; the report of
    its run next to a flow_grpo run shows its declared diagnostic, and its logged values follow the schedule."""
    runs = tmp_path / "runs"
    decay, floor = 0.5, 0.2
    assert main(["train", str(CONFIG), *FAST, "algorithm.name=noise_decay_grpo", f"algorithm.noise_decay={decay}",
                 f"algorithm.noise_floor={floor}", f"run_dir={runs / 'noise'}", "--quiet"]) == 0
    assert main(["train", str(CONFIG), *FAST, f"run_dir={runs / 'flow_grpo'}", "--quiet"]) == 0
    metrics = pd.read_csv(runs / "noise" / "metrics.csv")
    trained = metrics[metrics["step"] > 0]
    a = 0.7  # AlgorithmConfig.noise_level, which the toy config leaves alone
    expected = [max(floor, a * decay ** (step - 1)) for step in trained["step"]]
    assert trained["sde_noise_level"].tolist() == pytest.approx(expected)  # 0.7, 0.35, 0.2, 0.2
    assert all(math.isfinite(v) for v in trained["loss"])

    markdown = report.write_report(runs, tmp_path / "out", baseline="flow_grpo").read_text()
    diagnostics = section(markdown, "Diagnostics")
    assert "| `sde_noise_level` | `noise_decay_grpo` | noise level a of this iteration's SDE steps |" in diagnostics
    assert (tmp_path / "out" / "figures" / "toy2d_mode_diagnostics.png").is_file()
    assert "noise_decay_grpo" not in section(markdown, "Ablations")


# ------------------------------------------------------------------------------------ one file is the whole change


def test_the_example_is_one_file_in_a_copy_of_the_zoo(tmp_path):
    """docs/examples/noise_decay_grpo.py dropped into ``algorithms/`` of a copy of the project, and nothing else
    changed: it is listed, inherits Flow-GRPO's recipe on the SD3 tasks, trains on the toy tier through the CLI, and
    docs/recipes.md stays current (so no other file has to change)."""
    import shutil
    import subprocess

    copy = tmp_path / "zoo"
    for part in ("algorithms", "rewards", "benchmark", "flowzoo", "docs"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "models").mkdir()
    for path in (ROOT / "models").iterdir():  # the shipped weights are linked, not copied
        if path.name != "__pycache__":
            (copy / "models" / path.name).symlink_to(path)
    shutil.copy(EXAMPLE, copy / "algorithms" / "methods" / EXAMPLE.name)
    script = """
from flowzoo import algorithms
from flowzoo.benchmark.config import recipes
from flowzoo.benchmark.cli import main
cls = algorithms.get("noise_decay_grpo")
assert cls.family == "flow_grpo", cls.family
for task in ("sd3_geneval", "sd3_pickscore"):
    assert recipes.recipe("noise_decay_grpo", task, "sd3") == recipes.recipe("flow_grpo", task, "sd3"), task
assert recipes.recipe("noise_decay_grpo", "sd3_ocr", "sd3")["group_size"] == 24
assert open("docs/recipes.md").read() == recipes.recipe_table(), "docs/recipes.md would need regenerating"
code = main(["train", "benchmark/configs/toy_flow_grpo.yaml", "algorithm.name=noise_decay_grpo",
             "train.steps=2", "train.eval_every=2", "train.eval_samples_per_prompt=4",
             "train.save_samples=false", "model.args.pretrain_steps=50", "run_dir=run", "--quiet"])
if code == 0:  # then `flowzoo list` of the copy, in the same interpreter (one start-up instead of two)
    print(LISTED, flush=True)
    code = main(["list"])
raise SystemExit(code)
"""
    env = {"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    marker = "--- flowzoo list ---"
    proc = subprocess.run([sys.executable, "-c", f"LISTED = {marker!r}\n{script}"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (copy / "run" / "done.json").is_file()
    assert proc.stdout.count(marker) == 1
    listed = proc.stdout.split(marker, 1)[1]
    assert "noise_decay_grpo" in listed
