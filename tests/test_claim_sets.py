"""Claim sets as registered data: docs/adding-a-study.md's example file registers itself and is judged by the study
on synthetic runs (verdicts that follow its rules), every registered set is listed by `flowzoo list` and `flowzoo
study --help`, every suite's `claims:` key names one, and an unknown name is one error naming the valid ones."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flowzoo.benchmark.study import claims as study_claims
from flowzoo.benchmark.study.verdicts import analyze_study
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.suite import expand, load_suite, suite_names
from flowzoo.errors import ConfigError
from tests.synthetic_runs import write_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "example_claim_set.py"
SUITE = ROOT / "docs" / "examples" / "mix-grpo-flash-study.yaml"
DOC = ROOT / "docs" / "adding-a-study.md"
NAME = "example-mix-grpo-flash"
STEPS = [0, 10, 20, 30, 40, 50]
FAST = ["--smooth", "1", "--resamples", "300"]


@pytest.fixture(scope="module")
def example():
    """docs/examples/example_claim_set.py imported as it is (it registers itself), unregistered afterwards."""
    spec = importlib.util.spec_from_file_location("example_claim_set", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        study_claims.REGISTRY._entries.pop(NAME, None)
        sys.modules.pop(spec.name, None)


def _write(root, task, algorithm, seed, rewards):
    write_run(root, task, algorithm, seed, STEPS, rewards)


def _runs(root):
    """Sparse task: MixGRPO-Flash reaches 80% of Flow-GRPO's gain at step 20 vs 50 and ends 0.04 higher. Dense task:
    Flow-GRPO reaches it at step 20, MixGRPO-Flash at 40, ending 0.09 lower. Six seeds with a small wobble."""
    for seed in range(6):
        w = 0.001 * seed
        _write(root, "toy2d_target", "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + w])
        _write(root, "toy2d_target", "mix_grpo_flash", seed, [0.0, 0.3, 0.51, 0.52, 0.53, 0.54 + w])
        _write(root, "toy2d_mode", "flow_grpo", seed, [0.0, 0.3, 0.51, 0.52, 0.53, 0.54 + w])
        _write(root, "toy2d_mode", "mix_grpo_flash", seed, [0.0, 0.1, 0.2, 0.3, 0.45, 0.45 + w])
    return root


def _verdicts(claims: pd.DataFrame, column: str) -> dict[str, str]:
    return dict(zip(claims["claim"], claims[column]))


# ------------------------------------------------------------------------------------------ the doc's example


def test_the_doc_shows_the_example_files_whole():
    text = DOC.read_text()
    assert re.findall(r"```python\n(.*?)```", text, flags=re.S) == [EXAMPLE.read_text()]
    assert re.findall(r"```yaml\n(.*?)```", text, flags=re.S) == [SUITE.read_text()]


def test_the_example_suite_names_the_example_claim_set_and_expands(example, tmp_path):
    suite = load_suite(str(SUITE))
    assert suite.claims == NAME and study_claims.claim_set(suite.claims).tasks == ("toy2d_target", "toy2d_mode")
    assert set(suite.seed_sets) == {"exploration", "replication"}
    configs = expand(suite, tmp_path / "runs")
    assert len(configs) == 2 * 2 * 10  # tasks x cells x seeds, every config valid


def test_the_example_is_judged_by_its_rules(example, tmp_path):
    assert NAME in study_claims.names()
    assert study_claims.claim_set(NAME).source == "docs/examples/example_claim_set.py"
    table, effects, seed_sets, _ = analyze_study(_runs(tmp_path), smooth=1, resamples=500)
    claims, figures = study_claims.judge(table, effects, seed_sets, NAME)
    verdicts = _verdicts(claims, "verdict all")
    assert list(verdicts.values()) == [
        "reproduced", "reproduced", "reproduced",  # sparse: ratio 0.4 on steps and NFE, +0.04 final reward
        "contradicted (needs more steps)", "contradicted (costs more)", "contradicted",  # dense: ratio 2, -0.09
    ]
    assert "MixGRPO-Flash loses no final reward against Flow-GRPO (dense mode reward)" in verdicts
    # the figures carry the rules' zones: the steps claim drawn against its 1.10 margin, the reward claim at -0.05
    steps = figures[figures["label"] == "mix_grpo_flash / flow_grpo: steps (target)"].iloc[0]
    assert steps["estimate"] == pytest.approx(0.4) and steps["reproduced_high"] == pytest.approx(1.1)
    reward = figures[figures["label"] == "mix_grpo_flash - flow_grpo: final reward (mode)"].iloc[0]
    assert reward["estimate"] == pytest.approx(-0.09) and reward["contradicted_high"] == pytest.approx(-0.05)
    # runs without the cell: every claim not tested, none crashes
    bare = table[table["algorithm"] != "mix_grpo_flash"]
    empty = study_claims.claims_table(bare, effects[effects["algorithm"] != "mix_grpo_flash"], None, NAME)
    assert set(empty["verdict"]) == {"not tested"}


def test_a_suite_naming_the_example_gets_its_verdicts_from_flowzoo_study(example, tmp_path):
    suite = tmp_path / "my-study.yaml"
    suite.write_text(yaml.safe_dump({"name": "my-study", "tasks": {"toy2d_target": {}, "toy2d_mode": {}},
                                     "algorithms": ["flow_grpo", "mix_grpo_flash"], "claims": NAME,
                                     "seed_sets": {"exploration": [0, 1, 2], "replication": [3, 4, 5]}}))
    out = tmp_path / "page"
    assert main(["study", str(_runs(tmp_path / "runs")), "--suite", str(suite), "--out", str(out), *FAST]) == 0
    claims = pd.read_csv(out / "claims.csv")
    assert list(claims["replication"]) == ["replicated: reproduced"] * 3 + ["replicated: contradicted"] * 3
    text = (out / "README.md").read_text()
    assert "applied mechanically by `docs/examples/example_claim_set.py`" in text
    assert "Each claim names its task." in text
    assert set(pd.read_csv(out / "claim_estimates.csv")["seed_set"]) == {"exploration", "replication", "all"}


# ------------------------------------------------------------------------------------------------- the registry


def test_every_registered_claim_set_is_listed_by_the_cli(example, capsys):
    names = study_claims.names()
    assert {"op-grpo-toy", "op-grpo-tiny-counting", "op-grpo-tiny-rare-counting", NAME} <= set(names)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("\nclaim sets:\n"):]
    listed = {line.split()[0] for line in section.splitlines()[2:] if line.startswith("  ")}
    assert listed == set(names)
    for name in names:
        assert main(["list", name]) == 0
        shown = capsys.readouterr().out
        assert shown.startswith(f"claim set {name}: {study_claims.claim_set(name).description}")
        assert f"rules: {study_claims.claim_set(name).source}" in shown
    with pytest.raises(SystemExit):
        main(["study", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"claim set to judge: {', '.join(names)}, or none" in help_text.replace("- ", "-")


def test_an_unknown_claim_set_is_one_error_naming_every_valid_one(example, tmp_path, capsys):
    message = f"no such claim set; claim sets: {', '.join(study_claims.names())} (or none)"
    with pytest.raises(ConfigError, match=re.escape(f"--claims 'nope': {message}")):
        study_claims.claim_set("nope")
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "tasks": {"toy2d_target": {}}, "claims": "nope"}))
    out = tmp_path / "page"
    assert main(["study", str(_runs(tmp_path / "runs")), "--suite", str(suite), "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"flowzoo: error: suite s: claims: 'nope': {message}" and not out.exists()


def test_the_example_is_one_file_in_a_copy_of_the_zoo(tmp_path):
    """docs/examples/example_claim_set.py dropped into ``benchmark/study/claim_sets/`` of a copy of the analysis
    code, nothing else changed: it is registered, found by name and matched by its first task."""
    import shutil
    import subprocess

    copy = tmp_path / "zoo"
    for part in ("benchmark", "flowzoo"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "suites", "perf"))
    shutil.copy(EXAMPLE, copy / "benchmark" / "study" / "claim_sets" / EXAMPLE.name)
    script = ("from flowzoo.benchmark.study import claims as s\n"
              "print(s.names()); print(s.claim_set('example-mix-grpo-flash').source)\n"
              "print(s.match_claim_set(['toy2d_target', 'toy2d_mode']).name)")
    env = {"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names, source, matched = proc.stdout.splitlines()
    assert NAME in names and "op-grpo-toy" in names
    assert source == "benchmark/study/claim_sets/example_claim_set.py" and matched == NAME


def test_every_suite_names_a_registered_claim_set_and_first_tasks_are_unique():
    for name in suite_names():
        claims = load_suite(name).claims
        assert claims is None or claims in study_claims.names(), f"suite {name}: claims: {claims!r}"
    firsts = [cs.tasks[0] for cs in study_claims.claim_sets()]
    assert len(firsts) == len(set(firsts)), "two claim sets match the same runs"
    assert study_claims.match_claim_set(["toy2d_sep64_sparse", "toy2d_sep64_dense"]).name == "op-grpo-toy"


def test_register_refuses_a_second_set_of_a_name_and_the_reserved_words():
    toy = study_claims.claim_set("op-grpo-toy")
    assert study_claims.register(toy) is toy  # the same object again: a re-import, harmless
    with pytest.raises(ValueError, match="claim set 'op-grpo-toy' is registered twice"):
        study_claims.register(study_claims.ClaimSet("op-grpo-toy", toy.claims, toy.tasks))
    for word in ("none", "auto"):
        with pytest.raises(ValueError, match="cannot name a claim set"):
            study_claims.register(study_claims.ClaimSet(word, toy.claims, toy.tasks))
    with pytest.raises(ValueError, match="names no task"):
        study_claims.ClaimSet("x", toy.claims, ())
