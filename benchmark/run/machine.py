"""The machine a run was made on, recorded in its done.json (``machine``): float results of the same code differ
across CPUs and library builds, and on a sparse reward a rounding difference can turn a trajectory (the tiny
rare-counting study's DiffusionNFT runs differ between an Intel Xeon and an AMD EPYC), so a page that gathers runs
made in several places can say which machine made each."""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux: the first ``model name`` of /proc/cpuinfo; elsewhere the platform's processor
    string, or the architecture)."""
    with contextlib.suppress(OSError):  # no /proc (macOS, Windows) or unreadable: the platform's string below
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def machine_record() -> dict:
    """CPU model, accelerator (the first CUDA device's name, or None), Python, torch and diffusers versions."""
    import torch

    try:
        import diffusers

        diffusers_version = diffusers.__version__
    except ImportError:
        diffusers_version = None
    accelerator = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "accelerator": accelerator, "python": platform.python_version(),
            "torch": torch.__version__, "diffusers": diffusers_version}
