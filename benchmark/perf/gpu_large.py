"""``flowzoo perf --gpu-check`` beside SD3.5-Medium: FLUX.1-dev- and Qwen-Image-shaped random transformers under the
flux / qwen_image adapters' own code (packed latents, guidance embedding, true CFG with Qwen-Image's rescale, prompt
masks, LoRA on the released targets), timed and measured per training iteration at the released recipes.

* FLUX.1-dev (black-forest-labs/FLUX.1-dev transformer/config.json: 19 double + 38 single blocks, 24 heads x 128,
  T5 4096, pooled 768, guidance embedding; 11.9 B parameters) at 720 px with 512 T5 tokens, DanceGRPO's LoRA
  (r 128 on to_k/to_q/to_v/to_out.0): DanceGRPO's and MixGRPO's FLUX recipes (the ``flux`` scope of their
  recipe files: T 12 / 25, no CFG, the linspace grid with shift 3);
* Qwen-Image (Qwen/Qwen-Image transformer/config.json: 60 blocks, 24 heads x 128, text width 3584; 20.4 B
  parameters) at 512 px with 512 text tokens of which a prompt's length is valid, Flow-GRPO's LoRA (r 64 on its 12
  targets): Flow-GRPO-Fast's Qwen-Image recipe (T 10, window 2, true CFG 4 with both branches' gradient).

Each runs ``group_size`` samples (default 4) of one prompt per iteration; weights bf16 under autocast, LoRA in
float32. Prompt embeddings are seeded standard-normal draws, ``decode`` squashes three latent channels into an image
(the reward needs only images of the right kind). ``dry_run`` runs the same code at tiny sizes on the CPU
(tests/test_gpu_check.py).
"""

from __future__ import annotations

import contextlib
import zlib
from collections import OrderedDict
from types import SimpleNamespace

import torch

from flowzoo.benchmark.perf.pipeline import MeanBrightness
from flowzoo.models.base import FlowModel
from flowzoo.models.diffusers_common import resolve_device, resolve_dtype
from flowzoo.models.flux import FLUX_DANCE_GRPO_LORA_TARGETS, FluxModel, pipeline_shift
from flowzoo.models.qwen_image import QwenImageModel

#: black-forest-labs/FLUX.1-dev transformer/config.json (FluxTransformer2DModel arguments)
FLUX1_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                 num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                 axes_dims_rope=(16, 56, 56))
#: Qwen/Qwen-Image transformer/config.json (QwenImageTransformer2DModel arguments)
QWEN_IMAGE = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))
#: the schedulers' dynamic-shift settings (their scheduler_config.json)
FLUX_SCHEDULER = dict(use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5,
                      max_shift=1.15)
QWEN_SCHEDULER = dict(use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=8192, base_shift=0.5,
                      max_shift=0.9, shift_terminal=0.02)
#: the same kinds of blocks at tiny sizes: the CPU dry run
TINY_FLUX = dict(FLUX1_DEV, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
                 num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8, axes_dims_rope=(2, 2, 4))
TINY_QWEN = dict(QWEN_IMAGE, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                 joint_attention_dim=16, axes_dims_rope=(2, 2, 4))


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default floating dtype set to ``dtype`` inside the block (restored after it, also on an error)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def random_transformer(cls_name: str, arch: dict, device: torch.device, dtype: torch.dtype, seed: int):
    """A randomly initialised diffusers transformer built on ``device`` directly in ``dtype``: every parameter is
    created in that dtype (torch's default dtype during the build), so no float32 copy is ever held (Qwen-Image's
    20.9 B parameters built in float32 first took 77.7 GiB). Floating buffers are cast after (positional tables)."""
    import diffusers

    with torch.random.fork_rng(devices=[]), torch.device(device), default_dtype(dtype):
        torch.manual_seed(seed)
        transformer = getattr(diffusers, cls_name)(**arch)
    # torch's own to(): diffusers' override warns on stderr about its (empty) list of float32 modules
    return torch.nn.Module.to(transformer, dtype=dtype).requires_grad_(False).eval()


def _setup(model, transformer, device, dtype, resolution, text_tokens, scheduler, lora_rank, targets,
           gradient_checkpointing=False):
    """What the adapters read from a pipeline, without one (no text encoders, no VAE)."""
    from diffusers import FluxPipeline

    FlowModel.__init__(model)
    model.device, model.dtype = device, dtype
    model.transformer = transformer
    model.pipe = SimpleNamespace(vae_scale_factor=8, scheduler=SimpleNamespace(config=scheduler),
                                 _prepare_latent_image_ids=FluxPipeline._prepare_latent_image_ids)
    model.num_train_timesteps, model.max_sequence_length = 1000, text_tokens
    model.resolution, model.path = resolution, None
    model._patches = resolution // 16
    model.default_shift = pipeline_shift(scheduler, model._patches ** 2)
    model._lora_names = model._add_lora(int(lora_rank), 2.0 * lora_rank, targets)
    if gradient_checkpointing:
        transformer.enable_gradient_checkpointing(model._checkpointing_func())
    model._cache, model.cache_size = OrderedDict(), 64


def _decode_packed(model, x0: torch.Tensor) -> torch.Tensor:
    side = model._patches
    return torch.sigmoid(x0[..., :3].float()).transpose(1, 2).reshape(len(x0), 3, side, side)


class RandomFlux(FluxModel):
    """The flux adapter around a randomly initialised FluxTransformer2DModel."""

    def __init__(self, arch: dict, resolution: int, device: str, dtype: str, lora_rank: int = 128,
                 text_tokens: int = 512, seed: int = 0):
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        transformer = random_transformer(self.transformer_class, arch, device, dtype, seed)
        _setup(self, transformer, device, dtype, resolution, text_tokens, FLUX_SCHEDULER, lora_rank,
               FLUX_DANCE_GRPO_LORA_TARGETS)
        self.distilled_guidance, self.guidance_embeds = 3.5, bool(arch["guidance_embeds"])
        self._img_ids = self.pipe._prepare_latent_image_ids(1, self._patches, self._patches, self.device,
                                                            torch.float32)

    def _encode_prompts(self, prompts):
        cfg = self.transformer.config
        embeds, pooled = [], []
        for prompt in prompts:
            gen = torch.Generator().manual_seed(zlib.crc32(prompt.encode()))
            embeds.append(torch.randn(self.max_sequence_length, cfg.joint_attention_dim, generator=gen))
            pooled.append(torch.randn(cfg.pooled_projection_dim, generator=gen))
        return {"prompt_embeds": torch.stack(embeds).to(self.device, self.dtype),
                "pooled_prompt_embeds": torch.stack(pooled).to(self.device, self.dtype)}

    def decode(self, x0):
        return _decode_packed(self, x0)


class RandomQwenImage(QwenImageModel):
    """The qwen_image adapter around a randomly initialised QwenImageTransformer2DModel; a prompt's valid length is
    a seeded draw in [text_tokens / 8, text_tokens] (the rest masked). Gradient checkpointing on by default, as the
    release (activation_checkpointing) and the paper suite train it: without it one iteration peaked at 97.6 GiB."""

    def __init__(self, arch: dict, resolution: int, device: str, dtype: str, lora_rank: int = 64,
                 text_tokens: int = 512, seed: int = 0, gradient_checkpointing: bool = True):
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        transformer = random_transformer(self.transformer_class, arch, device, dtype, seed)
        _setup(self, transformer, device, dtype, resolution, text_tokens, QWEN_SCHEDULER, lora_rank,
               self.default_lora_targets, gradient_checkpointing)
        self.shift_terminal = QWEN_SCHEDULER["shift_terminal"]

    def _encode_prompts(self, prompts):
        width, length = self.transformer.config.joint_attention_dim, self.max_sequence_length
        embeds, masks = [], []
        for prompt in prompts:
            gen = torch.Generator().manual_seed(zlib.crc32(prompt.encode()))
            valid = int(torch.randint(max(length // 8, 1), length + 1, (1,), generator=gen))
            embeds.append(torch.randn(length, width, generator=gen))
            masks.append((torch.arange(length) < valid).long())
        return {"prompt_embeds": torch.stack(embeds).to(self.device, self.dtype),
                "prompt_embeds_mask": torch.stack(masks).to(self.device)}

    def decode(self, x0):
        return _decode_packed(self, x0)


#: each family's random model at full size: (class, architecture, resolution)
FULL = {"flux": ("RandomFlux", FLUX1_DEV, 720), "qwen_image": ("RandomQwenImage", QWEN_IMAGE, 512)}
#: and at the dry run's tiny size
TINY = {"flux": ("RandomFlux", TINY_FLUX, 32), "qwen_image": ("RandomQwenImage", TINY_QWEN, 32)}


def build(family: str, device: str, dtype: str, tiny: bool = False):
    cls_name, arch, resolution = (TINY if tiny else FULL)[family]
    cls = globals()[cls_name]
    if tiny:
        return cls(arch, resolution, device, dtype, lora_rank=4, text_tokens=6)
    return cls(arch, resolution, device, dtype)


def make_algorithm(model, family: str, algorithm: str, overrides: dict):
    """``algorithm`` at its released recipe for ``family`` (the recipe file's scope), 4 samples of one prompt and
    ``micro_batch`` 4 (the paper suites' memory setting) unless ``overrides`` say otherwise."""
    from flowzoo import algorithms
    from flowzoo.benchmark.config.recipes import recipe

    config = {**recipe(algorithm, "", family), "group_size": 4, "micro_batch": 4, **overrides}
    config["minibatches"] = min(config.get("minibatches", 1), config["group_size"])
    return algorithms.get(algorithm)(model, MeanBrightness(), config, seed=0)


def reference_for(alg, algorithm: str):
    """The released step structure of ``alg``'s algorithm (``reference.released_update``) around the adapter's
    transformer call: DanceGRPO / MixGRPO one sample per call, Flow-GRPO-Fast ``micro_batch`` samples per call."""
    from flowzoo.benchmark.perf.reference import RELEASED_STRUCTURE, adapter_velocity, released_update

    structure = RELEASED_STRUCTURE[algorithm]
    velocity = adapter_velocity(alg.model, alg.config.cfg_grad)
    rows = alg.config.micro_batch

    def reference(alg, traj, advantages):
        return released_update(alg, traj, advantages, structure, rows_per_call=rows, velocity=velocity,
                               detach_uncond=alg.config.cfg_grad == "cond")

    return reference
