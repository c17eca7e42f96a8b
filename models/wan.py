"""Wan2.1 text-to-video (diffusers ``WanPipeline``, Wan2.1-T2V-1.3B-Diffusers layout: UMT5 encoder,
``WanTransformer3DModel``, ``AutoencoderKLWan``) as a FlowModel, with a peft LoRA on the transformer.

Matches the pipeline (diffusers 0.42, pipelines/wan/pipeline_wan.py): prompts are cleaned and encoded by UMT5 with
the padding positions zeroed; the transformer is called with ``timestep = sigma * 1000`` and its output is the
velocity; CFG is ``uncond + g * (cond - uncond)``; decoding un-normalises with the VAE's ``latents_mean`` /
``latents_std`` and returns [B, F, C, H, W] in [0, 1]. Recipe defaults from Flow-GRPO (config/grpo.py,
``general_ocr_wan2_1``): 33 frames at 240 x 416, 20 training / 50 evaluation steps, CFG 4.5, 512 text tokens,
VAE kept in float32 (scripts/train_wan2_1.py). Shift 3.0 is the Wan2.1 scheduler's ``flow_shift`` for 480p.

Sigma grid (``default_sigma_grid = "unipc_flow"``, training and evaluation): the flow sigmas of Wan2.1's scheduler,
``UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)`` with diffusers'
other defaults (num_train_timesteps 1000, final_sigmas_type "zero"). The zoo cannot download the checkpoint's
``scheduler/scheduler_config.json``; it takes the configuration diffusers documents for Wan2.1 at 480p (diffusers
0.42.1 pipelines/wan/pipeline_wan.py:52-59: ``UniPCMultistepScheduler`` with ``flow_shift`` 3.0 for 480P, 5.0 for
720P), which is the scheduler Flow-GRPO's Wan trainer keeps: its pipeline calls ``scheduler.set_timesteps(T)`` and
steps on ``scheduler.sigmas`` (yifan123/flow_grpo flow_grpo/diffusers_patch/wan_pipeline_with_logprob.py:229-230,
44-47 at 27b6ef8). As there, the sampler takes its own step (SDE for training, Euler for evaluation) between these
sigmas; UniPC's multistep predictor-corrector is not run. At T 20 the last non-zero sigma is 0.139 (SD3's Euler grid:
0.0089). A directory whose scheduler is another (the tests' tiny pipeline) still gets this grid: the zoo's Wan is
Wan2.1's released sampler, not whatever a directory ships.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.ranges import AT_LEAST_1
from flowzoo.models import register
from flowzoo.models.base import Condition
from flowzoo.models.diffusers_common import (WAN_LORA_TARGETS, DiffusersFlowModel, Finetune, check_dtype_argument,
                                             shared_arguments)
from flowzoo.models.footprint import Arch, Footprint


#: Wan2.1-T2V's two sizes as the memory estimate reads them, by the transformer's ``num_layers`` (counts checked by
#: tests/test_memory_estimate.py against the transformers built on the meta device); the activation coefficient is
#: SD3's (no Wan figure was measured)
WAN_ARCHES = {
    30: Arch("Wan2.1-T2V-1.3B", transformer_params=1_418_996_800, hidden=1536, blocks=30, text_width=4096,
             text_encoder_params=5_680_910_336,  # umT5-XXL encoder (UMT5EncoderModel)
             vae_params=126_892_531, vae_channels=192,  # AutoencoderKLWan, base_dim 96, dim_mult (1, 2, 4, 4)
             lora_widths={"default": 737_280}, activation=27.0,
             source="Wan-Video/Wan2.1 wan/configs/wan_t2v_1_3B.py (dim 1536, ffn 8960, 12 heads, 30 layers); "
                    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"),
    40: Arch("Wan2.1-T2V-14B", transformer_params=14_288_491_584, hidden=5120, blocks=40, text_width=4096,
             text_encoder_params=5_680_910_336, vae_params=126_892_531, vae_channels=192,
             lora_widths={"default": 3_276_800}, activation=27.0,
             source="Wan-Video/Wan2.1 wan/configs/wan_t2v_14B.py (dim 5120, ffn 13824, 40 heads, 40 layers); "
                    "Wan-AI/Wan2.1-T2V-14B-Diffusers"),
}


@register("wan")
class WanModel(DiffusersFlowModel):
    sample_kind = "video"
    default_guidance = 4.5
    default_shift = 3.0
    default_num_steps = 20
    default_eval_num_steps = 50
    default_sigma_grid = "unipc_flow"  # Wan2.1's UniPC flow sigmas (module docstring: which config and why)
    # samples per training-rollout call, decode and reward call: Flow-GRPO's Wan2.1 sampling batch,
    # sample.train_batch_size 8 (yifan123/flow_grpo config/grpo.py:43 at 31c71b9, general_ocr_wan2_1; DanceGRPO's Wan
    # trainer samples one at a time, fastvideo/train_grpo_wan_2_1.py:294 at 15cc71d)
    default_rollout_batch = 8
    pipeline_class = "WanPipeline"
    transformer_class = "WanTransformer3DModel"
    env_var = "FLOWZOO_WAN_PATH"
    argument_ranges = {**DiffusersFlowModel.argument_ranges, "vae_dtype": check_dtype_argument, "frames": AT_LEAST_1,
                       "height": AT_LEAST_1, "width": AT_LEAST_1}
    default_lora_targets = WAN_LORA_TARGETS  # attn1 and attn2, as Flow-GRPO's Wan trainer
    shard_blocks = ("blocks",)  # the WanTransformer3DModel block list FSDP2 wraps (models/sharding.py)
    architecture = WAN_ARCHES[30]  # the 1.3 B the suites run

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        """The size the pipeline directory's transformer config names when it is on this machine (else the 1.3 B the
        suites run); text enters by cross-attention, not the stream; the VAE decodes one latent frame (4 frames) at a
        time."""
        import json
        from pathlib import Path

        path = args.get("path") or os.environ.get(cls.env_var)
        try:
            config = json.loads((Path(path) / "transformer" / "config.json").read_text()) if path else {}
        except (OSError, ValueError):
            config = {}
        arch = WAN_ARCHES.get(config.get("num_layers"), cls.architecture)
        frames, height, width = int(args["frames"]), int(args["height"]), int(args["width"])
        latent_frames = (frames - 1) // 4 + 1
        return Footprint(arch, latent_frames * (height // 16) * (width // 16), int(args["max_sequence_length"]),
                         16 * latent_frames * (height // 8) * (width // 8), 4 * height * width)

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        frames: int = 33,
        height: int = 240,
        width: int = 416,
        lora_rank: int = 32,
        lora_alpha: float = 64,
        lora_targets: Sequence[str] | None = None,
        dtype: str = "float32",
        vae_dtype: str = "float32",
        device: str | torch.device | None = None,
        gradient_checkpointing: bool = False,
        cache_size: int = 1024,
        max_sequence_length: int = 512,
        finetune: Finetune = "lora",
        lora_init: str = "gaussian",
        master_weights: str = "float32",
    ) -> None:
        super().__init__(path, component_dtypes={"vae": vae_dtype}, **shared_arguments(locals()))
        temporal = self.pipe.vae_scale_factor_temporal
        spatial = self.pipe.vae_scale_factor_spatial * self.transformer.config.patch_size[1]
        if int(frames) < 1 or (int(frames) - 1) % temporal:
            raise ConfigError(f"wan frames must be {temporal} * k + 1, got {frames!r}")
        for key, value in (("height", height), ("width", width)):
            if int(value) <= 0 or int(value) % spatial:
                raise ConfigError(f"wan {key} must be a positive multiple of {spatial}, got {value!r}")
        self.frames, self.height, self.width = int(frames), int(height), int(width)
        self._check_generation()

    def _check_generation(self) -> None:
        """Wan2.1 only: a Wan2.2 directory (a second expert ``transformer_2``, a ``boundary_ratio``, per-token
        timesteps) run through this adapter would sample with its high-noise expert alone; it is wan22's."""
        config = self.pipe.config
        if (getattr(self.pipe, "transformer_2", None) is not None or config.get("boundary_ratio") is not None
                or config.get("expand_timesteps")):
            raise ConfigError(f"model 'wan': {str(self.path)!r} holds a Wan2.2 pipeline (transformer_2, "
                              f"boundary_ratio or expand_timesteps in model_index.json); the adapter for it: wan22")

    @property
    def latent_shape(self) -> tuple[int, ...]:
        latent_frames = (self.frames - 1) // self.pipe.vae_scale_factor_temporal + 1
        s = self.pipe.vae_scale_factor_spatial
        return (self.transformer.config.in_channels, latent_frames, self.height // s, self.width // s)

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return {"prompt_embeds": embeds}

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        return self.transformer(
            hidden_states=x,
            timestep=timestep,
            encoder_hidden_states=cond.tensors["prompt_embeds"],
            return_dict=False,
        )[0]

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Latents [B, C, f, h, w] -> videos [B, F, 3, H, W] in [0, 1]."""
        vae = self.pipe.vae
        latents = x0.to(device=self.device, dtype=vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents)
        video = vae.decode(latents * std + mean, return_dict=False)[0]  # [B, C, F, H, W] in [-1, 1]
        return self._to_unit_range(video.permute(0, 2, 1, 3, 4))
