"""Command-line conventions: --version, descriptions and help with defaults, the subcommand's usage on a bad
argument, one spelling of the report directory, --algorithms cut per task, and Makefile targets that all exist."""

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import flowzoo
from flowzoo.benchmark import cli
from flowzoo.benchmark.run.suite import Suite, expand, load_suite, select
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"flowzoo {flowzoo.__version__}\n"


def test_every_command_has_a_description_and_every_argument_help_with_its_default():
    commands = _subparsers(cli.parser())
    assert {"train", "bench", "report", "list", "export", "recipes"} <= set(commands)
    for name, command in commands.items():
        assert command.description and len(command.description) > 20, name
        text = " ".join(command.format_help().split())
        for action in command._actions:
            if action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"{name} {action.dest}: no help"
            default = action.default
            shown = f"(default: {default})" in text
            if default is None or default is False or default == []:
                assert not shown, f"{name} {action.dest}: says '(default: {default})'"
            elif action.option_strings and default != argparse.SUPPRESS:
                assert shown, f"{name} {action.dest}: default {default!r} not shown"


def test_a_bad_option_prints_the_subcommands_usage(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", str(tmp_path / "c.yaml"), "--bogus", "train.steps=3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("usage: flowzoo train ") and "COMMAND" not in err
    assert err.strip().splitlines()[-1] == "flowzoo train: error: unrecognized arguments: --bogus"
    with pytest.raises(SystemExit):
        cli.main(["list", "x=1"])
    assert capsys.readouterr().err.startswith("usage: flowzoo list ")


def test_the_report_directory_is_out_and_bench_report_is_a_hidden_alias(capsys, monkeypatch, tmp_path):
    bench = _subparsers(cli.parser())["bench"]
    assert "--out DIR" in bench.format_help() and "--report" not in bench.format_help()
    written = []
    monkeypatch.setattr("flowzoo.benchmark.run.suite.run_suite", lambda *args: [])
    monkeypatch.setattr("flowzoo.benchmark.render.report.write_report", lambda runs, out, **kw: written.append((runs, out)) or out)
    runs = tmp_path / "runs"
    assert cli.main(["bench", "smoke", "--runs", str(runs), "--out", str(tmp_path / "a")]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert cli.main(["bench", "smoke", "--runs", str(runs), "--report", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err == "flowzoo: warning: --report is deprecated; use --out\n"
    assert written == [(runs / "smoke", tmp_path / "a"), (runs / "smoke", tmp_path / "b")]


def _suite() -> Suite:
    return Suite(name="s", algorithms=["flow_grpo", "op_grpo"], seeds=[0], tasks={
        "all": {"reward": "toy_target"},
        "op_only": {"reward": "toy_target", "algorithms": ["op_grpo"], "seeds": [5, 6]},
        "both": {"reward": "toy_mode", "algorithms": ["flow_grpo", "op_grpo"]},
    })


def _cells(suite: Suite, tmp_path: Path) -> list[tuple[str, str, int]]:
    return sorted((c.task, c.algorithm_name, c.seed) for c in expand(suite, tmp_path))


def test_algorithms_selection_is_cut_per_task(tmp_path):
    assert _cells(select(_suite(), "flow_grpo", "3"), tmp_path) == [("all", "flow_grpo", 3), ("both", "flow_grpo", 3)]
    assert _cells(select(_suite(), "op_grpo"), tmp_path) == [("all", "op_grpo", 0), ("both", "op_grpo", 0),
                                                            ("op_only", "op_grpo", 5), ("op_only", "op_grpo", 6)]
    assert _cells(select(_suite(), "op_grpo", "3"), tmp_path) == [("all", "op_grpo", 3), ("both", "op_grpo", 3),
                                                                 ("op_only", "op_grpo", 3)]  # --seeds: every task
    listing = _suite()
    del listing.tasks["all"]  # every task lists its algorithms, none of them dance_grpo
    with pytest.raises(ConfigError, match=r"^--algorithms: suite s does not run dance_grpo; its algorithms: "
                                          r"flow_grpo, op_grpo$"):  # issue 44: never trained as an extra
        select(listing, "dance_grpo")
    with pytest.raises(ConfigError, match=r"^--algorithms: suite s does not run dance_grpo; its algorithms: "):
        select(_suite(), "flow_grpo,dance_grpo")


def test_op_grpo_study_runs_one_algorithm():
    """The reported case: `flowzoo bench op-grpo-study --algorithms op_grpo --seeds 3` failed on the dense task,
    which lists flow_grpo too."""
    suite = select(load_suite("op-grpo-study"), "op_grpo", "3")
    configs = expand(suite, Path("unused"))
    assert configs and {c.algorithm_name for c in configs} == {"op_grpo"} and {c.seed for c in configs} == {3}


def test_makefile_targets_all_have_rules_and_make_help_lists_them():
    text = (ROOT / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY:(.*)$", text, re.M)[1].split())
    rules = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M))
    assert phony - rules == set(), "listed in .PHONY without a rule"
    assert rules - phony == set(), "a rule missing from .PHONY"
    described = set(re.findall(r"^([A-Za-z][\w-]*)\s*:[^=\n]*## ", text, re.M))
    assert described == phony, "every target carries a `## description` for make help"
    if shutil.which("make"):
        out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        assert {line.split("\t")[0] for line in out.splitlines()} == phony


@pytest.mark.parametrize("option, value", [("--workers", "0"), ("--workers", "-2"), ("--budget-minutes", "0"),
                                           ("--budget-minutes", "-1"), ("--budget-minutes", "nan"),
                                           ("--budget-minutes", "inf")])
def test_bench_refuses_a_worker_count_or_budget_that_means_nothing(option, value, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("flowzoo.benchmark.run.suite.run_suite", lambda *args: pytest.fail("a run started"))
    assert cli.main(["bench", "smoke", "--runs", str(tmp_path), option, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"flowzoo: error: {option} ") and not any(tmp_path.iterdir())
