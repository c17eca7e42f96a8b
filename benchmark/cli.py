"""The ``flowzoo`` command line (also ``python -m flowzoo``): :data:`COMMANDS`, the table of its subcommands, and
:func:`main`, which builds the parser from the table and dispatches.

Each subcommand lives in a module of the room its work belongs to, which exports ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status; flowzoo/command_line.py holds what the modules share). A module is imported
only when its command is named, so ``flowzoo --help`` and each command load nothing of the others.
``flowzoo COMMAND --help`` describes a command. :data:`ALIASES` are the older ``python -m MODULE`` spellings, kept
as thin aliases (the same arguments and work) for one release.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple, Sequence

from flowzoo.command_line import HelpFormat
from flowzoo.errors import one_line_errors, user_error  # noqa: F401 (user_error: named here for callers of the CLI)


class Command(NamedTuple):
    name: str  # flowzoo NAME
    module: str  # the module holding add_arguments and run
    summary: str  # its line in `flowzoo --help`, the first of its own --help


COMMANDS = (
    Command("train", "flowzoo.benchmark.run.train_command", "train one run from a config file or one cell of a suite"),
    Command("bench", "flowzoo.benchmark.bench_command", "run a suite: a grid of algorithm x task x seed"),
    Command("memory", "flowzoo.benchmark.run.memory_command",
            "each cell's per-GPU memory estimate, by parts, and whether it fits"),
    Command("report", "flowzoo.benchmark.render.report_command", "write tables and figures from a directory of runs"),
    Command("check-report", "flowzoo.benchmark.render.report_check",
            "check report pages as a reader opens them: images, links, the answer on the first screen"),
    Command("freshness", "flowzoo.benchmark.render.freshness",
            "rerun the first steps of a committed report's cells with today's code: is the report stale?"),
    Command("study", "flowzoo.benchmark.study.study_command",
            "a study's page: paired effects, the claims' verdicts on every seed set"),
    Command("compare-recipes", "flowzoo.benchmark.study.recipe_compare",
            "a study's verdicts at the shared recipe and at the tuned recipes, side by side"),
    Command("pilot-table", "flowzoo.benchmark.render.pilot_table",
            "pilot runs named by how their config differs from a reference, with their gains"),
    Command("time-cells", "flowzoo.benchmark.perf.cell_timing",
            "per-step training cost of a suite's cells, measured interleaved in one process (study --timing)"),
    Command("pretrain", "flowzoo.benchmark.run.pretrain_command",
            "pretrain the tiny tier on synthetic data (resumable)"),
    Command("edit-pairs", "flowzoo.benchmark.prompts.tiny_edit_files",
            "write tiny edit triples as edit-pair files (PNG sources and a .jsonl) for prompts.source=files"),
    Command("grad-snr", "flowzoo.benchmark.run.grad_snr_command",
            "gradient signal-to-noise of a config's training step at its start weights"),
    Command("perf", "flowzoo.benchmark.perf.command",
            "time one Flow-GRPO iteration of ours against the released-style loop"),
    Command("perf-compare", "flowzoo.benchmark.perf.compare",
            "fail on a regression of perf's ours / reference ratio against a baseline (make perf)"),
    Command("recipes", "flowzoo.benchmark.config.recipes_command",
            "the table of every algorithm's recipe values with their sources"),
    Command("export", "flowzoo.benchmark.run.export_lora",
            "write a run's trained LoRA in diffusers' format (load_lora_weights)"),
    Command("export-results", "flowzoo.benchmark.analysis.export_results_command",
            "write runs' configs and per-step metrics as a Hugging Face dataset (Parquet and a dataset card)"),
    Command("eval", "flowzoo.benchmark.run.eval_command",
            "evaluate a run's checkpoint, or a config's untrained model, as the runner does"),
    Command("tune", "flowzoo.benchmark.tuning.tune_command",
            "tune every algorithm of a suite with the same Optuna budget"),
    Command("tuning-selection", "flowzoo.benchmark.tuning.selection",
            "simulate how often a tuning's pick is worse than the default recipe: argmax against confirmed"),
    Command("list", "flowzoo.benchmark.catalog", "list registered algorithms, models, rewards, suites and claim sets"),
)

#: ``python -m MODULE`` -> the subcommand it is an older spelling of (study/verdicts.py keeps its own older options)
ALIASES = {
    "flowzoo.benchmark.render.report_check": "check-report",
    "flowzoo.benchmark.render.freshness": "freshness",
    "flowzoo.benchmark.render.pilot_table": "pilot-table",
    "flowzoo.benchmark.study.recipe_compare": "compare-recipes",
    "flowzoo.benchmark.study.verdicts": "study",
    "flowzoo.benchmark.perf.cell_timing": "time-cells",
    "flowzoo.benchmark.perf.compare": "perf-compare",
    "flowzoo.benchmark.tuning.selection": "tuning-selection",
}


def _add_command(sub, command: Command, with_arguments: bool) -> None:
    """One subcommand: its summary in the command list; with its arguments, its description and its ``run``."""
    parser = sub.add_parser(command.name, help=command.summary, description=f"{command.summary}.",
                            formatter_class=HelpFormat)
    parser.set_defaults(command_parser=parser)
    if with_arguments:
        module = importlib.import_module(command.module)
        parser.description = f"{command.summary}.\n\n{getattr(module, 'DESCRIPTION', '')}".rstrip()
        module.add_arguments(parser)
        parser.set_defaults(func=module.run)


def parser(names: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line: every command with its arguments, or with ``names`` only those commands' arguments (the
    others' modules are not imported; their summaries still list them)."""
    from flowzoo import __version__

    p = argparse.ArgumentParser(
        prog="flowzoo", formatter_class=HelpFormat,
        description="FlowZoo: RL post-training benchmarks for flow-matching models. `flowzoo COMMAND --help` "
                    "describes a command.",
        epilog="exit codes: 0 done; 2 a user error (one line on stderr); 1 an internal error (with its traceback), "
               "failed runs of bench, a cell memory finds too large, or a failed check (perf's gradients, "
               "check-report, freshness, perf-compare); 130 interrupted (rerun to resume)")
    p.add_argument("--version", action="version", version=f"flowzoo {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        _add_command(sub, command, names is None or command.name in names)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the command is the first word that is not an option (the top level's options take no value): only its module
    # is imported
    p = parser([word for word in argv if not word.startswith("-")][:1])
    # overrides may come after options (`train c.yaml --quiet train.steps=3`): collect the leftover key=value words
    args, extra = p.parse_known_args(argv)
    stray = [e for e in extra if e.startswith("-") or "=" not in e or not hasattr(args, "overrides")]
    if stray:  # the subcommand's usage, not the top level's
        args.command_parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return one_line_errors(lambda: args.func(args))
    except KeyboardInterrupt:
        print("flowzoo: interrupted; rerun the same command to resume from the last checkpoint", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
