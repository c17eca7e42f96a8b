"""``flowzoo memory SUITE``: the per-GPU memory estimate (benchmark/run/memory.py) of every cell of a suite,
by parts, and whether it fits a device. Cells are resolved as ``flowzoo bench`` resolves them (the released recipe
under the suite's keys), without reading their prompt files or loading any weight."""

from __future__ import annotations

from dataclasses import dataclass

from flowzoo.benchmark.config.schema import ExperimentConfig
from flowzoo.benchmark.run.memory import (
    H100_80GB_GIB, RESERVE_GIB, Estimate, RunShape, estimate, fits, knobs, run_shape,
)
from flowzoo.benchmark.config.resolve import Layers, resolve
from flowzoo.benchmark.run.suite import Suite, cell_keys, cells
from flowzoo.errors import ConfigError
from flowzoo.markdown import markdown_table
from flowzoo.schema import from_mapping

#: the GPUs a suite's estimate assumes when it states none (``released_gpus``): one process
DEFAULT_GPUS = 1
#: the parts the table prints, in order (``Estimate.parts``' names)
COLUMNS = ("transformer", "text encoders", "VAE", "trainable state", "FSDP gather", "batch", "kept graphs",
           "rollout", "decode", "update")


@dataclass(frozen=True)
class CellEstimate:
    cell: str  # task/algorithm
    shape: RunShape
    estimate: Estimate


def cell_config(suite: Suite, task: str, alg: str, overrides: tuple[str, ...] = ()) -> ExperimentConfig:
    """Cell (task, alg) of the suite as a typed config, resolved as bench resolves it (its first seed)."""
    keys = cell_keys(suite, task, alg)
    data = {**keys.data, "task": task, "seed": suite.seeds[0] if suite.seeds else 0}
    resolved = resolve(data, alg, Layers(keys.shared, keys.own, keys.pinned, None, tuple(overrides)))
    config = from_mapping(ExperimentConfig, resolved.data)
    config.resolve_algorithm()
    return config


def suite_gpus(suite: Suite) -> int:
    """The GPU count a suite's recipes were released on (its ``released_gpus``), else :data:`DEFAULT_GPUS`."""
    return suite.released_gpus or DEFAULT_GPUS


def suite_estimates(suite: Suite, gpus: int | None = None, overrides: tuple[str, ...] = ()) -> list[CellEstimate]:
    """The estimate of every cell of ``suite`` at ``gpus`` processes (default: :func:`suite_gpus`)."""
    gpus = suite_gpus(suite) if gpus is None else gpus
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: give at least 1")
    out = []
    for task, alg in cells(suite):
        shape = run_shape(cell_config(suite, task, alg, overrides), gpus)
        out.append(CellEstimate(f"{task}/{alg}", shape, estimate(shape)))
    return out


def table(rows: list[CellEstimate], budget_gib: float) -> str:
    """A markdown table: per cell its samples per GPU, rows per call, every part, the total and whether it fits."""
    head = ["cell", "samples/GPU", "rollout/update rows", *COLUMNS, "total", f"fits {budget_gib:.1f}"]
    body = []
    for row in rows:
        est, shape = row.estimate, row.shape
        parts = est.parts()
        cells_ = [f"{parts[name]:.1f}" if parts[name] else "-" for name in COLUMNS]
        peak = COLUMNS.index(est.peak_phase)
        cells_[peak] = f"**{cells_[peak]}**"  # the phase that sets the peak
        verdict = "yes" if fits(est, budget_gib) else "NO: " + "; or ".join(knobs(shape, est)[:2])
        body.append([row.cell, shape.samples, f"{shape.rollout_rows}/{shape.update_rows}", *cells_,
                      f"{est.total:.1f}", verdict])
    return "\n".join(markdown_table(head, body))


def report(suite: Suite, gpus: int | None = None, budget_gib: float = H100_80GB_GIB,
           overrides: tuple[str, ...] = ()) -> tuple[str, bool]:
    """(the printed text, whether every cell fits) of ``flowzoo memory``."""
    gpus = suite_gpus(suite) if gpus is None else gpus
    rows = suite_estimates(suite, gpus, overrides)
    sharded = any(row.shape.fsdp for row in rows)
    header = (f"suite {suite.name}: per-GPU memory estimate (GiB) at {gpus} GPU(s), one process each"
              f"{' (FSDP-sharded transformer)' if sharded else ''}; a cell fits when its total + {RESERVE_GIB:g} GiB "
              f"reserve <= {budget_gib:.1f} GiB. Parts held through the iteration, then the peak call of each "
              f"phase (bold: the largest, the one the total counts)")
    return header + "\n" + table(rows, budget_gib), all(fits(row.estimate, budget_gib) for row in rows)
