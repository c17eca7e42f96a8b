"""Qwen-Image (diffusers ``QwenImagePipeline``: Qwen2.5-VL text encoder, ``QwenImageTransformer2DModel``,
``AutoencoderKLQwenImage``) as a FlowModel, with a peft LoRA on the transformer.

Matches the pipeline (diffusers 0.42, pipelines/qwenimage/pipeline_qwenimage.py):

* prompts: the last hidden state of Qwen2.5-VL over the pipeline's chat template, the template's first 34 tokens
  dropped (``encode_prompt``), with the **mask** of its valid tokens. The pipeline pads a batch to its longest prompt;
  this adapter caches each prompt padded to ``max_sequence_length`` (mask 0 on the padding) and trims every
  transformer call to the longest valid prompt of its batch, as Flow-GRPO's ``compute_log_prob`` does
  (scripts/train_qwenimage.py:210-214 at 27b6ef8). Masked tokens are excluded from attention and the text RoPE
  positions count from the start, so padding changes the output by float rounding only. ``text_padding:
  attended`` passes no mask instead, as the Flow-GRPO release ran: its diffusers' Qwen-Image attention ignored
  ``encoder_hidden_states_mask`` (diffusers before 0.37), so a short prompt and the negative prompt ``" "``, padded
  to the longest prompt of the call's batch (flow_grpo/diffusers_patch/qwenimage_pipeline_with_logprob.py:73-82 at
  27b6ef8: prompts and negatives encoded as one batch), attended to their padding tokens;
* **true CFG** against a negative prompt with Qwen-Image's norm-preserving rescale: ``comb = u + g (c - u)`` then
  ``comb * ||c|| / ||comb||`` over each token's channels (``guide``). Flow-GRPO's Qwen-Image recipe samples and
  trains with the negative prompt ``" "`` and ``true_cfg_scale`` 4 (train_qwenimage.py:657-668; its
  ``compute_log_prob``, :217-230, makes one call on [cond; neg] without detaching either branch: ``cfg_grad:
  both``; config/grpo.py:528 ``guidance_scale = 4``);
* packed 2 x 2 latents [(h/2)(w/2), 4 C] as FLUX's, a one-frame video VAE un-normalised with ``latents_mean`` /
  ``latents_std``;
* ``timestep = sigma`` (the pipeline's ``t / 1000``); no guidance embedding (``guidance_embeds`` false);
* sigmas: ``linspace(1, 1/T, T)`` with the resolution's dynamic shift (``e^mu``, max_shift 0.9 over 8192 tokens in
  Qwen-Image's scheduler) and stretched to the scheduler's ``shift_terminal`` (0.02), then 0.
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
from flowzoo.models.flux import check_square_resolution, pipeline_shift

#: how a call's shorter prompts treat their padding (QwenImageModel's ``text_padding``): ``masked`` (diffusers >= 0.37,
#: the pipeline today) or ``attended`` (what the Flow-GRPO release ran: module docstring)
TEXT_PADDINGS = ("masked", "attended")
#: the host value (Condition.host) holding each row's valid prompt length
TEXT_LENGTH = "text_length"

#: Flow-GRPO's Qwen-Image LoRA targets (yifan123/flow_grpo scripts/train_qwenimage.py:410-423 at 27b6ef8;
#: LoraConfig(r=64, lora_alpha=128, init_lora_weights="gaussian"), :424-429): the joint attention and both streams'
#: MLPs of every block (720 modules on Qwen-Image's 60 blocks, tests/test_lora_targets.py)
QWEN_IMAGE_LORA_TARGETS = (
    "attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
)


#: Qwen-Image as the memory estimate reads it (counts checked by tests/test_memory_estimate.py against the transformer
#: built on the meta device from benchmark/perf/gpu_large.py QWEN_IMAGE)
QWEN_IMAGE_ARCH = Arch(
    "Qwen-Image", transformer_params=20_430_401_088, hidden=3072, blocks=60, text_width=3584,
    text_encoder_params=8_292_166_656,  # Qwen2.5-VL-7B-Instruct (the pipeline loads the whole model): 8.29 B
    vae_params=126_892_531, vae_channels=192,  # AutoencoderKLQwenImage (Wan2.1's VAE), base_dim 96
    lora_widths={"default": 6_635_520}, activation=29.0,
    source="Qwen/Qwen-Image transformer/config.json (60 blocks, 24 x 128 heads, text 3584), text_encoder "
           "(Qwen2.5-VL-7B-Instruct), vae/config.json")


@register("qwen_image")
class QwenImageModel(DiffusersFlowModel):
    sample_kind = "image"
    default_guidance = 4.0  # Flow-GRPO config/grpo.py:528 at 27b6ef8; the pipeline's true_cfg_scale default
    #: e^mu at 512 x 512 on Qwen-Image's scheduler (1024 tokens: mu = 0.5 + 0.4 * 768 / 7936); an instance computes
    #: its own resolution's
    default_shift = math.exp(0.5 + (0.9 - 0.5) / (8192 - 256) * (1024 - 256))
    default_sigma_grid = "flux"
    shift_terminal = 0.02  # Qwen-Image's scheduler; an instance reads its own scheduler's
    default_num_steps = 10  # Flow-GRPO config/grpo.py:526 at 27b6ef8 (pickscore_qwenimage)
    default_eval_num_steps = 50  # config/grpo.py:527
    # samples per training-rollout call, decode and reward call: Flow-GRPO's Qwen-Image sampling batch,
    # sample.train_batch_size 4 (config/grpo.py:531 at 27b6ef8, pickscore_qwenimage; DanceGRPO's Qwen-Image trainer
    # samples one at a time, XueZeyue/DanceGRPO fastvideo/train_grpo_qwenimage.py:306 at 15cc71d)
    default_rollout_batch = 4
    pipeline_class = "QwenImagePipeline"
    transformer_class = "QwenImageTransformer2DModel"
    env_var = "FLOWZOO_QWEN_IMAGE_PATH"
    argument_ranges = {**DiffusersFlowModel.argument_ranges, "resolution": AT_LEAST_1}
    default_lora_targets = QWEN_IMAGE_LORA_TARGETS
    architecture = QWEN_IMAGE_ARCH

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        return image_footprint(cls.architecture, int(args["resolution"]), int(args["max_sequence_length"]))
    #: Flow-GRPO's Qwen-Image negative prompt (scripts/train_qwenimage.py:660 at 27b6ef8)
    negative_prompt = " "
    #: today's pipeline: the text padding masked (the constructor's text_padding sets it per instance)
    text_padding: str = "masked"

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        resolution: int = 512,
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
        max_sequence_length: int = 512,  # QwenImagePipeline.__call__'s default
        text_padding: str = "masked",
    ) -> None:
        super().__init__(path, **shared_arguments(locals()))
        if self.max_sequence_length < 1:
            raise ConfigError(f"{self.name} max_sequence_length must be >= 1, got {max_sequence_length!r}")
        if text_padding not in TEXT_PADDINGS:
            raise ConfigError(f"{self.name} text_padding must be one of {', '.join(TEXT_PADDINGS)}, got "
                              f"{text_padding!r}")
        self.text_padding = text_padding
        self.resolution = check_square_resolution(resolution, self.pipe.vae_scale_factor * 2, self.name)
        side = self.resolution // (self.pipe.vae_scale_factor * 2)
        self._patches = side
        config = self.pipe.scheduler.config
        # the pipeline calls calculate_shift with max_image_seq_len defaulting to 4096 when the config lacks it
        self.default_shift = pipeline_shift({"max_image_seq_len": 4096, **dict(config)}, side * side)
        terminal = config.get("shift_terminal")
        self.shift_terminal = float(terminal) if terminal else None

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return (self._patches * self._patches, self.transformer.config.in_channels)

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        embeds, mask = self.pipe.encode_prompt(prompt=prompts, device=self.device,
                                               max_sequence_length=self.max_sequence_length)
        return self._padded(embeds, mask)

    def _padded(self, embeds: torch.Tensor, mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The pipeline's prompt embeddings and mask padded to ``max_sequence_length`` (mask 0 on the padding)."""
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        pad = self.max_sequence_length - embeds.shape[1]
        embeds = torch.nn.functional.pad(embeds, (0, 0, 0, pad))
        mask = torch.nn.functional.pad(mask.long(), (0, pad))
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def _host_values(self, tensors: dict[str, torch.Tensor]) -> dict[str, list]:
        """Each prompt's valid length (``text_length``), read from its mask once when it is encoded, as the pipeline
        reads its masks once per generation: each transformer call then trims to its rows' longest without a host
        sync."""
        return {TEXT_LENGTH: tensors["prompt_embeds_mask"].sum(dim=1).tolist()}

    def _text_length(self, cond: Condition) -> int:
        """The longest valid prompt of the call's rows: from the condition's host values, or (a condition built
        without them) read from the mask, one host sync."""
        lengths = cond.host.get(TEXT_LENGTH)
        if lengths is None:
            return self._read_text_length(cond.tensors["prompt_embeds_mask"])
        return max(max(lengths), 1)

    @staticmethod
    def _read_text_length(mask: torch.Tensor) -> int:
        """The longest valid prompt of a mask, read from the device (a host sync)."""
        return max(int(mask.sum(dim=1).max()), 1)

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        mask = cond.tensors["prompt_embeds_mask"]
        length = self._text_length(cond)  # the longest valid prompt of the batch
        return self.transformer(
            hidden_states=x,
            timestep=timestep / 1000,
            guidance=None,
            encoder_hidden_states=cond.tensors["prompt_embeds"][:, :length],
            # attended: no mask, the padding of the call's shorter prompts attended to (the release's diffusers)
            encoder_hidden_states_mask=mask[:, :length] if self.text_padding == "masked" else None,
            img_shapes=[self._img_shapes()] * x.shape[0],
            return_dict=False,
        )[0]

    def _img_shapes(self) -> list[tuple[int, int, int]]:
        """The (frames, rows, columns) of the latent grids in the transformer's image stream: the target's."""
        return [(1, self._patches, self._patches)]

    def guide(self, v_cond: torch.Tensor, v_uncond: torch.Tensor, guidance: float) -> torch.Tensor:
        """Qwen-Image's CFG: ``u + g (c - u)`` rescaled to the conditional velocity's norm per token (over the packed
        channels), as the pipeline and Flow-GRPO's ``compute_log_prob`` (train_qwenimage.py:227-230 at 27b6ef8)."""
        combined = v_uncond + guidance * (v_cond - v_uncond)
        return combined * (v_cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Packed latents -> images [B, 3, H, W] in [0, 1] (the pipeline's unpacking, un-normalising, one-frame
        ``vae.decode``)."""
        vae = self.pipe.vae
        latents = self.pipe._unpack_latents(x0.to(device=self.device, dtype=vae.dtype), self.resolution,
                                            self.resolution, self.pipe.vae_scale_factor)  # [B, C, 1, h, w]
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents)
        with self._autocast():
            images = vae.decode(latents * std + mean, return_dict=False)[0][:, :, 0]
        return self._to_unit_range(images)
