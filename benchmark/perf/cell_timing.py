"""Per-step training cost of a suite's cells, measured interleaved in one process (for wall-clock-to-target).

    flowzoo time-cells SUITE --cells TASK/ALGORITHM,... --out FILE.csv [--steps 60] [--repeats 5]

A study's runs are spread over worker processes on a shared machine, so the ``wall_s`` they log moves with the load
of the moment (it varied ~6x over the OP-GRPO study's grid). Wall-clock-to-target is therefore estimated as
``steps to target x seconds per training step``, where the seconds per step of every cell are measured here: each
repeat trains every cell (seed 0 of the suite's config, ``--steps`` steps, no evaluation after step 0, no
checkpoints, written into a scratch directory) one after the other in this process, in an order rotated by the
repeat, and records the run's logged training wall time (``wall_s``, which excludes evaluation) divided by its steps.
Cells of one repeat share the machine's load of that moment, so the per-repeat **ratio** of a cell's cost to the
reference cell's (the first of ``--cells``) is the figure to use; :mod:`benchmark.study.verdicts` combines it with the
steps-to-target ratio. Cell names are ``TASK/ALGORITHM`` as in the suite's run directories (a control cell is
``toy2d_sep64_sparse@no_reuse/op_grpo``).

Output: one row per (repeat, cell): ``repeat, cell, task, algorithm, steps, wall_s, s_per_step, ratio`` (``ratio``:
this cell's ``s_per_step`` / the reference's in the same repeat).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from flowzoo.benchmark.run.runner import train
from flowzoo.benchmark.run.suite import expand, first_seed_only, load_suite
from flowzoo.command_line import run_alias
from flowzoo.errors import ConfigError
from flowzoo.io import atomic_write


def cell_configs(suite_name: str, cells: list[str], steps: int, runs_dir: Path) -> dict:
    """``{cell: ExperimentConfig}`` for seed 0 (or the suite's first seed) of each ``TASK/ALGORITHM`` cell."""
    if steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    suite = first_seed_only(load_suite(suite_name))
    overrides = [f"train.steps={steps}", f"train.eval_every={steps}", f"train.checkpoint_every={steps}",
                 "train.eval_samples_per_prompt=1", "train.save_samples=false", "train.gold=null"]
    every = {f"{c.task}/{c.algorithm_name}": c for c in expand(suite, runs_dir, overrides)}
    configs = {cell: every[cell] for cell in cells if cell in every}
    missing = [cell for cell in cells if cell not in configs]
    if missing:
        known = sorted(every)
        raise ConfigError(f"--cells {','.join(missing)}: not in suite {suite.name}; cells: {', '.join(known)}")
    return configs


def measure(suite_name: str, cells: list[str], steps: int = 60, repeats: int = 5) -> pd.DataFrame:
    """Interleaved per-step cost of ``cells`` (the first is the reference of ``ratio``)."""
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="flowzoo-timing-") as scratch:
        for repeat in range(repeats):
            # a fresh directory per repeat: every run starts from step 0 (nothing to resume)
            configs = cell_configs(suite_name, cells, steps, Path(scratch) / f"r{repeat}")
            order = cells[repeat % len(cells):] + cells[:repeat % len(cells)]
            costs = {}
            for cell in order:
                run_dir = train(configs[cell], progress=False)
                wall_s = float(pd.read_csv(run_dir / "metrics.csv")["wall_s"].max())
                costs[cell] = wall_s
                print(f"repeat {repeat + 1}/{repeats} {cell}: {wall_s / steps * 1e3:.1f} ms/step", file=sys.stderr)
            for cell in cells:
                task, algorithm = cell.split("/", 1)
                rows.append({"repeat": repeat, "cell": cell, "task": task, "algorithm": algorithm, "steps": steps,
                             "wall_s": costs[cell], "s_per_step": costs[cell] / steps,
                             "ratio": costs[cell] / costs[cells[0]]})
    return pd.DataFrame(rows)


DESCRIPTION = ("Each repeat trains every cell (seed 0 of the suite's config, --steps steps, no evaluation after "
               "step 0,\nno checkpoints, in a scratch directory) one after the other in this process, in an order "
               "rotated by the\nrepeat; one CSV row per (repeat, cell) with its seconds per step and its ratio to "
               "the first cell's.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo time-cells``'s arguments."""
    parser.add_argument("suite", help="suite name or YAML path")
    parser.add_argument("--cells", required=True, help="comma-separated TASK/ALGORITHM cells; the first is the "
                        "reference of the ratios")
    parser.add_argument("--out", required=True, help="CSV file to write")
    parser.add_argument("--steps", type=int, default=60, help="training steps per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds over all cells")


def run(args: argparse.Namespace) -> int:
    """``flowzoo time-cells``: the CSV, and each cell's median cost ratio printed."""
    cells = [cell.strip() for cell in args.cells.split(",") if cell.strip()]
    if not cells or any("/" not in cell for cell in cells):
        raise ConfigError(f"--cells must be TASK/ALGORITHM names, got {args.cells!r}")
    table = measure(args.suite, cells, args.steps, args.repeats)
    out = Path(args.out)
    atomic_write(out, lambda f: table.to_csv(f, index=False))  # whole or not at all; a full disk names it
    summary = table.groupby("cell", sort=False)["ratio"].median()
    for cell, ratio in summary.items():
        print(f"{cell}: median cost ratio {ratio:.3f}")
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flowzoo.benchmark.perf.cell_timing``: the older spelling of ``flowzoo time-cells``."""
    return run_alias("flowzoo.benchmark.perf.cell_timing", DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
