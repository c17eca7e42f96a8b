"""``flowzoo train``: one run from a config file or one cell of a suite, and the ``--no-memory-check`` option it
shares with ``flowzoo bench``."""

from __future__ import annotations

import argparse
import os
import sys

from flowzoo.errors import user_error

DESCRIPTION = ("The run goes to the config's run_dir (default runs/<task>/<algorithm>/s<seed>; a suite's cell: "
               "runs/<suite>/<task>/<algorithm>/s<seed>,\nas bench places it); a finished run is kept, a killed one "
               "resumes from its last checkpoint. Bad configs fail\nbefore anything is written. The algorithm's "
               "released recipe (benchmark/recipes, docs/recipes.md) sits under\nthe config's own algorithm "
               "keys; the first line says which values it set (use_recipe=false: none).")


def add_memory_check_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--no-memory-check`` of the commands that launch runs (train, bench)."""
    parser.add_argument("--no-memory-check", action="store_true",
                        help=f"{what} even where the per-GPU memory estimate exceeds the GPU's memory (`flowzoo "
                             "memory`; same as FLOWZOO_NO_MEMORY_CHECK=1)")


def apply_memory_check_option(args: argparse.Namespace) -> None:
    """``--no-memory-check``: the launch's memory check is skipped here and in the runs it starts (their
    environment)."""
    from flowzoo.benchmark.run.memory import BYPASS_ENV

    if getattr(args, "no_memory_check", False):
        os.environ[BYPASS_ENV] = "1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="YAML config (see benchmark/configs/), or a suite's cell "
                        "SUITE:TASK/ALGORITHM (e.g. tiny-rare-counting-study:tiny_counting_rare/flow_grpo), resolved "
                        "as bench resolves it")
    parser.add_argument("overrides", nargs="*", default=[],
                        help="key=value overrides, e.g. train.steps=10 algorithm.lr=1e-3")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_memory_check_option(parser, "launch")


def run(args: argparse.Namespace) -> int:
    from flowzoo.algorithms.engine.distributed import process_group
    from flowzoo.benchmark.run.run_source import load_run
    from flowzoo.benchmark.run.runner import holds_other_config, is_finished, train
    from flowzoo.benchmark.run.suite import describe_differences
    from flowzoo.errors import ConfigError

    apply_memory_check_option(args)
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
