"""Pilot table: runs made while choosing a recipe, each named by how its config differs from a reference config.

    flowzoo pilot-table RUNS_DIR --reference CONFIG [--last K] [--csv FILE]

Every run directory under RUNS_DIR (config.yaml + metrics.csv, any depth) becomes one row: its **variant** (the
dotted keys where its run identity differs from the reference config's at the same seed, e.g.
``algorithm.lr=0.003``; ``(reference)`` when none do), its seed and steps, the evaluation at step 0 (``base``), the
mean of its last K evaluations (``final``) and their difference (``gain``), the mean training reward of its first and
last 20 steps, and the share of all-zero groups over its first 10 steps (``zero_spread_early``, where logged). A
second table gives each variant's mean, lowest and highest gain and how many of its seeds gained. Runs of a variant
need not share seeds; the table reports what ran and makes no interval (pilots are few seeds, chosen on exploration
seeds only; a study states its answers with intervals, ``benchmark.study.verdicts``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from flowzoo.benchmark.analysis.runs import find_run_dirs, read_metrics, read_run_keys
from flowzoo.benchmark.render.tables import markdown_table
from flowzoo.command_line import run_alias
from flowzoo.errors import ConfigError
from flowzoo.io import atomic_write_text
from flowzoo.schema import differing_keys

#: training steps averaged at each end of a run for the training-reward trend
TREND_STEPS = 20
#: first steps whose all-zero-group share is averaged
EARLY_STEPS = 10


def _identity(config: dict) -> dict:
    from flowzoo.benchmark.run.checkpoints import run_identity

    identity = run_identity(dict(config), set())
    identity.pop("seed", None)
    return identity


def _value(mapping: dict, dotted: str):
    for key in dotted.split("."):
        mapping = mapping.get(key) if isinstance(mapping, dict) else None
    return mapping


def variant_label(config: dict, reference: dict) -> str:
    """``key=value, ...`` for every dotted key where ``config`` computes something other than ``reference``."""
    ours, theirs = _identity(config), _identity(reference)
    keys = differing_keys(ours, theirs)
    return ", ".join(f"{key}={_value(ours, key)}" for key in keys) or "(reference)"


def pilot_rows(runs_dir: str | Path, reference: str | Path, last: int = 3) -> pd.DataFrame:
    """One row per run under ``runs_dir`` (module docstring)."""
    from flowzoo.benchmark.config.schema import resolved_dict
    from flowzoo.benchmark.run.run_source import load_run

    if last < 1:
        raise ConfigError(f"--last must be a positive number of evaluations, got {last}")
    runs = find_run_dirs(runs_dir)
    if not runs:
        raise ConfigError(f"no run directories (config.yaml + metrics.csv) under {str(runs_dir)!r}")
    rows, references = [], {}  # the reference resolved once per seed
    for run in runs:
        config, (_, _, seed, _) = read_run_keys(run)  # a damaged config.yaml: one line naming it
        if seed not in references:
            references[seed] = resolved_dict(load_run(str(reference), [f"seed={seed}"])[0])
        ref = references[seed]
        metrics = read_metrics(run / "metrics.csv")
        evals = metrics.dropna(subset=["eval_reward"]).sort_values("step")
        train = metrics.dropna(subset=["reward_mean"]) if "reward_mean" in metrics else metrics.iloc[:0]
        base = evals["eval_reward"].iloc[0] if len(evals) and evals["step"].iloc[0] == 0 else float("nan")
        final = evals["eval_reward"].iloc[1:].iloc[-last:].mean() if len(evals) > 1 else float("nan")
        zero = (metrics.loc[metrics["step"].between(1, EARLY_STEPS), "zero_std_frac"].mean()
                if "zero_std_frac" in metrics else float("nan"))
        rows.append({
            "variant": variant_label(config, ref),
            "seed": seed,
            "steps": int(metrics["step"].max()),
            "base": base,
            "final": final,
            "gain": final - base,
            "train_first": train["reward_mean"].iloc[:TREND_STEPS].mean(),
            "train_last": train["reward_mean"].iloc[-TREND_STEPS:].mean(),
            "zero_spread_early": zero,
            "s_per_step": metrics["wall_s"].max() / max(1, int(metrics["step"].max())),
            "run": run.relative_to(runs_dir).as_posix(),
        })
    return pd.DataFrame(rows).sort_values(["variant", "seed"], kind="stable").reset_index(drop=True)


def variant_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Each variant's seeds, mean / lowest / highest gain, seeds that gained, mean training-reward trend."""
    groups = rows.groupby("variant", sort=False)
    return pd.DataFrame({
        "seeds": groups["seed"].apply(lambda s: " ".join(str(v) for v in s)),
        "mean_gain": groups["gain"].mean(),
        "min_gain": groups["gain"].min(),
        "max_gain": groups["gain"].max(),
        "seeds_gaining": groups["gain"].apply(lambda g: f"{int((g > 0).sum())}/{len(g)}"),
        "train_first": groups["train_first"].mean(),
        "train_last": groups["train_last"].mean(),
        "zero_spread_early": groups["zero_spread_early"].mean(),
        "s_per_step": groups["s_per_step"].median(),
    }).reset_index()


def _markdown(frame: pd.DataFrame) -> str:
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    return "\n".join(markdown_table(list(frame.columns), cells))


DESCRIPTION = ("Every run under RUNS_DIR named by how its config differs from the reference (its variant), with its "
               "gain;\nthen each variant's mean, lowest and highest gain. Printed as two markdown tables.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo pilot-table``'s arguments."""
    parser.add_argument("runs_dir", help="directory searched for run directories")
    parser.add_argument("--reference", required=True, help="the config the variants are named against: a YAML file "
                        "or a suite's cell SUITE:TASK/ALGORITHM")
    parser.add_argument("--last", type=int, default=3, help="evaluations averaged for 'final'")
    parser.add_argument("--csv", help="also write the per-run rows to this CSV file")


def run(args: argparse.Namespace) -> int:
    """``flowzoo pilot-table``: the variants' table, then the runs'."""
    rows = pilot_rows(args.runs_dir, args.reference, args.last)
    print(_markdown(variant_summary(rows)))
    print()
    print(_markdown(rows.drop(columns="run")))
    if args.csv:
        atomic_write_text(args.csv, rows.to_csv(index=False, float_format="%.4f"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flowzoo.benchmark.render.pilot_table``: the older spelling of ``flowzoo pilot-table``."""
    return run_alias("flowzoo.benchmark.render.pilot_table", DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
