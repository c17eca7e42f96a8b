"""Where reward weights come from (a constructor ``path`` or an environment variable), and image conversion.

Model hubs are never contacted: every learned reward loads from a local directory or file. A missing one raises
:class:`ConfigError` in one line naming the path and the environment variable that could supply it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from flowzoo.errors import ConfigError


def local_weights(reward: str, path: str | os.PathLike | None, env_var: str, kind: str = "directory") -> Path:
    """``path`` if given, else ``$env_var``; it must be an existing directory (or file when ``kind="file"``)."""
    source = "path" if path is not None else env_var
    chosen = path if path is not None else os.environ.get(env_var)
    if not chosen:
        raise ConfigError(
            f"{reward} reward: no weights {kind} given; pass path=... in its reward args or set {env_var}"
        )
    resolved = Path(chosen).expanduser()
    exists = resolved.is_dir() if kind == "directory" else resolved.is_file()
    if not exists:
        raise ConfigError(
            f"{reward} reward: weights {kind} {str(resolved)!r} (from {source}) does not exist; "
            f"pass an existing {kind} as path=... or set {env_var}"
        )
    return resolved


def to_pil_images(samples: torch.Tensor, reward: str) -> list[Any]:
    """RGB images [B, 3, H, W] in [0, 1] -> PIL images, the input the reward models' processors were made for."""
    from PIL import Image

    if samples.ndim != 4 or samples.shape[1] != 3:
        raise ValueError(f"{reward} reward: expected RGB images [B, 3, H, W], got shape {tuple(samples.shape)}")
    pixels = (samples.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(array) for array in pixels]


def projected_features(output: Any) -> torch.Tensor:
    """``CLIPModel.get_*_features`` returns a tensor before transformers 5 and a ModelOutput (pooler_output) after."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output
