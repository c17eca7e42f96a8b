"""Stable Diffusion 3 / 3.5 (diffusers ``StableDiffusion3Pipeline``) as a FlowModel, with a peft LoRA on the
transformer.

Matches the pipeline (diffusers 0.42, pipeline_stable_diffusion_3.py): prompts go through ``encode_prompt``
(two CLIP encoders + T5, joint sequence and pooled vector), the transformer is called with
``timestep = sigma * 1000`` and its output is the velocity, and decoding is
``vae.decode(latents / scaling_factor + shift_factor)``. Recipe defaults from Flow-GRPO (config/grpo.py, the
``*_sd3`` configs): 512 px, 10 training / 40 evaluation steps, CFG 4.5; shift 3.0 is the SD3.5-Medium scheduler's.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from flowzoo.models import register
from flowzoo.models.base import Condition
from flowzoo.models.diffusers_common import SD3_LORA_TARGETS, DiffusersFlowModel, Finetune, shared_arguments
from flowzoo.models.footprint import Arch, Footprint, image_footprint
from flowzoo.errors import ConfigError
from flowzoo.ranges import AT_LEAST_1


#: SD3.5-Medium as the memory estimate reads it. Parameter counts and LoRA widths: the published configs built with
#: diffusers 0.42 / transformers on the meta device (tests/test_memory_estimate.py rebuilds the transformer from
#: benchmark/perf/gpu.py SD35_MEDIUM and checks them)
SD35_MEDIUM_ARCH = Arch(
    "SD3.5-Medium", transformer_params=2_243_171_520, hidden=1536, blocks=24, text_width=4096,
    # CLIP-L 123.65 M + OpenCLIP bigG 694.66 M (CLIPTextModelWithProjection) + T5-XXL encoder 4,762.31 M
    text_encoder_params=123_650_304 + 694_659_840 + 4_762_310_656,
    vae_params=83_819_683, vae_channels=256,  # AutoencoderKL, block_out_channels (128, 256, 512, 512), 16 latents
    lora_widths={"default": 586_752}, activation=27.0,
    source="stabilityai/stable-diffusion-3.5-medium transformer/config.json (24 layers, 24 x 64 heads, dual "
           "attention 0-12), text_encoder*/config.json, vae/config.json")


@register("sd3")
class SD3Model(DiffusersFlowModel):
    sample_kind = "image"
    default_guidance = 4.5
    default_shift = 3.0
    default_num_steps = 10
    default_eval_num_steps = 40
    # samples per training-rollout call, decode and reward call: Flow-GRPO's SD3 sampling batch,
    # sample.train_batch_size 9 (yifan123/flow_grpo config/grpo.py:41 at ac4c86e, general_ocr_sd3; geneval_sd3 :81 and
    # pickscore_sd3 :118 alike), whatever a GPU's share of the global batch
    default_rollout_batch = 9
    pipeline_class = "StableDiffusion3Pipeline"
    transformer_class = "SD3Transformer2DModel"
    env_var = "FLOWZOO_SD3_PATH"
    argument_ranges = {**DiffusersFlowModel.argument_ranges, "resolution": AT_LEAST_1}
    default_lora_targets = SD3_LORA_TARGETS  # the joint attention only, as the SD3 releases train
    shard_blocks = ("transformer_blocks",)  # the SD3Transformer2DModel block list FSDP2 wraps (models/sharding.py)
    architecture = SD35_MEDIUM_ARCH

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        # the T5 tokens and CLIP's 77 joined in one stream
        return image_footprint(cls.architecture, int(args["resolution"]), int(args["max_sequence_length"]) + 77)

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        resolution: int = 512,
        lora_rank: int = 32,
        lora_alpha: float = 64,
        lora_targets: Sequence[str] | None = None,
        dtype: str = "float32",
        device: str | torch.device | None = None,
        gradient_checkpointing: bool = False,
        cache_size: int = 1024,
        max_sequence_length: int = 128,  # Flow-GRPO's scripts/train_sd3.py encodes prompts with 128 T5 tokens
        finetune: Finetune = "lora",
        lora_init: str = "gaussian",
        master_weights: str = "float32",
    ) -> None:
        super().__init__(path, **shared_arguments(locals()))
        factor = self.pipe.vae_scale_factor * self.transformer.config.patch_size
        if int(resolution) <= 0 or int(resolution) % factor:
            raise ConfigError(f"sd3 resolution must be a positive multiple of {factor}, got {resolution!r}")
        self.resolution = int(resolution)

    @property
    def latent_shape(self) -> tuple[int, ...]:
        size = self.resolution // self.pipe.vae_scale_factor
        return (self.transformer.config.in_channels, size, size)

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        return self.transformer(
            hidden_states=x,
            timestep=timestep,
            encoder_hidden_states=cond.tensors["prompt_embeds"],
            pooled_projections=cond.tensors["pooled_prompt_embeds"],
            return_dict=False,
        )[0]

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Latents -> images [B, 3, H, W] in [0, 1] (the pipeline's un-scaling, then ``vae.decode``)."""
        vae = self.pipe.vae
        latents = x0.to(device=self.device, dtype=vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        with self._autocast():
            images = vae.decode(latents, return_dict=False)[0]
        return self._to_unit_range(images)
