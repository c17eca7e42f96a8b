"""CLIP-based rewards on transformers ``CLIPModel`` + ``CLIPProcessor`` loaded from a local directory.

Every reward takes ``path`` (a directory written by ``save_pretrained``, holding the model and its processor) or
reads it from an environment variable, and ``device``. Images are converted to PIL and preprocessed by the saved
``CLIPProcessor`` (resize, centre crop, normalise), the way each model was trained and evaluated. Scores are computed
without gradients: GRPO-style training only needs the scalar.

* ``clipscore`` (``FLOWZOO_CLIPSCORE_PATH``, e.g. openai/clip-vit-large-patch14): ``scale * cos(image, text)``.
  ``scale`` defaults to 1 (the raw cosine, about 0.2-0.35 for matching pairs); ``scale=100`` gives the "CLIP score
  x 100" of torchmetrics and most T2I tables (which also clip at 0; we do not, so mismatches still rank).
* ``pickscore`` (``FLOWZOO_PICKSCORE_PATH``, yuvalkirstain/PickScore_v1 with the processor of
  laion/CLIP-ViT-H-14-laion2B-s32B-b79K): ``logit_scale.exp() * cos``, as PickScore's reference code (about 20-23
  for good images; Flow-GRPO divides by 26, which ``scale=1/26`` reproduces).
* ``hpsv2`` (``FLOWZOO_HPSV2_PATH``): HPS v2's score is the raw cosine of its fine-tuned ViT-H-14 (``hps_score =
  diag(image_features @ text_features.T)`` in the HPSv2 repo). The official release is an open_clip checkpoint
  (``HPS_v2.1_compressed.pt``); this reward needs it converted to a transformers ``CLIPModel`` directory (with the
  processor of laion/CLIP-ViT-H-14-laion2B-s32B-b79K). FlowZoo ships no converter and does not depend on open_clip.
* ``aesthetic`` (``FLOWZOO_AESTHETIC_PATH`` for CLIP ViT-L/14, ``FLOWZOO_AESTHETIC_HEAD_PATH`` for the head file,
  e.g. ``sac+logos+ava1-l14-linearMSE.pth``): the LAION aesthetic predictor v2, an MLP on the L2-normalised CLIP
  image embedding (the prompt is ignored). The head's input size follows the CLIP projection dim.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import ClassVar

import torch

from flowzoo.errors import ConfigError
from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput
from flowzoo.rewards.score_head import load_score_head
from flowzoo.rewards.weights import local_weights, projected_features, to_pil_images


class ClipReward(Reward):
    """Loads a CLIPModel + CLIPProcessor and embeds (image, prompt) pairs; subclasses turn embeddings into scores."""

    env_var: ClassVar[str] = ""

    def __init__(self, path: str | os.PathLike | None = None, device: str = "cpu", scale: float = 1.0):
        from transformers import CLIPModel, CLIPProcessor

        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale != 0):
            raise ConfigError(f"reward {self.name!r}: scale must be a finite non-zero number, got {scale!r}")
        directory = local_weights(self.name, path, self.env_var)
        self.device = torch.device(device)
        self.model = CLIPModel.from_pretrained(directory).to(self.device).eval()
        self.processor = CLIPProcessor.from_pretrained(directory)
        self.scale = float(scale)

    @torch.no_grad()
    def image_embeddings(self, samples: torch.Tensor) -> torch.Tensor:
        """L2-normalised projected image embeddings [B, D]."""
        pixels = self.processor(images=to_pil_images(samples, self.name), return_tensors="pt")["pixel_values"]
        features = projected_features(self.model.get_image_features(pixel_values=pixels.to(self.device)))
        return torch.nn.functional.normalize(features.float(), dim=-1)

    @torch.no_grad()
    def text_embeddings(self, prompts: Sequence[str]) -> torch.Tensor:
        """L2-normalised projected text embeddings [B, D] (prompts truncated to the model's context length)."""
        tokens = self.processor(
            text=list(prompts),
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=self.model.config.text_config.max_position_embeddings,
        )
        features = projected_features(
            self.model.get_text_features(
                input_ids=tokens["input_ids"].to(self.device), attention_mask=tokens["attention_mask"].to(self.device)
            )
        )
        return torch.nn.functional.normalize(features.float(), dim=-1)

    def cosine(self, samples: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return (self.image_embeddings(samples) * self.text_embeddings(prompts)).sum(-1)


@register("clipscore")
class ClipScore(ClipReward):
    """``scale * cos(CLIP image embedding, CLIP text embedding)``; scale 1 by default (see module docstring)."""

    env_var = "FLOWZOO_CLIPSCORE_PATH"

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        return RewardOutput(self.scale * self.cosine(samples, prompts))


@register("pickscore")
class PickScore(ClipReward):
    """PickScore (Kirstain et al. 2023): ``logit_scale.exp() * cos``, times ``scale`` (1 by default)."""

    env_var = "FLOWZOO_PICKSCORE_PATH"

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        logit_scale = self.model.logit_scale.detach().float().exp()
        return RewardOutput(self.scale * logit_scale * self.cosine(samples, prompts))


@register("hpsv2")
class HpsV2(ClipReward):
    """HPS v2 / v2.1 (Wu et al. 2023): raw cosine of a converted HPS CLIPModel (see module docstring)."""

    env_var = "FLOWZOO_HPSV2_PATH"

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        return RewardOutput(self.scale * self.cosine(samples, prompts))


@register("aesthetic")
class Aesthetic(ClipReward):
    """LAION aesthetic predictor v2: MLP head on the normalised CLIP image embedding (roughly a 1-10 rating)."""

    accepts = ("image",)
    env_var = "FLOWZOO_AESTHETIC_PATH"
    head_env_var: ClassVar[str] = "FLOWZOO_AESTHETIC_HEAD_PATH"

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        head_path: str | os.PathLike | None = None,
        device: str = "cpu",
    ):
        head_file = local_weights(self.name, head_path, self.head_env_var, kind="file")
        super().__init__(path, device)
        self.head = load_score_head(head_file, self.model.config.projection_dim, self.name).to(self.device)

    @torch.no_grad()
    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        return RewardOutput(self.head(self.image_embeddings(samples)))
