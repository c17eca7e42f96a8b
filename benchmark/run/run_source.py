"""What a one-run command (``flowzoo train``, ``eval``, ``grad-snr``) trains: a config file, or one cell of a suite
named ``SUITE:TASK/ALGORITHM``; both resolved by :mod:`benchmark.config.resolve`, so a cell trained alone is the
run ``flowzoo bench`` makes of it."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from flowzoo.benchmark.config.schema import ExperimentConfig
from flowzoo.benchmark.run.loading import load_resolved
from flowzoo.benchmark.config.resolve import Resolved
from flowzoo.benchmark.run.suite import cell_run, parse_cell_ref


def load_run(target: str | Path | None, overrides: Sequence[str] = ()) -> tuple[ExperimentConfig, Resolved]:
    """The run ``target`` names (a config file path or ``SUITE:TASK/ALGORITHM``) with ``key=value`` overrides."""
    if target is not None and parse_cell_ref(str(target)) is not None:
        return cell_run(str(target), list(overrides))
    return load_resolved(target, overrides)
