"""The ``flowzoo`` command line (also ``python -m flowzoo``).

    flowzoo train CONFIG [key=value ...]     one run (CONFIG: a YAML file or a suite's cell SUITE:TASK/ALGORITHM)
    flowzoo bench SUITE [--runs DIR] [--workers N] [--executor local|submitit-local|slurm] [--out DIR] [key=value ...]
    flowzoo report RUNS_DIR --out DIR
    flowzoo study RUNS_DIR --suite SUITE [--out DIR] [--claims SET] [--timing CSV] [--vs CELL,...] ...
    flowzoo list
    flowzoo export RUN_DIR --out DIR          a run's LoRA for diffusers' load_lora_weights
    flowzoo export-results RUNS_OR_REPORT --out DIR   runs as a Parquet dataset (datasets.load_dataset)
    flowzoo eval CONFIG_OR_RUN [--steps N] [--samples K] [--out FILE] [key=value ...]
    flowzoo pretrain tiny --data shapes|glyphs [--minutes M] [--steps N] ...
    flowzoo grad-snr CONFIG [--batches K] [--fixed-prompts] [key=value ...]
    flowzoo recipes [--out docs/recipes.md]    the table of every algorithm's recipe values and sources
    flowzoo memory SUITE [--gpus N] [--device-memory GIB] [--tasks T,T] [--algorithms A,B] [key=value ...]
    flowzoo tune SUITE [--trials N] [--workers N] [--executor local|submitit-local|slurm] [--storage URL] [--runs DIR]
                 [--out DIR] [--report]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from flowzoo.errors import FlowZooError, one_line_errors, user_error


def _cmd_train(args: argparse.Namespace) -> int:
    from flowzoo.algorithms.engine.distributed import process_group
    from flowzoo.benchmark.run.run_source import load_run
    from flowzoo.benchmark.run.runner import holds_other_config, is_finished, train
    from flowzoo.benchmark.run.suite import describe_differences
    from flowzoo.errors import ConfigError

    _memory_check_option(args)
    config, resolved = load_run(args.config, args.overrides)
    run_dir = config.resolved_run_dir()
    with process_group() as dist:  # under a launcher: joined here, left cleanly (or at once on failure) below
        if dist.is_main and not args.quiet:
            print(resolved.recipe_line(), flush=True)
        try:
            if holds_other_config(run_dir, config):
                raise ConfigError(f"run directory {run_dir} holds a run of a different config "
                                  f"({describe_differences(run_dir, config)}); train this config elsewhere with "
                                  f"run_dir=DIR on the command line, or delete {run_dir} to start over")
            finished = is_finished(run_dir, config)
            run_dir = train(config, progress=not args.quiet, dist=dist)
        except BaseException as error:
            if dist.world_size > 1:
                _end_failed_rank(dist.describe(), error)
            raise
    if dist.is_main:  # once under a multi-process launch
        if finished:
            print(f"run already finished in {run_dir} (its done.json); nothing trained. Give run_dir=DIR to train "
                  f"it again elsewhere")
        else:
            print(f"run written to {run_dir}")
    if dist.world_size > 1:
        # Every rank has passed the final barrier and left the process group, and every file is written (atomic
        # writes, fsynced). Skip the interpreter's and C++ runtime's teardown: even after destroy_process_group a
        # rank could still abort there ("terminate called without an active exception", 1 in 24 runs of the
        # 2-process tests), which would turn a finished run into a failed launch.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _end_failed_rank(rank: str, error: BaseException) -> None:
    """One process of a multi-process run failed: one line naming the rank and the cause (a traceback above it only
    for an unexpected error, i.e. a bug), then end this process at once. Its peers may be blocked in a collective or
    already gone, so neither a barrier nor the interpreter's teardown of the process group is safe here; the launcher
    stops the other ranks, which say so in one line each."""
    import traceback

    if isinstance(error, KeyboardInterrupt):
        line, code = f"flowzoo: {rank}: interrupted; rerun the same command to resume from the last checkpoint", 130
    elif isinstance(error, Exception) and user_error(error) is not None:
        line, code = f"flowzoo: error: {rank}: {user_error(error)}", 2
    else:
        traceback.print_exception(error, file=sys.stderr)
        line, code = f"flowzoo: error: {rank} failed: {type(error).__name__}: {error}", 1
    print(line.splitlines()[0] if line else line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


#: upper bounds of the command lines' counts: a value past them would not fit in memory or time on any machine this
#: project targets (a sample count of 10^20 was killed by the kernel, not refused), so argparse refuses it with the usage
MAX_BATCH = 65_536  # samples, images or prompts in one go
MAX_SAMPLING_STEPS = 10_000
MAX_REPEATS = 10_000
MAX_LORA_RANK = 4_096
MAX_THREADS = 1_024


def at_most(high: int):
    """An argparse type: an integer <= ``high`` (lower bounds are checked by each command with its own message)."""
    def parse(text: str) -> int:
        value = int(text)  # ValueError: argparse's "invalid parse value" line
        if value > high:
            raise argparse.ArgumentTypeError(f"{value} is above the maximum {high}")
        return value
    parse.__name__ = "int"
    return parse


def _cmd_bench(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.render.bench_report import write_suite_report
    from flowzoo.benchmark.run.suite import load_suite, run_suite, select

    if args.workers is not None and args.workers < 1:
        raise FlowZooError(f"--workers {args.workers}: give at least 1 (default: the number of CPUs)")
    if args.budget_minutes is not None and not (math.isfinite(args.budget_minutes) and args.budget_minutes > 0):
        raise FlowZooError(f"--budget-minutes {args.budget_minutes}: give a positive number of minutes (default: "
                           f"no limit)")
    from flowzoo.models.shipped import refuse_shipped

    _memory_check_option(args)
    if args.out:
        refuse_shipped(args.out, "--out")
        from flowzoo.io import check_out_dir

        check_out_dir(args.out)  # an existing file: refused before the grid runs, not after
    refuse_shipped(args.runs, "--runs")
    suite = select(load_suite(args.suite), args.algorithms, args.seeds, args.tasks, args.seed_set)
    if args.tuned is not None:  # every cell at its algorithm's tuned recipe (checked where the cells expand)
        suite.tuned = args.tuned
    from flowzoo.benchmark.run.executors import make_grid

    executor = make_grid(args.executor, args.cluster, args.slurm_partition, Path(args.runs), suite.name)
    failures = run_suite(suite, Path(args.runs), args.workers, args.overrides, args.budget_minutes, executor)
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    if args.out:
        out = write_suite_report(suite, Path(args.runs), Path(args.out))
        print(f"report written to {out}")
    return 1 if failures else 0


def _memory_check_option(args: argparse.Namespace) -> None:
    """``--no-memory-check``: the launch's memory check is skipped here and in the runs it starts (their environment)."""
    from flowzoo.benchmark.run.memory import BYPASS_ENV

    if getattr(args, "no_memory_check", False):
        os.environ[BYPASS_ENV] = "1"


def _cmd_memory(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.run.memory_table import report
    from flowzoo.benchmark.run.suite import load_suite, select

    if args.device_memory is not None and not (math.isfinite(args.device_memory) and args.device_memory > 0):
        raise FlowZooError(f"--device-memory {args.device_memory}: give the device's memory in GiB, a number > 0")
    if args.gpus is not None and args.gpus < 1:
        raise FlowZooError(f"--gpus {args.gpus}: give at least 1 (default: the suite's released_gpus)")
    suite = select(load_suite(args.suite), args.algorithms, None, args.tasks)
    kwargs = {} if args.device_memory is None else {"budget_gib": args.device_memory}
    text, every_fit = report(suite, args.gpus, overrides=tuple(args.overrides), **kwargs)
    print(text)
    return 0 if every_fit else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.render.report import write_report

    from flowzoo.benchmark.analysis.targets import parse_target

    target = parse_target(args.target) if args.target else None
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(args.out, "--out")
    out = write_report(Path(args.runs_dir), Path(args.out), baseline=args.baseline, target=target)
    print(f"report written to {out}")
    return 0


def _cmd_study(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.study.verdicts import StudyRequest, write_study
    from flowzoo.benchmark.run.suite import load_suite

    suite = load_suite(args.suite)  # a bad name fails here, in one line, before anything is read
    out = args.out or str(Path("reports") / suite.name)
    vs = tuple(c.strip() for c in (args.vs or "").split(",") if c.strip())
    request = StudyRequest(args.runs_dir, out, args.suite, args.baseline, vs, args.claims or "auto", args.timing,
                           args.seed_sets, args.replicate_on, args.smooth, args.resamples, args.save_metrics)
    print(f"study written to {write_study(request)}")
    return 0


def pretrain_command(args: argparse.Namespace) -> str:
    """The pretrain command with every option spelled out (what the weights' record stores)."""
    options = ["data", "steps", "minutes", "batch", "lr", "ema", "seed", "threads", "out", "run_dir"]
    words = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in options if getattr(args, name) is not None]
    return " ".join(["flowzoo pretrain", args.model, *words])


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from flowzoo.models.tiny_pretrain import pretrain

    out = pretrain(
        args.data, out=args.out, run_dir=args.run_dir, steps=args.steps, minutes=args.minutes, batch=args.batch,
        lr=args.lr, ema=args.ema, seed=args.seed, threads=args.threads, progress=not args.quiet,
        command=pretrain_command(args),
    )
    print(f"weights written to {out}")
    return 0


def _cmd_grad_snr(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.run.grad_snr import measure
    from flowzoo.benchmark.run.run_source import load_run

    result = measure(load_run(args.config, args.overrides)[0], args.batches, args.fixed_prompts, not args.quiet)
    print(result.line())
    return 0


def _cmd_recipes(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.config.recipes import recipe_table
    from flowzoo.io import atomic_write_text

    from flowzoo.models.shipped import refuse_shipped

    table = recipe_table()
    if args.out:
        refuse_shipped(args.out, "--out")
        atomic_write_text(args.out, table)  # whole or not at all; a full disk names the file
        print(f"recipes written to {args.out}")
    else:
        print(table, end="")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.run.export_lora import export

    out = export(Path(args.run_dir), Path(args.out))
    what = "transformer" if (Path(out) / "transformer").is_dir() else "LoRA"  # a full fine-tuning: its whole transformer
    print(f"{what} written to {out}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import json

    from flowzoo.benchmark.run.eval_command import evaluate

    record = evaluate(args.target, args.steps, args.samples, args.out, args.overrides)
    print(json.dumps(record))
    return 0


def _cmd_export_results(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.analysis.results_dataset import export_results
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(args.out, "--out")
    out = export_results(args.source, args.out)
    print(f"results dataset written to {out} (datasets.load_dataset(\"parquet\", data_dir=\"{out}\"))")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from flowzoo.benchmark import catalog

    if args.name and "=" in args.name:  # list takes no key=value overrides
        args.command_parser.error(f"unrecognized arguments: {args.name}")
    print(catalog.detail(args.name) if args.name else catalog.overview())
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.tuning.tune import (check_report_storage, check_storage, default_storage, load_tuning, tune,
                                              tuning_cells)

    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(args.runs, "--runs")  # before the trials' folders or the default SQLite file are made there
    if args.trials is not None and args.trials < 1:  # --report too: it writes the budget as spent/trials
        raise FlowZooError(f"--trials {args.trials}: give a positive number of trials (the same for every cell)")
    if args.out:
        refuse_shipped(args.out, "--out")
        from flowzoo.io import check_out_dir

        check_out_dir(args.out)  # an existing file: refused before any trial runs, not after
    if args.report:  # the outputs of the trials so far, none run
        if args.executor != "local" or args.cluster is not None or args.slurm_partition is not None:
            raise FlowZooError("--report runs no trial: --executor, --cluster and --slurm-partition apply to the "
                               "trials; drop them")
        if not args.out:
            raise FlowZooError("--report writes the tuning's outputs: give --out DIR")
        suite, design = load_tuning(args.suite)
        cells = tuning_cells(suite, design, args.tasks, args.algorithms)
        if args.from_trials is None:
            url = args.storage or default_storage(Path(args.runs), suite, create=False)
            check_storage(url)
            check_report_storage(url, suite)
        elif args.storage is not None:
            raise FlowZooError("--from-trials reads an earlier report's trial tables, not a storage: drop --storage")
        else:
            url = None
    elif args.from_trials is not None:
        raise FlowZooError("--from-trials only writes a report from an earlier one's trial tables: add --report")
    else:
        from flowzoo.benchmark.run.executors import make_grid
        from flowzoo.benchmark.run.suite import load_suite

        executor = make_grid(args.executor, args.cluster, args.slurm_partition, Path(args.runs),
                             f"{load_suite(args.suite).name}/tune")  # job files beside bench's, not mixed
        suite, design, cells, url = tune(args.suite, Path(args.runs), args.workers, args.trials, args.tasks,
                                         args.algorithms, args.storage, executor)
        from flowzoo.benchmark.tuning.confirm import confirm_cells

        confirm_cells(suite, design, cells, url, Path(args.runs) / suite.name / "tuning", args.trials or design.trials,
                      workers=args.workers if args.executor == "local" else None)
    if args.out:
        from flowzoo.benchmark.tuning.report import write_tuning_report

        out = write_tuning_report(suite.name, design, cells, url, Path(args.out), args.trials or design.trials,
                                  from_trials=args.from_trials)
        print(f"tuning report written to {out}")
    return 0


def _cmd_perf(args) -> int:
    from flowzoo.benchmark.perf.command import command

    return command(args)


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions keep their line breaks; an option's help ends with ``(default: X)`` unless the default is None,
    False or empty (its help then says what happens without it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


class _Names:
    """A registry's names in a help text (``%(name)s``), read from ``module.names()`` only when the help is shown, so
    building the parser imports nothing heavy."""

    def __init__(self, module: str):
        self.module = module

    def __str__(self) -> str:
        import importlib

        return ", ".join(importlib.import_module(self.module).names())


class _DeprecatedAlias(argparse.Action):
    """A hidden old spelling of an option: it stores into the new option's ``dest`` and says so on stderr."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **{**kwargs, "help": argparse.SUPPRESS})

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"flowzoo: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _no_memory_check_option(parser, what: str) -> None:
    """``--no-memory-check`` of the commands that launch runs (train, bench)."""
    parser.add_argument("--no-memory-check", action="store_true",
                        help=f"{what} even where the per-GPU memory estimate exceeds the GPU's memory (`flowzoo "
                             "memory`; same as FLOWZOO_NO_MEMORY_CHECK=1)")


def _command(sub, name: str, func, summary: str, description: str) -> argparse.ArgumentParser:
    """A subcommand: ``summary`` in the command list, ``summary`` + ``description`` on its own ``--help``."""
    command = sub.add_parser(name, help=summary, description=f"{summary}.\n\n{description}".rstrip(),
                             formatter_class=_Help)
    command.set_defaults(func=func, command_parser=command)
    return command


def parser() -> argparse.ArgumentParser:
    from flowzoo import __version__

    p = argparse.ArgumentParser(
        prog="flowzoo", formatter_class=_Help,
        description="FlowZoo: RL post-training benchmarks for flow-matching models. `flowzoo COMMAND --help` "
                    "describes a command.",
        epilog="exit codes: 0 done; 2 a user error (one line on stderr); 1 an internal error (with its traceback), "
               "failed runs of bench or a failed gradient check of perf; 130 interrupted (rerun to resume)")
    p.add_argument("--version", action="version", version=f"flowzoo {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = _command(sub, "train", _cmd_train, "train one run from a config file or one cell of a suite",
                 "The run goes to the config's run_dir (default runs/<task>/<algorithm>/s<seed>; a suite's cell: "
                 "runs/<suite>/<task>/<algorithm>/s<seed>,\nas bench places it); a finished run is kept, a killed one "
                 "resumes from its last checkpoint. Bad configs fail\nbefore anything is written. The algorithm's "
                 "released recipe (benchmark/recipes, docs/recipes.md) sits under\nthe config's own algorithm "
                 "keys; the first line says which values it set (use_recipe=false: none).")
    t.add_argument("config", metavar="CONFIG", help="YAML config (see benchmark/configs/), or a suite's cell "
                   "SUITE:TASK/ALGORITHM (e.g. tiny-rare-counting-study:tiny_counting_rare/flow_grpo), resolved as "
                   "bench resolves it")
    t.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. train.steps=10 algorithm.lr=1e-3")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    _no_memory_check_option(t, "launch")

    b = _command(sub, "bench", _cmd_bench, "run a suite: a grid of algorithm x task x seed",
                 "Runs go to RUNS/<suite>/<task>/<algorithm>/s<seed>/; finished runs are skipped, killed ones "
                 "resume.\n--algorithms cuts every task to the selected algorithms (a task left with none is "
                 "skipped); --tasks keeps the named tasks; --seeds or --seed-set replaces the seeds.")
    b.add_argument("suite", help="suite name (see `flowzoo list`) or path to a suite YAML")
    b.add_argument("overrides", nargs="*", default=[], help="key=value overrides applied to every run")
    b.add_argument("--runs", default="runs", metavar="DIR", help="directory of run directories")
    b.add_argument("--tuned", default=None, metavar="DIR", help="run each cell at its algorithm's tuned recipe "
                   "from DIR/<task>/<algorithm>.yaml (`flowzoo tune --out OUT` writes OUT/tuned; replaces the suite's "
                   "tuned: key; each run's config.yaml records it as recipe:); give it its own --runs")
    b.add_argument("--workers", type=int, default=None, metavar="N",
                   help="parallel runs (default: number of CPUs); with a submitit executor, jobs at once (default: "
                        "no limit on slurm)")
    b.add_argument("--executor", default="local", choices=["local", "submitit-local", "slurm"],
                   help="local: worker processes here; slurm: one SLURM job per run through submitit, with its "
                        "task's resources, requeued on preemption or timeout; submitit-local: the same jobs as "
                        "processes here (needs pip install -e '.[slurm]')")
    b.add_argument("--cluster", default=None, metavar="FILE",
                   help="YAML of the scheduler's settings: partition, account, qos, constraint, setup, slurm_args, "
                        "resources, max_requeues, ... (docs/harness.md)")
    b.add_argument("--slurm-partition", default=None, metavar="NAME", help="SLURM partition (wins over --cluster's)")
    b.add_argument("--algorithms", default=None, metavar="A,B", help="comma-separated subset of the suite's algorithms "
                                                      "(default: all)")
    b.add_argument("--seeds", default=None, metavar="S,S",
                   help="comma-separated seeds for every task, instead of the suite's and the tasks' own")
    b.add_argument("--seed-set", default=None, metavar="NAME",
                   help="one of the suite's named seed sets (e.g. replication) as the seeds of every task")
    b.add_argument("--tasks", default=None, metavar="T,T",
                   help="comma-separated subset of the suite's tasks, control cells included (e.g. "
                        "toy2d_sep64_sparse,toy2d_sep64_sparse@no_reuse; default: all)")
    b.add_argument("--budget-minutes", type=float, default=None, metavar="M", help="start no run after this many minutes "
                                                                       "(default: no limit)")
    b.add_argument("--out", default=None, metavar="DIR",
                   help="when done, write the report of this command's runs (the selected tasks, algorithms and "
                        "seeds; other runs under RUNS/SUITE are left out) into DIR")
    b.add_argument("--report", dest="out", action=_DeprecatedAlias, new="--out", metavar="DIR")
    _no_memory_check_option(b, "launch runs")

    mem = _command(sub, "memory", _cmd_memory, "each cell's per-GPU memory estimate, by parts, and whether it fits",
                   "Resolves every cell of SUITE as bench does (no prompt file or weight is read) and prints a table "
                   "of its\nper-GPU peak estimate in GiB (docs/perf.md, \"Memory at the paper recipes\"): weights, "
                   "trainable state,\nbatch, kept rollout graphs, and the peak rollout, decode and update calls. "
                   "train and bench refuse a\nrun whose estimate exceeds its GPU (torch's total_memory, or "
                   "FLOWZOO_DEVICE_MEMORY_GIB), naming the\nknobs to change; --no-memory-check launches anyway. "
                   "Exit 0 when every cell fits, 1 when one does not.")
    mem.add_argument("suite", help="suite name (see `flowzoo list`) or path to a suite YAML")
    mem.add_argument("overrides", nargs="*", default=[], help="key=value overrides applied to every cell, e.g. "
                     "algorithm.micro_batch=2")
    mem.add_argument("--gpus", type=at_most(MAX_BATCH), default=None, metavar="N",
                     help="GPUs (one process each) the global batch is split over (default: the suite's "
                          "released_gpus, 8 for the paper suites; else 1)")
    mem.add_argument("--device-memory", type=float, default=None, metavar="GIB",
                     help="memory of one GPU in GiB (default: 79.6, an H100 80 GB's)")
    mem.add_argument("--tasks", default=None, metavar="T,T", help="comma-separated subset of the suite's tasks")
    mem.add_argument("--algorithms", default=None, metavar="A,B", help="comma-separated subset of its algorithms")

    r = _command(sub, "report", _cmd_report, "write tables and figures from a directory of runs",
                 "Writes DIR/index.md and index.html, tables/*.tex and figures/*.png|svg; the same runs give the "
                 "same bytes.")
    r.add_argument("runs_dir", help="directory searched for run directories (e.g. runs/quick)")
    r.add_argument("--out", required=True, metavar="DIR", help="report directory")
    r.add_argument("--baseline", default="flow_grpo", help="the algorithm others are compared against")
    r.add_argument("--target", default=None,
                   help="reward target: '0.9gain' or '90%%gain' of the way from the base model to the baseline's "
                        "final reward (default 0.9gain), '0.9x' or '90%%' of the baseline's final reward, or an "
                        "absolute value '0.8'")

    st = _command(sub, "study", _cmd_study, "a study's page: paired effects, the claims' verdicts on every seed set",
                  "Reads every run under RUNS_DIR and writes DIR/README.md and index.html: the claims' forest plots, "
                  "the\nverdicts, each task's eval-reward curves of every cell against steps and NFE, then the tables; "
                  "with\nruns.csv, effects.csv, gains.csv, curves.csv, claims.csv and claim_estimates.csv. Each seed "
                  "set (the\nsuite's seed_sets that ran, the seeds run outside them as 'other', or --seed-sets) is "
                  "judged apart,\nwith its own target. A hand-written DIR/ANSWER.md is kept and shown under the "
                  "title.\nExit 0 when written; 2 for a bad option, suite, claim set or seed set, or unreadable runs "
                  "(one line,\nnothing written).")
    st.add_argument("runs_dir", metavar="RUNS_DIR", help="the suite's runs (e.g. runs/op-grpo-study)")
    st.add_argument("--suite", required=True, metavar="SUITE",
                    help="suite name (see `flowzoo list`) or YAML path: its seed_sets and its claims: key")
    st.add_argument("--out", default=None, metavar="DIR", help="output folder (default: reports/<suite name>)")
    claims = st.add_argument("--claims", default=None, metavar="SET",
                             help="claim set to judge: %(claim_sets)s, or none (default: the suite's claims: key, "
                                  "else the set whose task the suite holds; `flowzoo list` describes them)")
    claims.claim_sets = _Names("flowzoo.benchmark.study.claims")  # read from the registry when --help is shown
    st.add_argument("--vs", default=None, metavar="CELL,...", help="cells (algorithm or algorithm@variant) to pair "
                    "the others with besides the baseline (the claim set's own, e.g. op_grpo, are added when they ran)")
    st.add_argument("--baseline", default="flow_grpo", help="the cell every other is paired with; its gain sets the "
                    "targets")
    st.add_argument("--seed-sets", action="append", default=None, metavar="SPEC",
                    help="the seed sets to judge instead of every one that ran: the suite's set names "
                         "(exploration,replication) or a set of your own, NAME=SEEDS (unseen=300-309); repeatable")
    st.add_argument("--replicate-on", default=None, metavar="SET",
                    help="say 'replicated' when the held-out 'replication' set and this set agree (default: when "
                         "exploration and replication agree)")
    st.add_argument("--timing", default=None, metavar="CSV",
                    help="per-step costs measured interleaved (python -m flowzoo.benchmark.perf.cell_timing) for the "
                         "wall-clock-to-target estimates; copied into DIR as timing.csv")
    st.add_argument("--smooth", type=int, default=3, help="evaluations averaged into the final reward and the "
                    "curves the costs are read on")
    st.add_argument("--resamples", type=at_most(1_000_000), default=10_000, help="bootstrap resamples (>= 100)")
    st.add_argument("--save-metrics", default=None, metavar="DIR", help="also copy every run's config.yaml and "
                    "metrics.csv trimmed to the columns the study reads into DIR (a committable record)")

    pt = _command(sub, "pretrain", _cmd_pretrain, "pretrain the tiny tier on synthetic data (resumable)",
                  "Trains the tiny text-to-image model from scratch; the shipped weights are replaced only when "
                  "--out names them.")
    pt.add_argument("model", choices=["tiny"], help="the model to pretrain")
    pt.add_argument("--data", choices=["shapes", "glyphs"], default="shapes", help="synthetic data set")
    pt.add_argument("--steps", type=int, default=100_000, help="stop after this many optimizer steps")
    pt.add_argument("--minutes", type=float, default=None, help="stop after this much training wall time "
                                                                 "(default: no limit)")
    pt.add_argument("--batch", type=at_most(MAX_BATCH), default=32, help="images per optimizer step")
    pt.add_argument("--lr", type=float, default=5e-4, help="learning rate")
    pt.add_argument("--ema", type=float, default=0.998, help="decay of the parameter average that is shipped")
    pt.add_argument("--seed", type=int, default=0, help="random seed")
    pt.add_argument("--threads", type=at_most(MAX_THREADS), default=2, help="torch threads")
    pt.add_argument("--out", default=None,
                    help="weights file (default: <run-dir>/tiny_<data>.safetensors; the shipped "
                         "models/weights/tiny_<data>.safetensors is replaced only when named here)")
    pt.add_argument("--run-dir", default=None, help="checkpoint directory (default: runs/pretrain_tiny_<data>)")
    pt.add_argument("--quiet", action="store_true", help="no progress bar")

    g = _command(sub, "grad-snr", _cmd_grad_snr,
                 "gradient signal-to-noise of a config's training step at its start weights",
                 "Takes K independent batches' update gradients at the same weights and prints their mean pairwise "
                 "cosine\n(with its standard error), the share of coordinates with |z| > 3, the reward and seconds "
                 "per batch.")
    g.add_argument("config", metavar="CONFIG", help="YAML config (see benchmark/configs/) or a suite's cell "
                   "SUITE:TASK/ALGORITHM")
    g.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. train.prompts_per_step=16")
    g.add_argument("--batches", type=at_most(MAX_REPEATS), default=16, help="independent batches to compare")
    g.add_argument("--fixed-prompts", action="store_true", help="the same prompts in every batch (only noise varies)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")

    pf = _command(sub, "perf", _cmd_perf, "time one Flow-GRPO iteration of ours against the released-style loop",
                  "Interleaved medians, phase split, peak memory and a gradient check (exit 1 if the gradients "
                  "differ by more than 1e-5).")
    pf.add_argument("overrides", nargs="*", default=[], help="algorithm key=value overrides, e.g. reuse_rollout_graph=true")
    pf.add_argument("--model-path", default=None, help="SD3 diffusers directory (default: a tiny random pipeline)")
    pf.add_argument("--device", default="cpu", help="torch device")
    pf.add_argument("--lora-rank", type=at_most(MAX_LORA_RANK), default=32, help="LoRA rank (32 is the released recipe)")
    pf.add_argument("--repeats", type=at_most(MAX_REPEATS), default=None,
                    help="interleaved repetitions per variant (default 5; 3 with --gpu-check)")
    pf.add_argument("--prompts", type=at_most(MAX_BATCH), default=1,
                    help="prompts per iteration, group_size samples each")
    pf.add_argument("--gpu-check", action="store_true", help="SD3.5-Medium-, FLUX.1-dev- and Qwen-Image-sized random "
                    "transformers against the released step structures, sized for one H100 80 GB in 8 minutes "
                    "(docs/perf.md); needs --device cuda")
    pf.add_argument("--plan", action="store_true", help="with --gpu-check: list its variants, expected memory and H100 "
                    "seconds and the time budget, and run nothing (works on the CPU)")
    pf.add_argument("--wheels", default=None, metavar="DIR", help="with --gpu-check on a machine without a package "
                    "registry: install DIR's wheels (e.g. diffusers) into a temporary folder first, offline")
    pf.add_argument("--precision", action="store_true", help="per trained step, how far the update's recomputed "
                    "log-probs drift from the rollout's in float32, bfloat16 and float16 (docs/perf.md)")

    rc = _command(sub, "recipes", _cmd_recipes, "the table of every algorithm's recipe values with their sources",
                  "Reads benchmark/recipes/*.yaml and the registered algorithms' defaults.")
    rc.add_argument("--out", default=None, help="write the markdown here (e.g. docs/recipes.md) instead of printing it")

    ex = _command(sub, "export", _cmd_export, "write a run's trained LoRA in diffusers' format (load_lora_weights)",
                  "Writes DIR/pytorch_lora_weights.safetensors and a model card (DIR/README.md) with the run's "
                  "config and final metrics.")
    ex.add_argument("run_dir", help="run directory of an sd3, wan or tiny run (its config.yaml and checkpoint.pt)")
    ex.add_argument("--out", required=True, metavar="DIR",
                    help="directory for pytorch_lora_weights.safetensors and README.md")

    er = _command(sub, "export-results", _cmd_export_results,
                  "write runs' configs and per-step metrics as a Hugging Face dataset (Parquet and a dataset card)",
                  "Reads RUNS_OR_REPORT (a runs directory, or a study page with run-metrics/) and writes\n"
                  "DIR/data/train-*.parquet (one row per run and logged step; the run's config keys as config.* "
                  "columns)\nand DIR/README.md; load it with datasets.load_dataset(\"parquet\", data_dir=DIR).")
    er.add_argument("source", metavar="RUNS_OR_REPORT", help="a runs directory or a study page holding run-metrics/")
    er.add_argument("--out", required=True, metavar="DIR", help="the dataset's folder (written all or nothing)")

    ev = _command(sub, "eval", _cmd_eval,
                  "evaluate a run's checkpoint, or a config's untrained model, as the runner does",
                  "A run directory: its last checkpoint (the final one of a finished run) under its own config. A "
                  "config:\nits untrained model. Prints one JSON line (eval_reward, eval/<component>, per-tag means); "
                  "writes\nnothing into the run.")
    ev.add_argument("target", metavar="CONFIG_OR_RUN", help="a run directory, a YAML config or a suite's cell "
                    "SUITE:TASK/ALGORITHM")
    ev.add_argument("overrides", nargs="*", default=[], help="key=value overrides of a config, e.g. algorithm.guidance=3")
    ev.add_argument("--steps", type=at_most(MAX_SAMPLING_STEPS), default=None, metavar="N",
                    help="ODE steps (default: the config's train.eval_num_steps)")
    ev.add_argument("--samples", type=at_most(MAX_BATCH), default=None, metavar="K",
                    help="samples per held-out prompt (default: the config's train.eval_samples_per_prompt)")
    ev.add_argument("--out", default=None, metavar="FILE", help="also write the result as JSON to FILE")

    tu = _command(sub, "tune", _cmd_tune, "tune every algorithm of a suite with the same Optuna budget",
                  "One study per (task, algorithm) of the suite's tuning: section (objective, trials, steps, tuning "
                  "seeds,\nsampler, pruner; docs/tuning.md); a killed tune resumes where it stopped. --out writes the "
                  "trial tables,\nthe chosen configurations (OUT/tuned, a suite's tuned: key), sensitivity figures "
                  "and index.md;\na run at them (bench --tuned OUT/tuned) records the file and values in its "
                  "config.yaml (recipe:),\nno part of its identity, and flowzoo report names its tuned cells. "
                  "--executor slurm runs the\nworkers as SLURM jobs on the shared --storage (docs/tuning.md).")
    tu.add_argument("suite", help="suite name (see `flowzoo list`) or path to a suite YAML with a tuning: section")
    tu.add_argument("--trials", type=at_most(MAX_REPEATS), default=None, metavar="N",
                    help="trials per cell instead of the suite's (the same for every cell)")
    tu.add_argument("--workers", type=int, default=1, metavar="N",
                    help="workers sharing the storage: processes here, or with a submitit executor, jobs")
    tu.add_argument("--executor", default="local", metavar="local|submitit-local|slurm",
                    help="local: the workers are processes here; slurm: one SLURM job per worker through submitit "
                         "(the largest of the cells' tasks' resources; requeued on preemption or timeout), waited "
                         "for, then --out is written here; submitit-local: the same jobs as processes here (needs "
                         "pip install -e '.[slurm]')")
    tu.add_argument("--cluster", default=None, metavar="FILE",
                    help="YAML of the scheduler's settings, as for bench (docs/harness.md)")
    tu.add_argument("--slurm-partition", default=None, metavar="NAME", help="SLURM partition (wins over --cluster's)")
    tu.add_argument("--storage", default=None, metavar="URL",
                    help="Optuna storage URL, passed to every worker as it is (default: "
                         "sqlite:///RUNS/<suite>/tuning/optuna.db); SQLite needs a file every worker sees: with "
                         "slurm, on a shared file system (one under /tmp is refused); for jobs on many nodes give a "
                         "server, e.g. postgresql://host/db")
    tu.add_argument("--runs", default="runs", metavar="DIR", help="directory of the trials' run directories")
    tu.add_argument("--tasks", default=None, metavar="T,T", help="comma-separated subset of the design's tasks")
    tu.add_argument("--algorithms", default=None, metavar="A,B", help="comma-separated subset of its algorithms")
    tu.add_argument("--out", default=None, metavar="DIR", help="write the tuning's tables, tuned configurations and "
                                                               "figures into DIR")
    tu.add_argument("--report", action="store_true", help="run no trial: only write --out from the storage")
    tu.add_argument("--from-trials", default=None, type=Path, metavar="DIR",
                    help="with --report: write --out from the trial tables of an earlier report DIR (DIR/trials, "
                         "e.g. a committed one whose storage is gone) instead of the storage; DIR may be --out")

    ls = _command(sub, "list", _cmd_list, "list registered algorithms, models, rewards, suites and claim sets",
                  "Each with a one-line description; `flowzoo list NAME` shows one entry's parameters and defaults.")
    ls.add_argument("name", nargs="?", default=None,
                    help="an algorithm, model, reward, prompt sampler, suite or claim set to show in full")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
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
