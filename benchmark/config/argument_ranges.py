"""Range checks of the model and reward arguments a config passes through ``model.args`` and ``reward_args``.

``benchmark.run.experiment.check`` (the dry run of every loaded config) checks each argument's type against its
constructor's annotation; this module adds the value ranges (sizes >= 1, probabilities and fractions in their
intervals, scales > 0) and the devices, so that a bad value is one line naming ``model.args.<name>`` before any
model is built, never a torch error from inside the network (``hidden: -5``, ``layers: 0``) or a network of width 0
that trains without complaint.

A model adapter declares its arguments' ranges on its class as ``argument_ranges = {"name": Range(...)}``
(``flowzoo.ranges``), so adding one stays one file; the rewards' are in :data:`RANGES`, and a reward class may declare
its own the same way (they take precedence).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from flowzoo.errors import ConfigError
from flowzoo.labels import check_path_text
from flowzoo.ranges import AT_LEAST_1, FRACTION, NON_NEGATIVE, POSITIVE, Range  # noqa: F401 (the ranges' home)

#: (kind, registered name) -> {argument: a range, or a function(value, where) raising ConfigError}, for classes that
#: declare none of their own (the rewards below; every model adapter declares its ``argument_ranges``)
RANGES: dict[tuple[str, str], dict[str, Range | Callable[[Any, str], None]]] = {
    ("reward", "ocr"): {"upscale": AT_LEAST_1, "pad": NON_NEGATIVE},
    ("reward", "video_ocr"): {"frame_stride": AT_LEAST_1},
    ("reward", "shapes_geneval"): {"color_tolerance": POSITIVE, "min_area": FRACTION,
                                   "max_extent": Range(0, 1, low_open=True), "max_aspect": Range(1)},
    ("reward", "imagereward"): {"max_length": AT_LEAST_1},
    # a server's wait is bounded: at most (retries + 1) x timeout plus the back-off waits (retry_wait_s doubling), so
    # an unbounded count or wait (retries 10^6: days of doubling back-off) is refused, not waited out
    ("reward", "unifiedreward"): {"timeout": Range(0, 3600, low_open=True), "retries": Range(0, 10),
                                  "retry_wait_s": Range(0, 600), "max_score": POSITIVE, "max_concurrency": AT_LEAST_1,
                                  "max_tokens": AT_LEAST_1, "max_response_bytes": AT_LEAST_1,
                                  "edit_weight": NON_NEGATIVE, "preserve_weight": NON_NEGATIVE},
}

#: arguments that name a file or directory: plain path text (no control characters)
PATH_ARGUMENTS = ("path", "head_path", "weights")


def check_device(value: Any, where: str) -> None:
    """``value`` names a torch device this build and machine have (None: the adapter's automatic choice)."""
    import torch

    if value is None:
        return
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{where}: {value!r} is not a torch device; valid: cpu, cuda, cuda:N, mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(f"{where}: {value!r} asks for CUDA, which torch {torch.__version__} ({build}) cannot "
                              f"use here; valid: cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{where}: {value!r}, but this machine has {count} CUDA device(s); valid: cuda:0 .. "
                              f"cuda:{count - 1}, cpu")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{where}: {value!r}, but MPS is not available here; valid: cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{where}: device type {device.type!r} is not supported; valid: cpu, cuda, cuda:N, mps")


def check_ranges(kind: str, name: str, cls: type, kwargs: Mapping[str, Any], where: str) -> None:
    """The ranges of ``kwargs`` (module docstring) for the ``kind`` ("model"/"reward") registered as ``name``."""
    ranges = {**RANGES.get((kind, name), {}), **getattr(cls, "argument_ranges", {})}
    for key, value in kwargs.items():
        if key == "device":
            check_device(value, f"{where}.device")
        elif key in PATH_ARGUMENTS and isinstance(value, str) and value not in ("", "auto"):
            check_path_text(value, f"{where}.{key}")
        bound = ranges.get(key)
        if callable(bound):
            bound(value, f"{where}.{key}")
            continue
        if bound is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # types are checked against the annotations (flowzoo.schema.check_arguments)
        if not (math.isfinite(value) and value in bound):
            raise ConfigError(f"{where}.{key} must be {bound}, got {value!r}")
