"""The MLP score head shared by the LAION aesthetic predictor v2 and ImageReward.

Both use the same layout (``improved-aesthetic-predictor/simple_inference.py``; ImageReward's ``MLP`` class):
Linear(d, 1024) - Dropout(0.2) - Linear(1024, 128) - Dropout(0.2) - Linear(128, 64) - Dropout(0.1) - Linear(64, 16) -
Linear(16, 1), with no activations. Module names match the released state dicts (``layers.0.weight``, ...), so the
released files load without renaming; ImageReward's ``mlp.`` prefix is stripped.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from flowzoo.errors import ConfigError


class ScoreHead(nn.Module):
    def __init__(self, input_dim: int):
        super().__init__()
        self.input_dim = input_dim
        self.layers = nn.Sequential(
            nn.Linear(input_dim, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features).squeeze(-1)


def load_score_head(file: Path, input_dim: int, reward: str) -> ScoreHead:
    """A ScoreHead with weights from a ``.pt``/``.pth`` state dict or a ``.safetensors`` file, in eval mode."""
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(file))
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    head_state = {}
    for key, value in state.items():
        for prefix in ("layers.", "mlp.layers."):
            if key.startswith(prefix):
                head_state["layers." + key[len(prefix) :]] = value
    head = ScoreHead(input_dim)
    try:
        head.load_state_dict(head_state)
    except RuntimeError as e:
        first_line = str(e).strip().splitlines()
        detail = " ".join(line.strip() for line in first_line[1:3])
        raise ConfigError(
            f"{reward} reward: head file {str(file)!r} does not hold an MLP head for {input_dim}-dim features "
            f"(layers.0..layers.7): {detail}"
        ) from None
    return head.eval()
