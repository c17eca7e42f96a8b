"""Optional experiment trackers (TensorBoard, Weights & Biases, MLflow, ...) through accelerate's tracker classes.

``metrics.csv`` is always written; ``train.trackers: [tensorboard]`` additionally streams every metrics row to the
named trackers (main process only). A tracker whose package is not installed is refused before any work.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any, Sequence

from flowzoo.errors import ConfigError


def _registry() -> tuple[dict[str, type], list[str]]:
    from accelerate import tracking

    return tracking.LOGGER_TYPE_TO_CLASS, [str(t) for t in tracking.get_available_trackers()]


def check_trackers(names: Sequence[str]) -> None:
    if not names:
        return
    classes, available = _registry()
    for name in names:
        if name not in classes:
            raise ConfigError(f"unknown tracker {name!r}; known: {', '.join(sorted(classes))}")
        if name not in available:
            raise ConfigError(f"tracker {name!r} is not installed (pip install {name}); installed trackers: "
                              f"{', '.join(available) or 'none'}")


class Trackers:
    """The run's trackers: configuration stored once, then one ``log`` per metrics row."""

    def __init__(self, names: Sequence[str], run_name: str, run_dir: Path, config: dict[str, Any]):
        check_trackers(names)
        classes, _ = _registry()
        self.trackers = []
        for name in names:
            cls = classes[name]
            params = inspect.signature(cls.__init__).parameters
            kwargs = {"logging_dir": str(run_dir / "trackers")} if "logging_dir" in params else {}
            tracker = cls(run_name, **kwargs)
            if hasattr(tracker, "start"):
                tracker.start()
            tracker.store_init_configuration(config)
            self.trackers.append(tracker)

    def log(self, row: dict[str, Any], step: int) -> None:
        values = {k: float(v) for k, v in row.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v)) and k != "step"}
        for tracker in self.trackers:
            tracker.log(values, step=step)

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
