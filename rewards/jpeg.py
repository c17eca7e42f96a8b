"""JPEG (in)compressibility rewards, as defined in DDPO (Black et al. 2023, "Training Diffusion Models with
Reinforcement Learning", ``ddpo_pytorch/rewards.py``).

Each image is encoded as JPEG at quality 95 with PIL; its size in kB (1 kB = 1000 bytes) is the
``jpeg_incompressibility`` reward, and its negative the ``jpeg_compressibility`` reward. Cheap, deterministic and
model-free: a useful sanity task (flat, smooth images compress well; detailed, noisy ones do not).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import torch

from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput

JPEG_QUALITY = 95


def jpeg_size_kb(images: torch.Tensor, quality: int = JPEG_QUALITY) -> torch.Tensor:
    """JPEG sizes in kB [B] of RGB images [B, 3, H, W] in [0, 1] (quantised to uint8 as DDPO does)."""
    from PIL import Image

    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"jpeg reward: expected RGB images [B, 3, H, W], got shape {tuple(images.shape)}")
    pixels = (images.detach().float() * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    sizes = []
    for array in pixels:
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32)


@register("jpeg_incompressibility")
class JpegIncompressibility(Reward):
    """+ JPEG size in kB at quality 95: rewards detail."""

    accepts = ("image",)

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        return RewardOutput(jpeg_size_kb(samples))


@register("jpeg_compressibility")
class JpegCompressibility(Reward):
    """- JPEG size in kB at quality 95: rewards simple, compressible images."""

    accepts = ("image",)

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        return RewardOutput(-jpeg_size_kb(samples))
