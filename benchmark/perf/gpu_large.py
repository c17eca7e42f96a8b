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

import time
import zlib
from collections import OrderedDict
from types import SimpleNamespace

import torch

from flowzoo.benchmark.perf import measure
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


def _random_transformer(cls_name: str, arch: dict, device: torch.device, dtype: torch.dtype, seed: int):
    import diffusers

    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        transformer = getattr(diffusers, cls_name)(**arch)
    # torch's own to(): diffusers' override warns on stderr about its (empty) list of float32 modules
    return torch.nn.Module.to(transformer, dtype=dtype).requires_grad_(False).eval()


def _setup(model, transformer, device, dtype, resolution, text_tokens, scheduler, lora_rank, targets):
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
    model._cache, model.cache_size = OrderedDict(), 64


def _decode_packed(model, x0: torch.Tensor) -> torch.Tensor:
    side = model._patches
    return torch.sigmoid(x0[..., :3].float()).transpose(1, 2).reshape(len(x0), 3, side, side)


class RandomFlux(FluxModel):
    """The flux adapter around a randomly initialised FluxTransformer2DModel."""

    def __init__(self, arch: dict, resolution: int, device: str, dtype: str, lora_rank: int = 128,
                 text_tokens: int = 512, seed: int = 0):
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        transformer = _random_transformer(self.transformer_class, arch, device, dtype, seed)
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
    a seeded draw in [text_tokens / 8, text_tokens] (the rest masked)."""

    def __init__(self, arch: dict, resolution: int, device: str, dtype: str, lora_rank: int = 64,
                 text_tokens: int = 512, seed: int = 0):
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        transformer = _random_transformer(self.transformer_class, arch, device, dtype, seed)
        _setup(self, transformer, device, dtype, resolution, text_tokens, QWEN_SCHEDULER, lora_rank,
               self.default_lora_targets)
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


#: (label, model family, algorithm) of each check; the algorithm runs its recipe's `flux` / `qwen_image` scope
CHECKS = (("flux", "dance_grpo"), ("flux", "mix_grpo"), ("qwen_image", "flow_grpo_fast"))


def _iterations(model, family: str, algorithm: str, overrides: dict, repeats: int, device: str) -> dict:
    """Median seconds of ``repeats`` training iterations on one prompt (after one untimed), peak memory."""
    from flowzoo import algorithms
    from flowzoo.benchmark.experiments.recipes import recipe

    config = {**recipe(algorithm, "", family), "group_size": 4, "micro_batch": 4, **overrides}
    config["minibatches"] = min(config.get("minibatches", 1), config["group_size"])
    alg = algorithms.get(algorithm)(model, MeanBrightness(), config, seed=0)
    state = model.trainable_state_dict()
    alg.step([measure.PROMPT])  # warm-up (allocator, kernels), not timed
    seconds, peak = [], 0.0
    for _ in range(repeats):
        measure._peak_reset(device)
        t0 = time.perf_counter()
        stats = alg.step([measure.PROMPT])
        seconds.append(time.perf_counter() - t0)
        peak = max(peak, measure._peak(device))
    model.load_trainable_state_dict(state)
    seconds.sort()
    return {"seconds": seconds[len(seconds) // 2], "peak_gib": peak, "nfe": stats.nfe_sampling,
            "num_steps": alg.num_steps}


def check(models: dict, overrides: dict, repeats: int, device: str) -> list[tuple[str, dict | str]]:
    """(label, timing or an out-of-memory line) for each check whose model family is in ``models``."""
    out = []
    for family, algorithm in CHECKS:
        if family not in models:
            continue
        label = f"{family}: {algorithm}"
        try:
            out.append((label, _iterations(models[family], family, algorithm, overrides, repeats, device)))
        except torch.cuda.OutOfMemoryError as error:
            out.append((label, f"out of GPU memory: {str(error).splitlines()[0]}"))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def report(results: list[tuple[str, dict | str]]) -> str:
    lines = []
    for label, result in results:
        lines.append(f"-- {label}")
        lines.append(result if isinstance(result, str) else
                     f"{result['seconds']:.3f} s/iteration (median; T {result['num_steps']}, "
                     f"{result['nfe']} sampling NFE), peak memory {result['peak_gib']:.2f} GiB")
    return "\n".join(lines)


def main(device: str, overrides: dict, repeats: int = 3, dtype: str = "bfloat16") -> None:
    """The FLUX- and Qwen-Image-shaped checks at full size, one model in memory at a time."""
    for family, cls, arch, resolution in (("flux", RandomFlux, FLUX1_DEV, 720),
                                          ("qwen_image", RandomQwenImage, QWEN_IMAGE, 512)):
        t0 = time.perf_counter()
        try:
            model = cls(arch, resolution, device, dtype)
        except torch.cuda.OutOfMemoryError as error:
            print(f"random {family} transformer: out of GPU memory while building it: {str(error).splitlines()[0]}")
            continue
        params = sum(p.numel() for p in model.transformer.parameters()) / 1e9
        print(f"random {family} transformer, {params:.2f} B parameters, {resolution} px, {dtype}, LoRA on the "
              f"released targets, device {device}, built in {time.perf_counter() - t0:.0f} s")
        print(report(check({family: model}, overrides, repeats, device)))
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def dry_run(repeats: int = 1) -> list[tuple[str, dict | str]]:
    """The same code at tiny sizes on the CPU in float32."""
    models = {"flux": RandomFlux(TINY_FLUX, 32, "cpu", "float32", lora_rank=4, text_tokens=6),
              "qwen_image": RandomQwenImage(TINY_QWEN, 32, "cpu", "float32", lora_rank=4, text_tokens=6)}
    results = check(models, {"group_size": 2, "num_steps": 6}, repeats, "cpu")  # T 6: MixGRPO's window 4 still fits
    print(report(results))
    return results

