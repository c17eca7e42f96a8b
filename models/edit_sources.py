"""What the instruction-editing adapters (``flux_kontext``, ``qwen_image_edit``, ``tiny_edit``) share about a prompt's
source image:
reading it from the prompt's metadata (``flowzoo.source_images``), resizing it to the target's square resolution with
the pipeline's own image processor, its VAE latents packed as the target's, and a least-recently-used cache of what is
computed from an image file (those latents; for Qwen-Image-Edit the instruction read with the image), keyed by path.

A mixin of a diffusers adapter: it reads ``self.pipe.image_processor``, ``self.resolution``, ``self.cache_size`` and
``self.name``. Tensors are not cached (they are recomputed at each call). :class:`TextAndSource` adds the condition of
an adapter whose text is read without the image (``flux_kontext``, ``tiny_edit``): the base adapter's text embeddings
beside one tensor per row computed from its source image."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence

from flowzoo.errors import ConfigError
from flowzoo.source_images import read_source_image, source_of


def source_path(metadata: dict | None) -> str | None:
    """The path of a prompt's source image when it is a file (what the cache keys by), else None."""
    source = source_of(metadata)
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else None


class SourceImages:
    """Mixin: a prompt's source image resized to the target's resolution, and a path-keyed cache."""

    def _metadata_rows(self, prompts: list[str], metadata: Sequence[dict] | None) -> list[dict | None]:
        """One metadata entry per prompt (None for each without metadata); a count mismatch is a ConfigError."""
        rows = [None] * len(prompts) if metadata is None else list(metadata)
        if len(rows) != len(prompts):
            raise ConfigError(f"{self.name}: {len(prompts)} prompts but {len(rows)} metadata entries")
        return rows

    def _resized_source(self, prompt: str, metadata: dict | None) -> tuple[Any, Any]:
        """The prompt's source image resized to ``resolution`` square by the pipeline's image processor (``resize``:
        Lanczos for an image file, nearest for a tensor) and that image preprocessed for the VAE ([1, 3, H, W] in
        [-1, 1]); a missing or unreadable source is a one-line ConfigError naming the prompt."""
        image = read_source_image(metadata, f"{self.name} prompt {prompt!r}")
        processor, side = self.pipe.image_processor, self.resolution
        resized = processor.resize(image, side, side)
        return resized, processor.preprocess(resized, side, side)

    #: whether the pipeline's VAE takes a frame axis ([B, C, 1, H, W]: Qwen-Image's video VAE)
    vae_frames: bool = False

    def _source_latents(self, prompt: str, metadata: dict | None):
        """The packed VAE latents [tokens, 4 C] of a prompt's source image (the pipeline's ``_encode_vae_image``: the
        latent distribution's mode, normalised; then ``_pack_latents``), cached per path."""
        return self._cached(metadata, lambda: self._pack_source(prompt, metadata), "latents")

    def _pack_source(self, prompt: str, metadata: dict | None):
        import torch

        _, pixels = self._resized_source(prompt, metadata)
        vae = self.pipe.vae
        pixels = pixels.to(device=self.device, dtype=vae.dtype)
        with torch.no_grad():
            latents = self.pipe._encode_vae_image(pixels[:, :, None] if self.vae_frames else pixels, generator=None)
        channels, (height, width) = latents.shape[1], latents.shape[-2:]
        return self.pipe._pack_latents(latents, 1, channels, height, width)[0].detach()

    def _cached(self, metadata: dict | None, compute: Callable[[], Any], *what: Hashable) -> Any:
        """``compute()`` of the prompt's source image, kept under its path and ``what`` (least recently used evicted
        past ``cache_size`` entries); a tensor source computes at each call."""
        path = source_path(metadata)
        if path is None:
            return compute()
        key = (path, *what)
        cache: OrderedDict = self.__dict__.setdefault("_source_cache", OrderedDict())
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        value = cache[key] = compute()
        while len(cache) > max(self.cache_size, 1):
            cache.popitem(last=False)
        return value


class TextAndSource(SourceImages):
    """Mixin: a condition of the prompts' text embeddings (the base adapter's ``encode``, cached per prompt) and, under
    :attr:`source_key`, one tensor per row computed from its source image by :meth:`_source_tensor`; CFG's branch is
    the negative prompt with each row's own source image (the edit pipelines' negative branch)."""

    #: the condition's key of the source tensors
    source_key = "image_latents"

    def _source_tensor(self, prompt: str, metadata: dict | None):
        """What the transformer reads of one row's source image (a one-line ConfigError when it has none)."""
        raise NotImplementedError

    def encode(self, prompts: Sequence[str], metadata: Sequence[dict] | None = None):
        """The prompts' text embeddings and their source tensors (``source_key``); a prompt without a source image is
        a one-line ConfigError."""
        import torch

        from flowzoo.models.base import Condition

        prompts = [str(p) for p in prompts]
        rows = self._metadata_rows(prompts, metadata)
        text = self._text_condition(prompts)
        sources = torch.stack([self._source_tensor(p, m) for p, m in zip(prompts, rows)])
        return Condition({**text.tensors, self.source_key: sources}, text.host)

    def _text_condition(self, prompts: list[str]):
        """The prompts' text embeddings alone (the base adapter's encode: cached per prompt)."""
        return super().encode(prompts)

    def null_condition(self, n: int):
        """The negative prompt's text embeddings; CFG's branch takes each row's source image (``unconditional``)."""
        return self._text_condition([self.negative_prompt]).repeat_interleave(n)

    def unconditional(self, cond):
        """The negative prompt with each row's own source tensor."""
        from flowzoo.models.base import Condition

        null = self.null_condition(len(cond))
        return Condition({**null.tensors, self.source_key: cond.tensors[self.source_key]}, null.host)
