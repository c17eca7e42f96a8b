"""Is a committed report still what today's code computes? ``fingerprint.json`` and its check.

``flowzoo report`` writes ``fingerprint.json`` beside ``index.md``: for the lowest seed of every (task, algorithm)
cell, the run's stored config and its first ``STEPS`` training rows (``COLUMNS``: the base model's evaluation at step
0, then the rewards, loss and gradient norm of steps 1..STEPS). A report copied into the repository keeps it.

``flowzoo freshness REPORT_DIR --suite NAME`` then asks today's code two questions per cell:

* the recipe: the suite expanded today gives the cell's config; a difference from the stored one in what makes a run
  (its identity, :func:`benchmark.run.checkpoints.run_identity`) names the keys that changed;
* the numerics: the stored config rerun for ``STEPS`` steps in a temporary directory must give the stored rows (to
  ``RTOL``/``ATOL``: float rounding across machines, far below any change of a recipe or of the math).

A training row does not depend on ``train.steps`` (no schedule reads the run's length), so ``STEPS`` steps of a
400-step run are the first ``STEPS`` rows of that run. Exit status 1 when a cell is stale (each named, with why), 2
for bad input. On the toy tier a cell costs about a second: the quick report's 26 cells take well under a minute.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
from pathlib import Path


from flowzoo.benchmark.analysis.runs import find_run_dirs, read_metrics, read_run_keys
from flowzoo.command_line import run_alias
from flowzoo.errors import ConfigError, RunError
from flowzoo.io import atomic_write_text

FINGERPRINT_FILE = "fingerprint.json"
STEPS = 3
#: most steps a fingerprint may ask each cell to be rerun for (a damaged file's 10^9 would train for days)
MAX_STEPS = 100
COLUMNS = ("eval_reward", "reward_mean", "reward_std", "loss", "grad_norm")
RTOL, ATOL = 1e-4, 1e-6
#: the scale of the terms a column sums, where its value is a small difference of them: the policy loss is a mean of
#: -A ratio terms with advantages of unit spread and ratios near 1, so its terms are O(1) while the mean sits near 0;
#: rounding of the terms (1e-6 relative, another BLAS) moves it by ~1e-6-1e-5 absolute, ~1e-4 relative to the value
#: (a toy loss -0.0568984 rerun as -0.0568909 on another machine). Its tolerance is RTOL of the terms' scale, not of
#: the value; a changed recipe or kernel moves the losses and rewards by far more (tests/test_freshness.py)
TERM_SCALES = {"loss": 1.0}


def close(column: str, a: float, b: float) -> bool:
    """Whether a stored and a rerun value of ``column`` agree to float rounding (RTOL of the value, or of the scale of
    its terms for a column that cancels, ``TERM_SCALES``; at least ATOL)."""
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=max(ATOL, RTOL * TERM_SCALES.get(column, 0.0)))


def _rows(metrics, steps: int) -> list[dict]:
    rows = []
    for _, row in metrics[metrics["step"] <= steps].sort_values("step").iterrows():
        values = {c: float(row[c]) for c in COLUMNS if c in row.index and not math.isnan(float(row[c]))}
        if int(row["step"]) > 0:  # the evaluation at a run's last step is not a training row of a longer run
            values.pop("eval_reward", None)
        rows.append({"step": int(row["step"]), **values})
    return rows


def fingerprint_runs(runs_dir, steps: int = STEPS) -> dict:
    """The fingerprint of a runs directory: per (task, algorithm), its lowest seed's config and first rows."""
    cells: dict[str, dict] = {}
    for run_dir in find_run_dirs(runs_dir):
        try:  # the keys validated as the report reads them: a damaged config.yaml is left out, never a traceback
            config, (task, algorithm, seed, _) = read_run_keys(run_dir)
            metrics = read_metrics(run_dir / "metrics.csv")
        except (ConfigError, RunError):
            continue  # the report lists unreadable runs; a fingerprint holds only what can be rerun
        if metrics["step"].max() < steps:
            continue
        key = f"{task}/{algorithm}"
        if key in cells and cells[key]["seed"] <= seed:
            continue
        config = {k: v for k, v in config.items() if k != "run_dir"}
        cells[key] = {"seed": seed, "config": config, "rows": _rows(metrics, steps)}
    return {"steps": steps, "columns": list(COLUMNS), "cells": dict(sorted(cells.items()))}


def write_fingerprint(runs_dir, out_dir) -> Path:
    path = Path(out_dir) / FINGERPRINT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(fingerprint_runs(runs_dir), indent=1, sort_keys=True) + "\n")
    return path


def read_fingerprint(report_dir) -> dict:
    path = Path(report_dir) / FINGERPRINT_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no fingerprint (reports written by `flowzoo report` carry one; rewrite the "
                          f"report from its runs)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: not a readable fingerprint ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), dict) or not isinstance(data.get("steps"), int):
        raise ConfigError(f"{path}: not a fingerprint (needs steps and cells)")
    if isinstance(data["steps"], bool) or not 1 <= data["steps"] <= MAX_STEPS:  # each cell is rerun this many steps
        raise ConfigError(f"{path}: steps {data['steps']!r} is not in [1, {MAX_STEPS}] (flowzoo report writes {STEPS})")
    if not data["cells"]:  # "fresh" would then be said having compared nothing
        raise ConfigError(f"{path}: no cells to compare; rewrite the report from its runs")
    for key, cell in data["cells"].items():
        problem = _cell_problem(cell)
        if problem:
            raise ConfigError(f"{path}: cell {key!r}: {problem}; rewrite the report from its runs")
    return data


def _cell_problem(cell) -> str | None:
    """What makes a fingerprint cell unusable (a damaged or edited file), or None."""
    if not isinstance(cell, dict):
        return "not a mapping of seed, config and rows"
    if isinstance(cell.get("seed"), bool) or not isinstance(cell.get("seed"), int):
        return f"seed {cell.get('seed')!r} is not an integer"
    if not isinstance(cell.get("config"), dict):
        return "config is not a mapping"
    rows = cell.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("step"), int) for r in rows):
        return "rows are not a list of {step, values}"
    if not rows:
        return "no rows to compare"
    for row in rows:
        for column, value in row.items():
            if column != "step" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                     or not math.isfinite(value)):
                return f"step {row['step']} {column} is {value!r}, not a finite number"
    return None


def recipe_changes(cell: dict, today) -> list[str]:
    """Keys of the run's identity in which today's expansion of the suite (an ExperimentConfig, or None when the
    suite lost the cell) differs from the stored config."""
    from flowzoo.benchmark.run.suite import identity_differences

    if today is None:
        return ["(the suite no longer has this cell)"]
    return identity_differences(cell["config"], today)


def rerun_rows(cell: dict, steps: int, work_dir: Path) -> list[dict]:
    """The stored config rerun for ``steps`` steps by today's code: its first rows."""
    from flowzoo.benchmark.run.loading import build_config
    from flowzoo.benchmark.run.runner import Runner

    data = copy.deepcopy(cell["config"])
    data["train"] = {**(data.get("train") or {}), "steps": steps}
    data["run_dir"] = str(work_dir)
    Runner(build_config(data), progress=False).run()
    return _rows(read_metrics(work_dir / "metrics.csv"), steps)


def row_differences(stored: list[dict], now: list[dict]) -> list[str]:
    """``step 2 reward_mean 0.4810 -> 0.4795`` for every value outside its tolerance (:func:`close`; a missing value
    differs)."""
    out = []
    by_step = {r["step"]: r for r in now}
    for row in stored:
        other = by_step.get(row["step"], {})
        for column in sorted(set(row) | set(other) - {"step"}):
            if column == "step":
                continue
            a, b = row.get(column), other.get(column)
            if a is None or b is None or not close(column, a, b):
                fa = "missing" if a is None else f"{a:.6g}"
                fb = "missing" if b is None else f"{b:.6g}"
                out.append(f"step {row['step']} {column} {fa} -> {fb}")
    return out


def check_fresh(report_dir, suite_name: str, cells: list[str] | None = None, progress=print) -> dict[str, list[str]]:
    """Per fingerprinted cell, why it is stale (empty list: fresh). ``cells``: a subset of ``task/algorithm``."""
    from flowzoo.benchmark.run.suite import expand, load_suite

    fingerprint = read_fingerprint(report_dir)
    known = fingerprint["cells"]
    wanted = list(known) if cells is None else cells
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise ConfigError(f"--cells {unknown[0]}: not in {Path(report_dir) / FINGERPRINT_FILE}; cells: "
                          f"{', '.join(known)}")
    suite = load_suite(suite_name)
    with tempfile.TemporaryDirectory(prefix="flowzoo-fresh-") as tmp:
        today = {}
        for config in expand(suite, Path(tmp) / "expanded"):
            key = f"{config.task}/{config.algorithm_name}"
            if key in known and config.seed == known[key]["seed"]:
                today[key] = config
        verdicts = {}
        for i, key in enumerate(wanted, 1):
            cell = known[key]
            why = [f"recipe: {k}" for k in recipe_changes(cell, today.get(key))]
            why += row_differences(cell["rows"], rerun_rows(cell, fingerprint["steps"], Path(tmp) / f"cell{i}"))
            verdicts[key] = why
            progress(f"[{i}/{len(wanted)}] {key}: " + ("fresh" if not why else "STALE: " + "; ".join(why[:4])))
    return verdicts


DESCRIPTION = ("Rerun the first steps of every cell of a report's fingerprint.json with today's code and recipe; "
               "exit 1 when a cell differs (the report is stale: regenerate it).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo freshness``'s arguments."""
    parser.add_argument("report", help="a report directory holding fingerprint.json (e.g. reports/example-quick)")
    parser.add_argument("--suite", required=True, help="the suite whose runs made the report (e.g. quick)")
    parser.add_argument("--cells", default=None, help="comma-separated task/algorithm subset (default: every cell)")


def run(args: argparse.Namespace) -> int:
    """``flowzoo freshness``: one line per cell, then the report's; exit 1 when a cell is stale."""
    cells = [c.strip() for c in args.cells.split(",") if c.strip()] if args.cells else None
    verdicts = check_fresh(args.report, args.suite, cells)
    stale = [k for k, why in verdicts.items() if why]
    print(f"{args.report}: {len(verdicts) - len(stale)} of {len(verdicts)} cells fresh"
          + (f"; stale: {', '.join(stale)} (regenerate the report from new runs)" if stale else ""))
    return 1 if stale else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flowzoo.benchmark.render.freshness``: the older spelling of ``flowzoo freshness``."""
    return run_alias("flowzoo.benchmark.render.freshness", DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
