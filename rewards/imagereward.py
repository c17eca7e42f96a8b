"""ImageReward (Xu et al. 2023) on transformers' BLIP classes.

ImageReward scores a prompt-image pair with BLIP's image-grounded text encoder: the prompt's tokens cross-attend to
the ViT's patch embeddings, the [CLS] output goes through an MLP head, and the result is standardised with the
training-set statistics (``(r - 0.16717362830052426) / 1.0333394966054072``, ``ImageReward.py``). This follows that
``score`` method step by step:

* backbone: a ``BlipForImageTextRetrieval`` directory (``path`` or ``FLOWZOO_IMAGEREWARD_PATH``) whose
  ``vision_model`` and ``text_encoder`` hold ImageReward's ``blip.visual_encoder`` / ``blip.text_encoder`` weights.
  The official ``ImageReward.pt`` is in the original BLIP layout, so it has to be converted once (the key renaming
  of transformers' ``convert_blip_original_pytorch_to_hf.py``); FlowZoo ships no converter.
* head: ``head_path`` or ``FLOWZOO_IMAGEREWARD_HEAD_PATH``; the official ``ImageReward.pt`` itself works (its
  ``mlp.layers.*`` entries are used, the rest ignored), or any file with those keys.
* preprocessing: the directory's tokenizer (bert-base-uncased in ImageReward; padded/truncated to 35 tokens) and
  image processor. ImageReward resizes the short side to 224 (bicubic), centre-crops 224 and normalises with CLIP's
  mean/std: save a ``CLIPImageProcessor`` with those settings to match it exactly (a ``BlipImageProcessor`` resizing
  to 224x224 is identical for square images).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput
from flowzoo.rewards.score_head import load_score_head
from flowzoo.rewards.weights import local_weights, to_pil_images

IMAGEREWARD_MEAN = 0.16717362830052426
IMAGEREWARD_STD = 1.0333394966054072


@register("imagereward")
class ImageReward(Reward):
    accepts = ("image",)

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        head_path: str | os.PathLike | None = None,
        device: str = "cpu",
        max_length: int = 35,
    ):
        from transformers import AutoImageProcessor, AutoTokenizer, BlipForImageTextRetrieval

        directory = local_weights(self.name, path, "FLOWZOO_IMAGEREWARD_PATH")
        head_file = local_weights(self.name, head_path, "FLOWZOO_IMAGEREWARD_HEAD_PATH", kind="file")
        self.device = torch.device(device)
        self.model = BlipForImageTextRetrieval.from_pretrained(directory).to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.image_processor = AutoImageProcessor.from_pretrained(directory)
        self.head = load_score_head(head_file, self.model.config.text_config.hidden_size, self.name).to(self.device)
        self.max_length = max_length

    @torch.no_grad()
    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        pixels = self.image_processor(images=to_pil_images(samples, self.name), return_tensors="pt")["pixel_values"]
        tokens = self.tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        image_embeds = self.model.vision_model(pixel_values=pixels.to(self.device)).last_hidden_state
        image_mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=self.device)
        text = self.model.text_encoder(
            input_ids=tokens["input_ids"].to(self.device),
            attention_mask=tokens["attention_mask"].to(self.device),
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=image_mask,
        ).last_hidden_state
        raw = self.head(text[:, 0, :].float())
        return RewardOutput((raw - IMAGEREWARD_MEAN) / IMAGEREWARD_STD)
