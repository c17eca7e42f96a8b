"""The ``flowzoo`` command line (also ``python -m benchmark``).

    flowzoo train CONFIG [key=value ...]     one run
    flowzoo bench SUITE [--runs DIR] [--workers N] [key=value ...]
    flowzoo report RUNS_DIR --out DIR
    flowzoo list
    flowzoo export RUN_DIR --out DIR          a run's LoRA for diffusers' load_lora_weights
    flowzoo pretrain tiny --data shapes|glyphs [--minutes M] [--steps N] ...
    flowzoo grad-snr CONFIG [--batches K] [--fixed-prompts] [key=value ...]
    flowzoo recipes [--out docs/recipes.md]    the table of every algorithm's recipe values and sources
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flowzoo.errors import FlowZooError


def _cmd_train(args: argparse.Namespace) -> int:
    from algorithms.distributed import process_group
    from benchmark.config import load_config
    from benchmark.runner import train

    config = load_config(args.config, args.overrides)
    with process_group() as dist:  # under a launcher: joined here, left cleanly (or at once on failure) below
        try:
            run_dir = train(config, progress=not args.quiet, dist=dist)
        except BaseException as error:
            if dist.world_size > 1:
                _end_failed_rank(dist.describe(), error)
            raise
    if dist.is_main:  # once under a multi-process launch
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


def _cmd_bench(args: argparse.Namespace) -> int:
    from benchmark.suite import load_suite, run_suite, select

    suite = select(load_suite(args.suite), args.algorithms, args.seeds)
    failures = run_suite(suite, Path(args.runs), args.workers, args.overrides, args.budget_minutes)
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    if args.report:
        from benchmark.report import write_report

        out = write_report(Path(args.runs) / suite.name, Path(args.report))
        print(f"report written to {out}")
    return 1 if failures else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from benchmark.report import write_report

    from benchmark.stats import parse_target

    target = parse_target(args.target) if args.target else None
    out = write_report(Path(args.runs_dir), Path(args.out), baseline=args.baseline, target=target)
    print(f"report written to {out}")
    return 0


def pretrain_command(args: argparse.Namespace) -> str:
    """The pretrain command with every option spelled out (what the weights' record stores)."""
    options = ["data", "steps", "minutes", "batch", "lr", "ema", "seed", "threads", "out", "run_dir"]
    words = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in options if getattr(args, name) is not None]
    return " ".join(["flowzoo pretrain", args.model, *words])


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from models.tiny_pretrain import pretrain

    out = pretrain(
        args.data, out=args.out, run_dir=args.run_dir, steps=args.steps, minutes=args.minutes, batch=args.batch,
        lr=args.lr, ema=args.ema, seed=args.seed, threads=args.threads, progress=not args.quiet,
        command=pretrain_command(args),
    )
    print(f"weights written to {out}")
    return 0


def _cmd_grad_snr(args: argparse.Namespace) -> int:
    from benchmark.config import load_config
    from benchmark.grad_snr import measure

    result = measure(load_config(args.config, args.overrides), args.batches, args.fixed_prompts, not args.quiet)
    print(result.line())
    return 0


def _cmd_recipes(args: argparse.Namespace) -> int:
    from benchmark.recipes import recipe_table

    table = recipe_table()
    if args.out:
        Path(args.out).write_text(table)
        print(f"recipes written to {args.out}")
    else:
        print(table, end="")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from benchmark.export import export

    out = export(Path(args.run_dir), Path(args.out))
    print(f"LoRA written to {out}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    import algorithms
    import models
    import rewards
    from benchmark.suite import suite_names

    for title, names in (
        ("algorithms", algorithms.names()),
        ("models", models.names()),
        ("rewards", rewards.names()),
        ("suites", suite_names()),
    ):
        print(f"{title}: {', '.join(names)}")
    return 0


def _cmd_perf(args) -> int:
    import yaml

    from benchmark import perf

    overrides = {}
    for item in args.overrides:
        key, _, value = item.partition("=")
        overrides[key.removeprefix("algorithm.")] = yaml.safe_load(value)
    if args.repeats < 1:
        raise FlowZooError(f"--repeats {args.repeats} must be >= 1")
    model = perf.load_model(args.model_path, args.device, args.lora_rank)
    result = perf.run(model, overrides, repeats=args.repeats, prompts_per_step=args.prompts, device=args.device)
    print(perf.format_result(result, args.device))
    if not result["grad_rel_diff"] < 1e-5:
        print(f"flowzoo: error: gradients differ by {result['grad_rel_diff']:.2e} (> 1e-5)", file=sys.stderr)
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowzoo", description="FlowZoo: RL post-training benchmarks for flow models")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one run from a config file")
    t.add_argument("config", help="YAML config (see benchmark/configs/)")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.steps=10 algorithm.lr=1e-3")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=_cmd_train)

    b = sub.add_parser("bench", help="run a suite (grid of algorithm x task x seed)")
    b.add_argument("suite", help="suite name (see `flowzoo list`) or path to a suite YAML")
    b.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    b.add_argument("--runs", default="runs", help="directory of run directories (default: runs)")
    b.add_argument("--workers", type=int, default=None, help="parallel runs (default: number of CPUs)")
    b.add_argument("--algorithms", default=None, help="comma-separated subset of the suite's algorithms")
    b.add_argument("--seeds", default=None, help="comma-separated seeds instead of the suite's")
    b.add_argument("--budget-minutes", type=float, default=None, help="start no run after this many minutes")
    b.add_argument("--report", default=None, metavar="DIR", help="write the report into DIR when done")
    b.set_defaults(func=_cmd_bench)

    r = sub.add_parser("report", help="write tables and figures from a directory of runs")
    r.add_argument("runs_dir")
    r.add_argument("--out", required=True)
    r.add_argument("--baseline", default="flow_grpo", help="the algorithm others are compared against")
    r.add_argument("--target", default=None,
                   help="reward target: '0.9gain' or '90%%gain' of the way from the base model to the baseline's "
                        "final reward (default 0.9gain), '0.9x' or '90%%' of the baseline's final reward, or an "
                        "absolute value '0.8'")
    r.set_defaults(func=_cmd_report)

    pt = sub.add_parser("pretrain", help="pretrain the tiny tier on synthetic data (resumable)")
    pt.add_argument("model", choices=["tiny"])
    pt.add_argument("--data", choices=["shapes", "glyphs"], default="shapes")
    pt.add_argument("--steps", type=int, default=100_000, help="stop after this many optimizer steps")
    pt.add_argument("--minutes", type=float, default=None, help="stop after this much training wall time")
    pt.add_argument("--batch", type=int, default=32)
    pt.add_argument("--lr", type=float, default=5e-4)
    pt.add_argument("--ema", type=float, default=0.998, help="decay of the parameter average that is shipped")
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--threads", type=int, default=2, help="torch threads")
    pt.add_argument("--out", default=None,
                    help="weights file (default: <run-dir>/tiny_<data>.safetensors; the shipped "
                         "models/weights/tiny_<data>.safetensors is replaced only when named here)")
    pt.add_argument("--run-dir", default=None, help="checkpoint directory (default: runs/pretrain_tiny_<data>)")
    pt.add_argument("--quiet", action="store_true", help="no progress bar")
    pt.set_defaults(func=_cmd_pretrain)

    g = sub.add_parser("grad-snr", help="gradient signal-to-noise of a config's training step at its start weights")
    g.add_argument("config", help="YAML config (see benchmark/configs/)")
    g.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.prompts_per_step=16")
    g.add_argument("--batches", type=int, default=16, help="independent batches to compare (default: 16)")
    g.add_argument("--fixed-prompts", action="store_true", help="the same prompts in every batch (only noise varies)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.set_defaults(func=_cmd_grad_snr)

    pf = sub.add_parser("perf", help="time one Flow-GRPO iteration of ours against the released-style loop")
    pf.add_argument("overrides", nargs="*", help="algorithm key=value overrides, e.g. reuse_rollout_graph=true")
    pf.add_argument("--model-path", default=None, help="SD3 diffusers directory (default: a tiny random pipeline)")
    pf.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    pf.add_argument("--lora-rank", type=int, default=32, help="LoRA rank (default: 32, the released recipe)")
    pf.add_argument("--repeats", type=int, default=5, help="interleaved repetitions per variant (default: 5)")
    pf.add_argument("--prompts", type=int, default=1, help="prompts per iteration, group_size samples each")
    pf.set_defaults(func=_cmd_perf)

    rc = sub.add_parser("recipes", help="the table of every algorithm's recipe values with their sources")
    rc.add_argument("--out", default=None, help="write the markdown here (e.g. docs/recipes.md) instead of printing it")
    rc.set_defaults(func=_cmd_recipes)

    ex = sub.add_parser("export", help="write a run's trained LoRA in diffusers' format (load_lora_weights)")
    ex.add_argument("run_dir", help="run directory of an sd3, wan or tiny run (its config.yaml and checkpoint.pt)")
    ex.add_argument("--out", required=True, help="directory for pytorch_lora_weights.safetensors and README.md")
    ex.set_defaults(func=_cmd_export)

    ls = sub.add_parser("list", help="list registered algorithms, models, rewards and suites")
    ls.set_defaults(func=_cmd_list)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    # overrides may come after options (`train c.yaml --quiet train.steps=3`): collect the leftover key=value words
    args, extra = p.parse_known_args(argv)
    stray = [e for e in extra if e.startswith("-") or "=" not in e or not hasattr(args, "overrides")]
    if stray:
        p.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("flowzoo: interrupted; rerun the same command to resume from the last checkpoint", file=sys.stderr)
        return 130
    except Exception as e:
        message = user_error(e)
        if message is None:  # a bug: its traceback, exit 1
            raise
        print(f"flowzoo: error: {message}", file=sys.stderr)
        return 2


def user_error(error: BaseException) -> str | None:
    """The one line (exit 2) for an error the user can act on: a FlowZooError, an OS error naming its path (read-only
    or full disk, a file where a directory should be), running out of memory; None for anything else (a bug)."""
    if isinstance(error, FlowZooError):
        return str(error)
    if isinstance(error, OSError) and error.filename is not None:
        path = f"{error.filename} -> {error.filename2}" if error.filename2 else error.filename
        return f"{path}: {error.strerror or error}"
    if (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"
            or (isinstance(error, RuntimeError) and "can't allocate memory" in str(error))):
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        return (f"out of memory ({detail}); lower train.prompts_per_step, algorithm.group_size, algorithm.micro_batch "
                f"or train.eval_batch")
    return None


if __name__ == "__main__":
    sys.exit(main())
