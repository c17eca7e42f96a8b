"""Optional experiment trackers (TensorBoard, Weights & Biases, MLflow, ...) through accelerate's public tracking API:
``Accelerator(log_with=...)``, ``init_trackers``, ``log``.

``metrics.csv`` is always written; ``train.trackers: [tensorboard]`` additionally streams every metrics row to the
named trackers (main process only). A tracker whose package is not installed is refused at config load, before any
work. Local trackers write under ``<run_dir>/trackers/<task>/<algorithm>/s<seed>``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from flowzoo.errors import ConfigError


def known_trackers() -> list[str]:
    """The tracker names accelerate knows (``LoggerType``), less ``all``."""
    from accelerate.utils import LoggerType

    return [t.value for t in LoggerType if t.value != "all"]


def check_trackers(names: Sequence[str]) -> None:
    if not names:
        return
    from accelerate.tracking import get_available_trackers

    known, available = known_trackers(), [str(t) for t in get_available_trackers()]
    for name in names:
        if name not in known:
            raise ConfigError(f"unknown tracker {name!r}; known: {', '.join(sorted(known))}")
        if name not in available:
            raise ConfigError(f"tracker {name!r} is not installed (pip install {name}); installed trackers: "
                              f"{', '.join(available) or 'none'}")


class Trackers:
    """The run's trackers: configuration stored once, then one ``log`` per metrics row. Built on the main process
    only, after :func:`check_trackers` passed at config load."""

    def __init__(self, names: Sequence[str], run_name: str, run_dir: Path, config: dict[str, Any]):
        from accelerate import Accelerator

        self.accelerator = Accelerator(log_with=list(names), project_dir=str(run_dir / "trackers"))
        self.accelerator.init_trackers(run_name, config=config)

    def log(self, row: dict[str, Any], step: int) -> None:
        values = {k: float(v) for k, v in row.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v)) and k != "step"}
        self.accelerator.log(values, step=step)

    def finish(self) -> None:
        # not ``end_training()``: it also destroys the torch.distributed process group, which the runner owns
        for tracker in self.accelerator.trackers:
            tracker.finish()
