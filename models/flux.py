"""FLUX.1-dev (diffusers ``FluxPipeline``: CLIP + T5 text encoders, ``FluxTransformer2DModel``, ``AutoencoderKL``) as
a FlowModel, with a peft LoRA on the transformer.

Matches the pipeline (diffusers 0.42, pipelines/flux/pipeline_flux.py):

* latents are **packed**: the VAE latent [C, h, w] is cut into 2 x 2 patches, one token of 4 C channels per patch
  (``_pack_latents``), so a sample is [(h/2)(w/2), 4 C]; ``decode`` unpacks them (``_unpack_latents``);
* prompts: the CLIP text model's pooled vector and the T5 sequence (``encode_prompt``); ``txt_ids`` are zeros and
  ``img_ids`` the patch grid (``_prepare_latent_image_ids``), both constant per resolution;
* FLUX.1-dev is guidance-distilled: the guidance value is an input of the transformer (``guidance``, the pipeline's
  ``guidance_scale``, 3.5 by default), not classifier-free guidance. This adapter's ``distilled_guidance`` is that
  input; the zoo's ``guidance`` stays true CFG against the negative prompt (the pipeline's ``true_cfg_scale``), 1 by
  default: the releases that train FLUX run no CFG (DanceGRPO fastvideo/train_grpo_flux_lora.py:173-186 at 15cc71d
  and MixGRPO fastvideo/train_grpo_flux.py:129-142 at e5cdd6a pass ``guidance=3.5`` with one conditional call;
  Flow-GRPO scripts/train_flux.py ``compute_log_prob`` at 27b6ef8 likewise with ``config.sample.guidance_scale``);
* the transformer takes ``timestep = sigma`` (the pipeline divides its ``t = 1000 sigma`` by 1000) and its output is
  the velocity ``noise - x0``;
* sigmas: ``linspace(1, 1/T, T)`` shifted with the resolution-dependent ``mu`` of ``calculate_shift`` (the
  scheduler's ``use_dynamic_shifting``), then 0. The exponential time shift with ``mu`` is the static shift
  ``e^mu``, so ``default_shift`` is ``e^mu`` of this resolution and ``default_sigma_grid`` is ``"flux"``
  (``algorithms.engine.sde.sigma_schedule``). DanceGRPO and MixGRPO instead train on ``sd3_time_shift(3,
  linspace(1, 0, T + 1))`` at 720 x 720 (finetune_flux_grpo_8gpus_lora.sh:39-40,50; their recipes' ``shift: 3`` and
  ``sigma_grid: linspace``), Flow-GRPO on the pipeline's own schedule at 512 x 512.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.ranges import AT_LEAST_1
from flowzoo.models import register
from flowzoo.models.base import Condition
from flowzoo.models.diffusers_common import DiffusersFlowModel, Finetune, shared_arguments
from flowzoo.models.footprint import Arch, Footprint, image_footprint

#: Flow-GRPO's FLUX LoRA targets (yifan123/flow_grpo scripts/train_flux.py:411-424 at 27b6ef8; LoraConfig(r=64,
#: lora_alpha=128, init_lora_weights="gaussian"), :425-430): the joint attention of the 19 double-stream blocks with
#: their image and text MLPs; the ``attn.`` suffixes also reach the q/k/v of the 38 single-stream blocks. On
#: FLUX.1-dev: 342 wrapped modules (tests/test_lora_targets.py)
FLUX_LORA_TARGETS = (
    "attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
)
#: DanceGRPO's FLUX LoRA targets (XueZeyue/DanceGRPO fastvideo/train_grpo_flux_lora.py:659-665 at 15cc71d,
#: ``target_modules=["to_k", "to_q", "to_v", "to_out.0"]`` with r 128, alpha 256 from
#: scripts/finetune/finetune_flux_grpo_8gpus_lora.sh:57-58): image-stream attention projections of the double blocks
#: and q/k/v of the single blocks (190 modules on FLUX.1-dev). MixGRPO releases no FLUX LoRA: its trainer fine-tunes
#: every weight (finetune_flux_grpo_MixGRPO.sh:135, learning rate 1e-5)
FLUX_DANCE_GRPO_LORA_TARGETS = ("to_k", "to_q", "to_v", "to_out.0")


def pipeline_shift(scheduler_config, image_seq_len: int) -> float:
    """The static shift equal to a FluxPipeline / QwenImagePipeline schedule at ``image_seq_len`` latent tokens.

    With ``use_dynamic_shifting`` the pipeline computes ``mu = calculate_shift(image_seq_len, base_image_seq_len,
    max_image_seq_len, base_shift, max_shift)`` (a line through (base_seq, base_shift) and (max_seq, max_shift)) and
    the scheduler shifts ``t`` to ``e^mu / (e^mu + 1/t - 1)`` (exponential) or ``mu / (mu + 1/t - 1)`` (linear): the
    static shift ``s t / (1 + (s - 1) t)`` with ``s = e^mu`` or ``s = mu``. Without it, the scheduler's ``shift``.
    """
    get = scheduler_config.get
    if not get("use_dynamic_shifting", False):
        return float(get("shift", 1.0))
    base_seq, max_seq = get("base_image_seq_len", 256), get("max_image_seq_len", 4096)
    base_shift, max_shift = get("base_shift", 0.5), get("max_shift", 1.15)
    slope = (max_shift - base_shift) / (max_seq - base_seq)
    mu = image_seq_len * slope + (base_shift - slope * base_seq)
    kind = get("time_shift_type", "exponential")
    if kind == "exponential":
        return math.exp(mu)
    if kind == "linear":
        return float(mu)
    raise ConfigError(f"unknown scheduler time_shift_type {kind!r}; known: exponential, linear")


def check_square_resolution(resolution, factor: int, model: str) -> int:
    if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution <= 0 or resolution % factor:
        raise ConfigError(f"{model} resolution must be a positive multiple of {factor} (VAE factor x 2 x 2 packing), "
                          f"got {resolution!r}")
    return resolution


#: FLUX.1-dev as the memory estimate reads it (counts checked by tests/test_memory_estimate.py against the transformer
#: built on the meta device from benchmark/perf/gpu_large.py FLUX1_DEV)
FLUX1_DEV_ARCH = Arch(
    "FLUX.1-dev", transformer_params=11_901_408_320, hidden=3072, blocks=19 + 38, text_width=4096,
    text_encoder_params=123_060_480 + 4_762_310_656,  # CLIPTextModel (L) + T5-XXL encoder
    vae_params=83_819_683, vae_channels=256,
    lora_widths={"default": 2_801_664, ("to_k", "to_q", "to_v", "to_out.0"): 1_167_360}, activation=17.0,
    source="black-forest-labs/FLUX.1-dev transformer/config.json (19 double + 38 single blocks, 24 x 128 heads), "
           "text_encoder*/config.json, vae/config.json")


@register("flux")
class FluxModel(DiffusersFlowModel):
    sample_kind = "image"
    default_guidance = 1.0  # no true CFG: FLUX.1-dev's guidance is the distilled embedding (distilled_guidance)
    #: e^mu at 512 x 512 on FLUX.1-dev's scheduler (1024 tokens: mu = 0.63); an instance computes its own resolution's
    default_shift = math.exp(0.5 + (1.15 - 0.5) / (4096 - 256) * (1024 - 256))
    default_sigma_grid = "flux"
    #: no cuDNN attention: its backward failed at FLUX.1-dev's 720 px shapes (4 x 2537 tokens, 24 heads x 128, bf16) on
    #: an H200 with torch 2.11.0+cu130 ("mha_graph.execute(...).is_good()", an illegal memory access without
    #: CUDA_LAUNCH_BLOCKING); flash attention ran the same DanceGRPO and MixGRPO iterations (docs/perf.md, the GPU
    #: check of 2026-12-04)
    attention_backends = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    default_num_steps = 12  # DanceGRPO's FLUX LoRA recipe (finetune_flux_grpo_8gpus_lora.sh:42); suites set their own
    default_eval_num_steps = 28  # FluxPipeline's num_inference_steps default; Flow-GRPO config/grpo.py:408 at 27b6ef8
    # samples per training-rollout call, decode and reward call: one, as the released FLUX trainers of the algorithms
    # the FLUX suite runs sample (XueZeyue/DanceGRPO fastvideo/train_grpo_flux_lora.py:264 and train_grpo_flux.py:326
    # at 15cc71d, Tencent-Hunyuan/MixGRPO fastvideo/train_grpo_flux.py:202 at e5cdd6a: batch_size = 1 per sampling
    # call; Flow-GRPO's FLUX configs sample 3, config/grpo.py pickscore_flux at 31c71b9)
    default_rollout_batch = 1
    pipeline_class = "FluxPipeline"
    transformer_class = "FluxTransformer2DModel"
    env_var = "FLOWZOO_FLUX_PATH"
    argument_ranges = {**DiffusersFlowModel.argument_ranges, "resolution": AT_LEAST_1}
    default_lora_targets = FLUX_LORA_TARGETS
    architecture = FLUX1_DEV_ARCH

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        return image_footprint(cls.architecture, int(args["resolution"]), int(args["max_sequence_length"]))
    #: FluxPipeline's exact sigma (the constructor's integer_timesteps sets it per instance)
    integer_timesteps: bool = False

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        resolution: int = 512,
        distilled_guidance: float = 3.5,
        finetune: Finetune = "lora",
        lora_init: str = "gaussian",
        master_weights: str = "float32",
        lora_rank: int = 64,
        lora_alpha: float = 128,
        lora_targets: Sequence[str] | None = None,
        dtype: str = "float32",
        device: str | torch.device | None = None,
        gradient_checkpointing: bool = False,
        cache_size: int = 1024,
        # the pipeline's default; DanceGRPO/MixGRPO preprocess with it. Flow-GRPO's FLUX trainer encodes with 128
        # (yifan123/flow_grpo scripts/train_flux.py:236,622 at 27b6ef8): a Flow-GRPO FLUX cell sets 128
        max_sequence_length: int = 512,
        # the transformer's timestep truncated to whole thousandths, int(1000 sigma) / 1000, as DanceGRPO's and
        # MixGRPO's FLUX trainers feed it in rollouts and training (DanceGRPO fastvideo/train_grpo_flux_lora.py:169,
        # 176, 450 at 15cc71d; MixGRPO fastvideo/utils/sampling_utils.py:64,71 and train_grpo_flux.py:387-390 at
        # e5cdd6a); false: FluxPipeline's exact sigma
        integer_timesteps: bool = False,
    ) -> None:
        if not isinstance(integer_timesteps, bool):
            raise ConfigError(f"{self.name} integer_timesteps must be true or false, got {integer_timesteps!r}")
        distilled_guidance = float(distilled_guidance)
        if not math.isfinite(distilled_guidance) or distilled_guidance < 0:
            raise ConfigError(f"{self.name} distilled_guidance must be a finite number >= 0, "
                              f"got {distilled_guidance!r}")
        super().__init__(path, **shared_arguments(locals()))
        self.resolution = check_square_resolution(resolution, self.pipe.vae_scale_factor * 2, self.name)
        self.distilled_guidance = distilled_guidance
        self.integer_timesteps = integer_timesteps
        self.guidance_embeds = bool(self.transformer.config.guidance_embeds)
        side = self.resolution // (self.pipe.vae_scale_factor * 2)  # patches per side
        self._patches = side
        self.default_shift = pipeline_shift(self.pipe.scheduler.config, side * side)
        self._img_ids = self.pipe._prepare_latent_image_ids(1, side, side, self.device, torch.float32)

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return (self._patches * self._patches, self.transformer.config.in_channels)

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=self.device, max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        return self._flux_call(x, timestep, cond, self._img_ids)

    def _flux_call(self, hidden: torch.Tensor, timestep: torch.Tensor, cond: Condition, img_ids: torch.Tensor
                   ) -> torch.Tensor:
        """One transformer call on the token sequence ``hidden`` at positions ``img_ids``, as the pipeline makes it."""
        embeds = cond.tensors["prompt_embeds"]
        guidance = None
        if self.guidance_embeds:
            guidance = torch.full((hidden.shape[0],), self.distilled_guidance, device=self.device, dtype=torch.float32)
        return self.transformer(
            hidden_states=hidden,
            # the pipeline's t / 1000: FLUX's transformer takes sigma (int(t) / 1000 with integer_timesteps, t >= 0)
            timestep=(torch.floor(timestep) if self.integer_timesteps else timestep) / 1000,
            guidance=guidance,
            pooled_projections=cond.tensors["pooled_prompt_embeds"],
            encoder_hidden_states=embeds,
            txt_ids=torch.zeros(embeds.shape[1], 3, device=self.device, dtype=embeds.dtype),
            img_ids=img_ids.to(embeds.dtype),
            return_dict=False,
        )[0]

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Packed latents -> images [B, 3, H, W] in [0, 1] (the pipeline's unpacking and un-scaling, ``vae.decode``)."""
        vae = self.pipe.vae
        latents = self.pipe._unpack_latents(x0.to(device=self.device, dtype=vae.dtype), self.resolution,
                                            self.resolution, self.pipe.vae_scale_factor)
        latents = latents / vae.config.scaling_factor + vae.config.shift_factor
        with self._autocast():
            images = vae.decode(latents, return_dict=False)[0]
        return self._to_unit_range(images)
