"""One command surface: every ``flowzoo`` subcommand comes from the table in benchmark/cli.py, each a module with
``add_arguments`` and ``run``; every ``python -m flowzoo.X`` a doc names is a listed alias of one, with the same
arguments; ``flowzoo --help`` imports no command's module."""

import argparse
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowzoo.benchmark import cli

ROOT = Path(__file__).resolve().parents[1]
#: the subcommands that replaced a `python -m` tool (issue 72)
NEW = ("check-report", "freshness", "pilot-table", "compare-recipes", "time-cells", "perf-compare", "tuning-selection")
NAMES = [command.name for command in cli.COMMANDS]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> list[tuple]:
    return [(tuple(a.option_strings), a.dest, a.default, a.nargs) for a in parser._actions if a.dest != "help"]


def test_every_command_comes_from_a_module_with_add_arguments_and_run():
    assert len(set(NAMES)) == len(NAMES) and set(NEW) <= set(NAMES)
    for command in cli.COMMANDS:
        module = importlib.import_module(command.module)
        assert callable(getattr(module, "add_arguments", None)), command.module
        assert callable(getattr(module, "run", None)), command.module
        assert command.summary and "\n" not in command.summary and not command.summary.endswith(".")
    assert set(cli.ALIASES.values()) <= set(NAMES)


def _python_m_modules(text: str) -> set[str]:
    return set(re.findall(r"-m\s+(flowzoo\.[\w.]*\w)", text))


def test_every_python_m_form_the_docs_name_is_a_listed_alias():
    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "reports").glob("example-*/**/HOW.md"))]
    named = {module: path.relative_to(ROOT) for path in files for module in _python_m_modules(path.read_text())}
    assert not {m: str(p) for m, p in named.items() if m not in cli.ALIASES}
    assert _python_m_modules("`python3 -m flowzoo.benchmark.study_timing x` and $(PY) -m flowzoo.a.b") == {
        "flowzoo.benchmark.study_timing", "flowzoo.a.b"}  # the check sees both spellings


@pytest.mark.parametrize("module", sorted(cli.ALIASES))
def test_an_alias_takes_its_commands_arguments(module, capsys):
    alias = importlib.import_module(module)
    with pytest.raises(SystemExit) as exit_:
        alias.main(["--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: python -m {module}")
    if module == "flowzoo.benchmark.study.verdicts":  # the older options of flowzoo study, kept as they were
        return
    command = _subparsers(cli.parser([cli.ALIASES[module]]))[cli.ALIASES[module]]
    spelled = argparse.ArgumentParser()
    alias.add_arguments(spelled)
    assert _options(spelled) == _options(command) and alias.run is command.get_default("func")
    assert 'if __name__ == "__main__":\n    sys.exit(main())' in Path(alias.__file__).read_text() or \
        'if __name__ == "__main__":\n    raise SystemExit(main())' in Path(alias.__file__).read_text()


def test_flowzoo_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    listed = set(re.findall(r"^    (\S+)", capsys.readouterr().out, re.M))
    assert exit_.value.code == 0 and listed == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_commands_help_exits_0(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([name, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith(f"usage: flowzoo {name} ")
    assert dict((c.name, c.summary) for c in cli.COMMANDS)[name] + "." in " ".join(out.split())


def test_flowzoo_help_and_a_command_import_only_that_commands_module():
    probe = ("import sys, contextlib, io\nfrom flowzoo.benchmark import cli\n"
             "for argv in (['--help'], ['check-report', '--help']):\n"
             "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
             "        cli.main(argv)\n"
             "    print(sorted(c.name for c in cli.COMMANDS if c.module in sys.modules), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=120).stdout.splitlines()
    assert out == ["[] False", "['check-report'] False"]


def test_a_new_command_runs_through_flowzoo_as_through_its_alias(tmp_path, capsys):
    baseline = ROOT / "benchmark" / "perf" / "baseline.json"
    assert cli.main(["perf-compare", str(baseline), str(baseline)]) == 0
    assert "REGRESSION" not in capsys.readouterr().out
    slower = json.loads(baseline.read_text())
    for bench in slower["benchmarks"]:
        bench["extra_info"]["ratio"] *= 1.5
    (tmp_path / "slower.json").write_text(json.dumps(slower))
    assert cli.main(["perf-compare", str(baseline), str(tmp_path / "slower.json")]) == 1
    assert "REGRESSION" in capsys.readouterr().out
    assert cli.main(["tuning-selection", "--simulations", "0"]) == 2
    assert capsys.readouterr().err == "flowzoo: error: --simulations 0: give at least 1 simulated tuning\n"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check-report"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: flowzoo check-report ")
    assert err.strip().endswith("flowzoo check-report: error: name at least one report directory")
