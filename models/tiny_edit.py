"""The tiny edit tier: the tiny tier's model (``models/tiny.py``) conditioned on a source image and an instruction,
InstructPix2Pix-style (Brooks et al. 2023, "InstructPix2Pix", sec. 3.2): the source image is concatenated to the
noisy image along the channels, so the transformer takes 6 input channels (noisy image 3 + source 3, both in
[-1, 1]) and predicts the 3-channel velocity ``noise - x0`` of the edited image.

* The condition is the instruction's CLIP embeddings (cached per instruction, as the tiny tier's) and the source
  image, ``source_image`` [B, 3, H, W] in [-1, 1], read from each prompt's ``metadata["source_image"]``
  (``flowzoo.source_images``: a path, resized to the model's frame, or a [3, H, W] tensor in [0, 1]); a prompt
  without one is a one-line ConfigError naming it. Images read from files are cached per path.
* CFG's unconditional branch keeps each row's source image and drops the instruction (the empty prompt): guidance
  on the instruction given the image, as the edit adapters' pipelines do (``flux_kontext``, ``qwen_image_edit``).
* Its instructions use words the text-to-image vocabulary lacks (``make``, ``add``, ``remove``): the edit arch's
  tokenizer appends them (``tiny_edit_data.instruction_vocabulary``), every earlier word keeping its id.
* Everything else (LoRA, reference, no-grad path, footprint, export) is the tiny tier's; the arch records the
  source channels (``TinyArch.source_channels`` = 3), so ``tiny`` refuses edit weights and ``tiny_edit`` refuses
  text-to-image ones.

Weights: ``models/weights/tiny_shapes_edit.safetensors`` (``weights: auto``; shipped, pretrained by
``flowzoo pretrain tiny --data shapes_edit --init models/weights/tiny_shapes.safetensors --steps 8256``, its
provenance in ``tiny_shapes_edit.json`` beside it, docs/tiny.md), a path, or None for a random model of ``arch``.

Pretraining from text-to-image weights (``--init``, :func:`init_from_text_to_image`): every weight is copied; the
patch embedding's weights on the 3 source channels start at zero and the new words' embeddings keep their random
initialisation. With zero source weights the network starts as exactly the text-to-image model (whatever the
source), so pretraining begins from a model that already draws the scenes an instruction names and only has to
learn to read the source; the gradient reaches the zero weights through the (non-zero) source pixels from the first
step. This is InstructPix2Pix's initialisation of its added input channels (sec. 3.2: "the weights that operate on
these newly added input channels are initialized to zero").
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.models import register
from flowzoo.models.base import Condition
from flowzoo.models.diffusers_common import Finetune, NoGradPath
from flowzoo.models.edit_sources import TextAndSource
from flowzoo.models.tiny import (TinyArch, TinyModel, load_networks, read_weights, shipped_weights,
                                 transformer_velocity)
from flowzoo.source_images import read_source_image

#: ``flowzoo pretrain tiny --data`` choices of the edit tier -> the scenes they edit (``TinyArch.data``)
EDIT_DATA = {"shapes_edit": "shapes"}
#: the condition's key of the source image
SOURCE = "source_image"
#: what the edit tier's pretraining starts from by default (docs/tiny.md)
TEXT_TO_IMAGE_INIT = "models/weights/tiny_shapes.safetensors"
#: the keys whose shapes differ between a text-to-image model and its edit model
PATCH_WEIGHT = "transformer.pos_embed.proj.weight"
TOKEN_EMBEDDING = "text_encoder.embeddings.token_embedding.weight"


def source_pixels(prompt: str, metadata: dict | None, shape: Sequence[int], where: str) -> torch.Tensor:
    """A prompt's source image as [C, H, W] in [-1, 1] at the model's ``shape`` (bilinear, antialiased, when its
    size differs); a missing or unreadable source, or one without ``C`` channels, is a one-line ConfigError."""
    image = read_source_image(metadata, f"{where} prompt {prompt!r}")
    if not isinstance(image, torch.Tensor):  # an RGB PIL image read from a file
        import numpy as np

        image = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1)[None]
    channels, height, width = shape
    if image.shape[1] != channels:
        raise ConfigError(f"{where} prompt {prompt!r}: its source image has {image.shape[1]} channels, not {channels} "
                          f"(an RGB image)")
    if tuple(image.shape[-2:]) != (height, width):
        image = torch.nn.functional.interpolate(image, size=(height, width), mode="bilinear", antialias=True,
                                                align_corners=False).clamp(0, 1)
    return image[0] * 2 - 1


@register("tiny_edit")
class TinyEditModel(TextAndSource, TinyModel):
    """The tiny edit tier: an instruction and a source image concatenated to the noisy image (InstructPix2Pix-style).
    ``weights``: "auto" = ``models/weights/tiny_<data>_edit.safetensors``, a path, or None for a random model."""

    source_channels = 3
    source_key = SOURCE  # the condition carries the source pixels under the metadata key's name

    @classmethod
    def weights_file(cls, data: str) -> Path:
        return shipped_weights(f"{data}_edit")

    @classmethod
    def pretrain_hint(cls, data: str) -> str:
        return f"flowzoo pretrain tiny --data {data}_edit --init {TEXT_TO_IMAGE_INIT}"

    def __init__(
        self,
        data: str = "shapes",
        weights: str | None = "auto",
        arch: dict | None = None,
        *,
        lora_rank: int = 8,
        lora_alpha: float = 16,
        lora_targets: Sequence[str] | None = None,
        seed: int = 0,
        device: str | None = "cpu",
        cache_size: int = 4096,
        dtype: str = "float32",
        no_grad_path: NoGradPath = "merged",
        finetune: Finetune = "lora",
    ) -> None:
        if data not in EDIT_DATA.values():
            raise ConfigError(f"{self.name}: unknown data {data!r}; the edit tier edits: "
                              f"{', '.join(EDIT_DATA.values())}")
        super().__init__(data, weights, arch, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets,
                         seed=seed, device=device, cache_size=cache_size, dtype=dtype, no_grad_path=no_grad_path,
                         finetune=finetune)

    def _source_tensor(self, prompt: str, metadata: dict | None) -> torch.Tensor:
        """The source image in [-1, 1] [3, H, W] (``source_image``; cached per path)."""
        pixels = self._cached(metadata, lambda: source_pixels(prompt, metadata, self.latent_shape, self.name), "pixels")
        return pixels.to(self.latent_dtype)

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        """The noisy image and the source image along the channels in, the edited image's velocity out."""
        if SOURCE not in cond.tensors:
            raise ConfigError(f"{self.name}: a condition without {SOURCE!r} (an edit model's every call, CFG's "
                              f"unconditional branch included, carries the source image: use encode / unconditional)")
        return transformer_velocity(self.network(), torch.cat([x, cond.tensors[SOURCE].to(x.dtype)], dim=1),
                                    timestep, cond.tensors)

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return f"TinyEditModel(arch={self.arch}, weights={str(self.path) if self.path else None!r})"


# ---- pretraining from text-to-image weights --------------------------------------------------------------------
def text_to_image_weights(path: str | Path, data: str) -> tuple[TinyArch, dict[str, torch.Tensor]]:
    """The arch and tensors of a tiny text-to-image weights file of ``data`` scenes, what ``--init`` starts from; a
    one-line ConfigError for a missing file, one not written by ``flowzoo pretrain tiny``, an edit model or other
    scenes."""
    arch, tensors, _ = read_weights(path)
    if arch.source_channels or arch.data != data:
        kind = "an edit model" if arch.source_channels else f"a text-to-image model of {arch.data!r}"
        raise ConfigError(f"pretrain: --init {str(path)!r} holds {kind}; it must be a tiny text-to-image weights file "
                          f"of {data!r} scenes (e.g. models/weights/tiny_{data}.safetensors)")
    return arch, tensors


def edit_arch(data: str, arch: dict | None, init: str | Path | None) -> TinyArch:
    """The edit model's arch for ``--data`` ``data`` (a key of :data:`EDIT_DATA`): ``arch``'s sizes, or with
    ``init`` the text-to-image file's (``arch`` may only repeat them), and the source channels."""
    scene = EDIT_DATA[data]
    values = {**(arch or {}), "data": scene, "source_channels": 3}
    if init is None:
        return TinyArch.from_dict(values)
    base = text_to_image_weights(init, scene)[0].to_dict()
    merged = TinyArch.from_dict({**base, **values})
    if TinyArch.from_dict({**base, "source_channels": 3}) != merged:
        raise ConfigError(f"pretrain: arch {arch} conflicts with the --init weights' arch {base}")
    return merged


@torch.no_grad()
def init_from_text_to_image(transformer: torch.nn.Module, text_encoder: torch.nn.Module, arch: TinyArch,
                            path: str | Path) -> None:
    """Load a text-to-image file into an edit model's networks (module docstring): every weight copied, the patch
    embedding's source-channel weights zero, the appended words' embeddings as initialised."""
    _, tensors = text_to_image_weights(path, arch.data)
    patch = torch.zeros_like(transformer.state_dict()[PATCH_WEIGHT.removeprefix("transformer.")])
    old_patch = tensors[PATCH_WEIGHT]
    patch[:, : old_patch.shape[1]] = old_patch
    tokens = text_encoder.state_dict()[TOKEN_EMBEDDING.removeprefix("text_encoder.")].clone()
    old_tokens = tensors[TOKEN_EMBEDDING]
    tokens[: old_tokens.shape[0]] = old_tokens
    load_networks(transformer, text_encoder, {**tensors, PATCH_WEIGHT: patch, TOKEN_EMBEDDING: tokens})
