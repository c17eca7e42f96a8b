"""Qwen-Image-Edit (diffusers ``QwenImageEditPipeline``): Qwen-Image's instruction-editing sibling as a FlowModel,
with a peft LoRA on the transformer. Its condition is an instruction and a source image.

Everything but the source image is the ``qwen_image`` adapter's (``QwenImageModel``: the packed latents, the prompt
embeddings padded per prompt and trimmed per call with their mask, true CFG with the norm-preserving rescale, the
terminal-stretched schedule, the LoRA targets). What the edit pipeline adds (diffusers 0.42,
pipelines/qwenimage/pipeline_qwenimage_edit.py):

* the prompt is read by Qwen2.5-VL **with the source image**: the edit template (a system prompt, then
  ``<|vision_start|><|image_pad|><|vision_end|>`` and the instruction) goes through the pipeline's
  ``Qwen2VLProcessor`` with the image (its image pad token expanded to the image's merged patches), the hidden
  states of the valid tokens are kept after the template's first 64 (``prompt_template_encode_start_idx``; the
  image's tokens are among those kept), ``encode_prompt(prompt, image)``;
* the source image is VAE-encoded (``_encode_vae_image``: the mode, normalised with ``latents_mean`` /
  ``latents_std``) and packed like the target; its tokens are joined after the target's in the image stream
  (``torch.cat([latents, image_latents], dim=1)``) with ``img_shapes`` naming both grids (the target's, then the
  source's), and the output is cut back to the target's tokens; the schedule's shift counts the target's only;
* true CFG's negative prompt (``" "``) is encoded with the same source image, and its branch sees the same image
  latents: ``encode`` keeps each row's negative embeddings beside its prompt's and ``unconditional`` swaps them in.

The source image is each prompt's ``metadata["source_image"]`` (``flowzoo.source_images``: an image path, or a
[C, H, W] tensor in [0, 1]). ``encode`` resizes it to the target's ``resolution`` square with the pipeline's image
processor (``models/edit_sources.py``, as ``flux_kontext``), for the VAE and for the VL encoder alike. The pipeline
instead resizes every source to about 1 megapixel at its aspect ratio (``calculate_dimensions(1024 * 1024, ratio)``)
whatever the output size; where the two sizes are the same the adapter and the pipeline agree. A tensor source reaches
the VL processor as the 8-bit RGB image of its values (the processor rescales by 1/255, which would darken a [0, 1]
tensor to black); a file is given as the pipeline gives its PIL images. The embeddings and latents of a path are
cached per (path, instruction) and path; tensors are encoded at each call.

transformers builds no ``Qwen2VLProcessor`` without torchvision (its video processor), so the adapter builds the
processor itself from the pipeline folder's ``processor/`` (its tokenizer and ``Qwen2VLImageProcessor``; no video
processor, which an edit prompt never uses) and hands it to ``from_pretrained``.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.models import register
from flowzoo.models.base import Condition
from flowzoo.models.edit_sources import SourceImages
from flowzoo.models.footprint import Footprint
from flowzoo.models.qwen_image import QWEN_IMAGE_ARCH, TEXT_LENGTH, QwenImageModel

#: Qwen-Image-Edit's transformer, text encoder and VAE are Qwen-Image's (Qwen/Qwen-Image-Edit transformer/config.json:
#: 60 blocks, 24 x 128 heads; text_encoder Qwen2.5-VL-7B-Instruct with its vision tower, which Qwen-Image also loads);
#: its stream carries the source image's tokens beside the target's (``footprint``)
QWEN_IMAGE_EDIT_ARCH = dataclasses.replace(
    QWEN_IMAGE_ARCH, label="Qwen-Image-Edit",
    source="Qwen/Qwen-Image-Edit transformer/config.json (Qwen-Image's: 60 blocks, 24 x 128 heads), text_encoder "
           "(Qwen2.5-VL-7B-Instruct), vae/config.json")

#: the keys of the negative prompt's embeddings (read with each row's source image) in an edit condition
NEGATIVE = {"prompt_embeds": "negative_prompt_embeds", "prompt_embeds_mask": "negative_prompt_embeds_mask"}
#: the negative branch's valid prompt lengths in the condition's host values
NEGATIVE_LENGTH = "negative_text_length"


@functools.lru_cache(maxsize=1)
def _image_only_processor_class() -> type:
    """``Qwen2VLProcessor`` that accepts no video processor (what transformers requires torchvision for)."""
    from transformers import Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyQwen2VLProcessor


def image_only_processor(folder: Path) -> Any:
    """The pipeline's processor from its folder: the tokenizer and the Qwen2-VL image processor saved there."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessor

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return _image_only_processor_class()(image_processor=Qwen2VLImageProcessor.from_pretrained(folder),
                                         tokenizer=tokenizer, video_processor=None)


@register("qwen_image_edit")
class QwenImageEditModel(SourceImages, QwenImageModel):
    """Qwen-Image-Edit image editing: an instruction and a source image (QwenImageEditPipeline), LoRA.

    The source image is each prompt's ``metadata["source_image"]`` (the module docstring)."""

    pipeline_class = "QwenImageEditPipeline"
    #: its own save/load_lora_weights (the value inherited from Qwen-Image would name QwenImagePipeline)
    lora_format = "QwenImageEditPipeline"
    env_var = "FLOWZOO_QWEN_IMAGE_EDIT_PATH"
    architecture = QWEN_IMAGE_EDIT_ARCH
    vae_frames = True  # Qwen-Image's VAE takes [B, C, frames, H, W]

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        """Qwen-Image's at this resolution, with the source image's tokens (as many as the target's) in the stream."""
        qwen = super().footprint(args)
        return qwen._replace(tokens=qwen.tokens + (int(args["resolution"]) // 16) ** 2)

    def _pipeline_components(self, root: Path) -> dict[str, Any]:
        folder = root / "processor"
        if not folder.is_dir():
            raise ConfigError(f"model {self.name!r}: {str(root)!r} is incomplete: missing component folder 'processor'")
        return {"processor": image_only_processor(folder)}

    # ---- the condition ------------------------------------------------------------------------------------
    def _vl_prompt(self, prompt: str, metadata: dict | None) -> tuple[dict[str, torch.Tensor], int]:
        """One prompt read by Qwen2.5-VL with its source image (the pipeline's ``encode_prompt``), padded to
        ``max_sequence_length``, and its valid length (its width before the padding, known on the host); longer is a
        one-line ConfigError."""
        resized, _ = self._resized_source(prompt, metadata)
        if isinstance(resized, torch.Tensor):  # [1, C, H, W] in [0, 1] -> the 8-bit image the processor expects
            processor = self.pipe.image_processor
            resized = processor.numpy_to_pil(processor.pt_to_numpy(resized))[0]
        with torch.no_grad():
            embeds, mask = self.pipe.encode_prompt(prompt=[prompt], image=resized, device=self.device)
        if embeds.shape[1] > self.max_sequence_length:
            raise ConfigError(f"{self.name} prompt {prompt!r} with its source image is {embeds.shape[1]} tokens, over "
                              f"max_sequence_length {self.max_sequence_length}; raise max_sequence_length")
        # one prompt: the pipeline pads it to its own length, so its valid length is the width (no device read)
        return {k: v[0].detach() for k, v in self._padded(embeds, mask).items()}, int(embeds.shape[1])

    def _edit_row(self, prompt: str, metadata: dict | None) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        text, length = self._cached(metadata, lambda: self._vl_prompt(prompt, metadata), "prompt", prompt)
        negative, negative_length = self._cached(metadata, lambda: self._vl_prompt(self.negative_prompt, metadata),
                                                 "prompt", self.negative_prompt)
        return ({**text, **{NEGATIVE[k]: v for k, v in negative.items()},
                 "image_latents": self._source_latents(prompt, metadata)},
                {TEXT_LENGTH: length, NEGATIVE_LENGTH: negative_length})

    def encode(self, prompts: Sequence[str], metadata: Sequence[dict] | None = None) -> Condition:
        """Per row: the instruction read with its source image (``prompt_embeds``, ``prompt_embeds_mask``), the
        negative prompt read with it (``negative_prompt_embeds``, ``negative_prompt_embeds_mask``) and the source's
        packed latents (``image_latents``), with both prompts' valid lengths on the host (read once per encoding);
        a prompt without a source image is a one-line ConfigError."""
        prompts = [str(p) for p in prompts]
        rows = [self._edit_row(p, m) for p, m in zip(prompts, self._metadata_rows(prompts, metadata))]
        return Condition.stack(rows)

    def null_condition(self, n: int) -> Condition:
        raise ConfigError(f"{self.name} has no condition without a source image: the negative prompt is read with "
                          "each row's source image (unconditional(cond) gives CFG's branch)")

    def unconditional(self, cond: Condition) -> Condition:
        """The negative prompt read with each row's own source image, and that image's latents (the pipeline's
        negative branch)."""
        host = {TEXT_LENGTH: cond.host[NEGATIVE_LENGTH]} if NEGATIVE_LENGTH in cond.host else {}
        return Condition({**cond.tensors, **{k: cond.tensors[n] for k, n in NEGATIVE.items()}}, host)

    # ---- the network --------------------------------------------------------------------------------------
    def _img_shapes(self) -> list[tuple[int, int, int]]:
        """The target's latent grid, then the source's (the same size: the source is resized to the target's)."""
        return [(1, self._patches, self._patches)] * 2

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        """The target's tokens then the source's; the output cut back to the target's tokens."""
        context = cond.tensors["image_latents"].to(x.dtype)
        return super()._transformer_forward(torch.cat([x, context], dim=1), timestep, cond)[:, : x.shape[1]]
