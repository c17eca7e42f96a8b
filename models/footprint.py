"""What the per-GPU memory estimate (``benchmark/run/memory.py``) reads of a model: its architecture's
published facts (:class:`Arch`) and, at a config's model arguments, the sizes one sample takes (:class:`Footprint`).
Each adapter states its own (``FlowModel.footprint``); the estimate holds no table of models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class Arch:
    """A model's architecture as the estimate reads it."""

    label: str
    transformer_params: int
    hidden: int  # width of the token stream
    blocks: int  # transformer blocks every token passes (FLUX: 19 double-stream + 38 single-stream)
    text_width: int  # width of the text condition each sample carries (0: none)
    text_encoder_params: int  # every text encoder the pipeline loads (in the model's dtype)
    vae_params: int
    vae_channels: int  # channels of the decoder's widest convolution at full resolution (0: no VAE)
    #: LoRA parameters per unit of rank: sum of (in + out) features over the wrapped Linear layers, per target list
    lora_widths: dict = field(default_factory=dict)
    #: saved activations per (row, block, token, hidden unit), in numbers of the compute dtype, fit on the first GPU
    #: run (benchmark/run/memory.py CALIBRATION)
    activation: float = 27.0
    source: str = ""


class Footprint(NamedTuple):
    """A model at its arguments: its :class:`Arch` and what one sample takes."""

    arch: Arch
    tokens: int  # tokens per sample in the transformer's stream
    text_tokens: int  # text tokens per sample (its condition)
    latent_numbers: int  # latent numbers per sample (a trajectory keeps T + 1 of them, float32)
    pixels: int  # decoded pixels per sample at a decode's peak


def image_footprint(arch: Arch, resolution: int, text_tokens: int) -> Footprint:
    """An image model whose transformer sees 2 x 2 patches of an 8x-downsampled 16-channel latent, joined by its text
    tokens in one stream (SD3, FLUX, Qwen-Image)."""
    return Footprint(arch, (resolution // 16) ** 2 + text_tokens, text_tokens, 16 * (resolution // 8) ** 2,
                     resolution * resolution)
