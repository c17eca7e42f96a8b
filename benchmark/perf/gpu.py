"""``flowzoo perf --gpu-check``: the GPU path at SD3.5-Medium, FLUX.1-dev and Qwen-Image scale, without weights, timed
against the released step structures in one process, sized for one H100 80 GB in 8 minutes (``gpu_plan.py``).

A randomly initialised ``SD3Transformer2DModel`` with SD3.5-Medium's published architecture (the
stabilityai/stable-diffusion-3.5-medium ``transformer/config.json``: 24 layers, 24 heads x 64, dual-attention layers
0-12, RMS QK-norm, joint dim 4096, caption projection 1536, pooled 2048, 16 latent channels, patch 2, positional
table 384) at 512 px, random prompt embeddings (77 CLIP + 128 T5 tokens, the Flow-GRPO recipe's length), built
directly in bf16, LoRA r32 in float32; the SD3 adapter's own code around it (LoRA, CFG, reference, autocast). Then
the FLUX.1-dev- and Qwen-Image-shaped models of ``gpu_large.py``, one model in memory at a time.

Every variant of ``gpu_plan.DEFAULT`` with a reference is timed against the released step structure on the same
rollouts (``paired.py``, ``reference.released_update``) and prints its ratio ours / reference; a variant whose
expected memory would not fit, or whose expected time would pass the budget, is skipped and says so; an allocation
failure ends only its own variant.

``dry_run`` runs the same code with tiny dimensions on the CPU in float32 (tests/test_gpu_check.py), where each
reference's gradient must equal ours (1e-5); in bf16 on the GPU the check is not run (the reference's transformer
output stays bf16 where our adapter casts it to float32, so its PPO ratios clip differently: docs/perf.md).
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from types import SimpleNamespace

import torch

from flowzoo.benchmark.perf import gpu_large, gpu_plan, measure
from flowzoo.benchmark.perf.paired import format_pairs, gradient_difference, time_pairs
from flowzoo.errors import ConfigError
from flowzoo.models.base import FlowModel
from flowzoo.models.diffusers_common import resolve_device, resolve_dtype
from flowzoo.models.sd3 import SD3Model

#: stabilityai/stable-diffusion-3.5-medium transformer/config.json (diffusers SD3Transformer2DModel arguments)
SD35_MEDIUM = dict(
    sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
    num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
    pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)
#: the same kinds of layers (dual attention, QK-norm) at tiny sizes: the CPU dry run
TINY = dict(
    sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=8,
    num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=24,
    pos_embed_max_size=16, dual_attention_layers=(0,), qk_norm="rms_norm",
)
#: CLIP 77 + T5 128 tokens (Flow-GRPO scripts/train_sd3.py encodes prompts with max_sequence_length 128)
TEXT_TOKENS = 77 + 128


class RandomSD3(SD3Model):
    """The SD3 adapter around a randomly initialised transformer: no pipeline directory, text encoders or VAE.

    Prompt embeddings are standard-normal draws seeded by the prompt's CRC32 (the empty prompt included); ``decode``
    squashes the first three latent channels into [0, 1] (the rewards here only need images of the right kind)."""

    def __init__(self, arch: dict, resolution: int, device: str, dtype: str, lora_rank: int,
                 text_tokens: int = TEXT_TOKENS, seed: int = 0):
        FlowModel.__init__(self)
        self.device, self.dtype = resolve_device(device), resolve_dtype(dtype)
        self.transformer = gpu_large.random_transformer("SD3Transformer2DModel", arch, self.device, self.dtype, seed)
        # what the adapter (and the reference loop) read from a pipeline
        self.pipe = SimpleNamespace(vae_scale_factor=8, scheduler=SimpleNamespace(
            config=SimpleNamespace(num_train_timesteps=1000)))
        self.num_train_timesteps = 1000
        self.max_sequence_length = text_tokens
        self.resolution = int(resolution)
        self.path = None
        self._lora_names = self._add_lora(int(lora_rank), 2.0 * lora_rank, self.default_lora_targets)
        self._cache: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self.cache_size = 64

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        cfg = self.transformer.config
        embeds, pooled = [], []
        for prompt in prompts:
            gen = torch.Generator().manual_seed(zlib.crc32(prompt.encode()))
            embeds.append(torch.randn(self.max_sequence_length, cfg.joint_attention_dim, generator=gen))
            pooled.append(torch.randn(cfg.pooled_projection_dim, generator=gen))
        return {"prompt_embeds": torch.stack(embeds).to(self.device, self.dtype),
                "pooled_prompt_embeds": torch.stack(pooled).to(self.device, self.dtype)}

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x0[:, :3].float())


def _op_grpo(model, overrides: dict, repeats: int, device: str) -> dict:
    """OP-GRPO iterations on two prompts with half the groups replayed once the buffer holds them (from the second
    iteration on): median seconds per iteration over ``repeats`` such iterations, peak memory."""
    config = {"off_policy_groups": 0.5, "t_off": 5, **overrides}
    alg = measure.make_algorithm(model, config, name="op_grpo")
    state = model.trainable_state_dict()
    prompts = [measure.PROMPT, "two red dogs"]
    alg.step(prompts)  # fills the buffer, not timed
    seconds, peak, replayed = [], 0.0, []
    for _ in range(repeats):
        measure._peak_reset(device)
        t0 = time.perf_counter()
        stats = alg.step(prompts)
        seconds.append(time.perf_counter() - t0)
        peak = max(peak, measure._peak(device))
        replayed.append(stats.extra.get("off_policy_frac", 0.0))
    model.load_trainable_state_dict(state)
    seconds.sort()
    return {"seconds": seconds[len(seconds) // 2], "peak_gib": peak, "off_policy_frac": max(replayed)}


def build(family: str, device: str, dtype: str, tiny: bool = False):
    """A family's random model: full size, or the dry run's tiny one."""
    if family == "sd3":
        if tiny:
            return RandomSD3(TINY, resolution=32, device=device, dtype=dtype, lora_rank=4, text_tokens=6)
        return RandomSD3(SD35_MEDIUM, 512, device, dtype, lora_rank=32)
    return gpu_large.build(family, device, dtype, tiny)


def make_algorithm(model, variant: gpu_plan.Variant, overrides: dict):
    if variant.family == "sd3":  # the released SD3 shapes (measure.make_algorithm: T 10, CFG 4.5), 4 samples
        return measure.make_algorithm(model, {"group_size": 4, **variant.overrides, **overrides},
                                      name=variant.algorithm)
    return gpu_large.make_algorithm(model, variant.family, variant.algorithm, {**variant.overrides, **overrides})


def reference_for(alg, variant: gpu_plan.Variant):
    """The released update a variant is timed against: SD3 Flow-GRPO's loop (``measure.reference_update``'s, one call
    per trained timestep on the minibatch), or ``gpu_large.reference_for``."""
    if variant.reference == "flow_grpo_sd3":
        from flowzoo.benchmark.perf.reference import released_update

        return lambda alg, traj, advantages: released_update(alg, traj, advantages, "per_timestep")
    return gpu_large.reference_for(alg, variant.algorithm)


def run_one(model, variant: gpu_plan.Variant, overrides: dict, repeats: int, device: str,
            check_gradient: bool = False) -> dict:
    """One variant: OP-GRPO's iterations, or our iteration against the released update (and, on the CPU dry run,
    the gradient check)."""
    if variant.reference is None:
        return _op_grpo(model, {"group_size": 4, **variant.overrides, **overrides}, repeats, device)
    alg = make_algorithm(model, variant, overrides)
    reference = reference_for(alg, variant)
    result = time_pairs(alg, [measure.PROMPT], reference, repeats, device)
    result["grad_rel_diff"] = gradient_difference(alg, [measure.PROMPT], reference) if check_gradient else None
    return result


def format_result(name: str, result: dict | str, device: str) -> str:
    if isinstance(result, str):
        return f"-- {name}\n{result}"
    if "ratio" not in result:
        return (f"-- {name}\n{result['seconds']:.3f} s/iteration (median), peak memory {result['peak_gib']:.2f} GiB, "
                f"off-policy fraction {result['off_policy_frac']:.2f}")
    return f"-- {name}\n" + format_pairs(result, device)


def main(device: str, overrides: dict, repeats: int = gpu_plan.REPEATS, variants=gpu_plan.DEFAULT,
         dtype: str = "bfloat16", tiny: bool = False, device_gib: float | None = None,
         budget: gpu_plan.Budget | None = None, check_gradient: bool = False) -> list[tuple[str, dict | str]]:
    """The check: the plan, then each family's model built once and its variants run in order (a variant skipped
    by memory or budget, or ended by an allocation failure, says so in one line). Returns (name, result or line)."""
    if not tiny and not device.startswith("cuda"):
        raise ConfigError(f"perf --gpu-check: device {device!r} is not a GPU; run it with --device cuda (the CPU dry "
                          "run is tests/test_gpu_check.py; --plan lists the variants)")
    budget = budget or gpu_plan.Budget()
    if device_gib is None:
        device_gib = gpu_plan.device_memory_gib(device)
    print(gpu_plan.format_plan(variants, device_gib), flush=True)
    out = []
    families = list(dict.fromkeys(v.family for v in variants))
    for family in families:
        todo = [v for v in variants if v.family == family]
        step = next(b for b in gpu_plan.BUILDS if b.family == family)
        fits = [v for v in todo if device_gib is None or v.fits(device_gib)]
        refusal = budget.refuses(step.expected_s + min((v.expected_s for v in fits), default=0.0)) if fits else None
        model, line = None, refusal and f"not built: {refusal}"
        if fits and refusal is None:
            t0 = time.perf_counter()
            try:
                model = build(family, device, dtype, tiny)
            except Exception as error:  # noqa: BLE001 (allocation failures only)
                if not gpu_plan.is_allocation_failure(error):
                    raise
                line = f"allocation failure while building the {family} model: {gpu_plan._first_line(error)}"
            if model is None:
                gpu_plan.free_memory()
            else:
                params = sum(p.numel() for p in model.transformer.parameters()) / 1e9
                print(f"== random {family} transformer, {params:.2f} B parameters, {dtype}, device {device}, built in "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
        for variant in todo:
            if model is None and line is not None and variant in fits:
                result = line
            else:
                result = gpu_plan.run_variant(
                    variant, lambda: run_one(model, variant, overrides, repeats, device, check_gradient), budget,
                    device_gib)
            print(format_result(variant.name, result, device), flush=True)
            out.append((variant.name, result))
        del model
        gpu_plan.free_memory()
    print(f"done in {budget.elapsed():.0f} s of command time (start-up allowance included; budget "
          f"{budget.limit_s:.0f} s)", flush=True)
    return out


def dry_run(repeats: int = 1, variants=gpu_plan.DEFAULT, device_gib: float | None = None,
            budget: gpu_plan.Budget | None = None) -> list[tuple[str, dict | str]]:
    """The GPU check's code path with tiny dimensions on the CPU, in float32 (seconds), with the gradient check."""
    budget = budget or gpu_plan.Budget(limit_s=float("inf"), startup_s=0.0)
    return main("cpu", {"group_size": 2, "num_steps": 6}, repeats, variants, dtype="float32", tiny=True,
                device_gib=device_gib, budget=budget, check_gradient=True)
