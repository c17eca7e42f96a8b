"""FLUX.1-Kontext-dev (diffusers ``FluxKontextPipeline``): FLUX.1-dev's instruction-editing sibling as a FlowModel,
with a peft LoRA on the transformer. Its condition is an instruction and a source image.

Everything but the source image is the ``flux`` adapter's (``FluxModel``: the text encoders, the packed latents, the
guidance embedding ``distilled_guidance``, the dynamic shift of the target's token count, the LoRA targets). What
Kontext adds, as the pipeline does it (diffusers 0.42, pipelines/flux/pipeline_flux_kontext.py):

* the source image is VAE-encoded (``_encode_vae_image``: the latent distribution's mode, shifted and scaled) and
  packed like the target (``_pack_latents``);
* its tokens are joined after the target's in the transformer's sequence (``torch.cat([latents, image_latents],
  dim=1)``) at their own positions: the target's patch grid with the first coordinate 1 instead of 0
  (``prepare_latents``: ``image_ids[..., 0] = 1``);
* the transformer's output is cut back to the target tokens (``noise_pred[:, : latents.size(1)]``): the context
  tokens are read, never denoised; the sigma schedule's shift counts the target tokens only;
* true CFG's negative branch sees the same source image (only the text changes): ``unconditional`` keeps each row's
  image latents.

The source image is each prompt's ``metadata["source_image"]`` (``flowzoo.source_images``: an image path, or a
[C, H, W] tensor in [0, 1]). ``encode`` resizes it to the target's ``resolution`` square with the pipeline's own image
processor (``resize`` then ``preprocess``: Lanczos for an image file, nearest for a tensor), so every row of a batch
has one shape. The pipeline instead keeps the source's own size (floored to a multiple of 16) or, with its default
``_auto_resize``, snaps it to the nearest of ``PREFERRED_KONTEXT_RESOLUTIONS`` (about 1 megapixel); a source already
at the target's resolution is taken unchanged, where the adapter and the pipeline agree exactly. Image latents of a
path are cached per path (``cache_size`` paths); tensors are encoded at each call.
"""

from __future__ import annotations

import dataclasses

import torch

from flowzoo.models import register
from flowzoo.models.base import Condition
from flowzoo.models.edit_sources import TextAndSource
from flowzoo.models.flux import FLUX1_DEV_ARCH, FluxModel
from flowzoo.models.footprint import Footprint

#: FLUX.1-Kontext-dev's transformer is FLUX.1-dev's architecture (black-forest-labs/FLUX.1-Kontext-dev
#: transformer/config.json: 19 double + 38 single blocks, 24 x 128 heads, guidance_embeds true; the same text encoders
#: and VAE); its stream carries the source image's tokens beside the target's (``footprint``)
FLUX1_KONTEXT_DEV_ARCH = dataclasses.replace(
    FLUX1_DEV_ARCH, label="FLUX.1-Kontext-dev",
    source="black-forest-labs/FLUX.1-Kontext-dev transformer/config.json (FLUX.1-dev's: 19 double + 38 single "
           "blocks, 24 x 128 heads), text_encoder*/config.json, vae/config.json")


@register("flux_kontext")
class FluxKontextModel(TextAndSource, FluxModel):
    """FLUX.1-Kontext-dev image editing: an instruction and a source image (FluxKontextPipeline), LoRA.

    The source image is each prompt's ``metadata["source_image"]`` (the module docstring)."""

    pipeline_class = "FluxKontextPipeline"
    #: its own save/load_lora_weights (the value inherited from FLUX would name FluxPipeline)
    lora_format = "FluxKontextPipeline"
    env_var = "FLOWZOO_FLUX_KONTEXT_PATH"
    architecture = FLUX1_KONTEXT_DEV_ARCH

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        """FLUX's at this resolution, with the source image's tokens (as many as the target's) in the stream."""
        flux = super().footprint(args)
        return flux._replace(tokens=flux.tokens + (int(args["resolution"]) // 16) ** 2)

    # ---- the source image ---------------------------------------------------------------------------------
    @property
    def _context_ids(self) -> torch.Tensor:
        """Positions of the target's tokens then the source's: the same patch grid, first coordinate 0 then 1."""
        ids = self.__dict__.get("_joint_ids")
        if ids is None:
            source = self._img_ids.clone()
            source[..., 0] = 1
            ids = self.__dict__["_joint_ids"] = torch.cat([self._img_ids, source], dim=0)
        return ids

    def _source_tensor(self, prompt: str, metadata: dict | None) -> torch.Tensor:
        """The source image's packed VAE latents [tokens, 4 C] (``image_latents``)."""
        return self._source_latents(prompt, metadata)

    # ---- the network --------------------------------------------------------------------------------------
    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        """The target's tokens then the source's, at their positions; the output cut back to the target's tokens."""
        context = cond.tensors["image_latents"].to(x.dtype)
        out = self._flux_call(torch.cat([x, context], dim=1), timestep, cond, self._context_ids)
        return out[:, : x.shape[1]]
