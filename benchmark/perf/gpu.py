"""``flowzoo perf --gpu-check`` (``make gpu-check``): ``flowzoo perf`` at SD3.5-Medium scale without any weights.

A randomly initialised ``SD3Transformer2DModel`` with SD3.5-Medium's published architecture (the
stabilityai/stable-diffusion-3.5-medium ``transformer/config.json``: 24 layers, 24 heads x 64, dual-attention layers
0-12, RMS QK-norm, joint dim 4096, caption projection 1536, pooled 2048, 16 latent channels, patch 2, positional
table 384) at 512 px, random prompt embeddings (77 CLIP + 128 T5 tokens, the Flow-GRPO recipe's length), bf16
weights under autocast, LoRA r32 in float32; the SD3 adapter's own code around it (LoRA, CFG, reference, autocast).
It times, on the released shapes (T = 10, CFG 4.5, the first 9 steps trained, KL 0.04), as many samples as the check
states (``group_size``, default 4, one prompt):

* Flow-GRPO, interleaved against the reference-style loop of ``benchmark/perf/measure.py``: once recomputing the trained steps
  (``reuse_rollout_graph=false``) and once with the defaults (recompute-free where valid); an out-of-memory error is
  reported as such and the check goes on;
* OP-GRPO: iterations with the buffer filled (half the groups replayed), seconds per iteration and peak memory.

Then the FLUX.1-dev- and Qwen-Image-shaped checks of ``benchmark/perf/gpu_large.py`` (seconds per iteration and peak
memory at DanceGRPO's, MixGRPO's and Flow-GRPO-Fast's released recipes for those models), one model in memory at a
time.

``dry_run`` runs the same code with tiny dimensions on the CPU in float32 (tests/test_gpu_check.py), where the
gradient check must hold to 1e-5; in bf16 on the GPU it is printed, not asserted.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from types import SimpleNamespace

import torch

from flowzoo.benchmark.perf import measure
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
        from diffusers import SD3Transformer2DModel

        FlowModel.__init__(self)
        self.device, self.dtype = resolve_device(device), resolve_dtype(dtype)
        with torch.random.fork_rng(devices=[]), torch.device(self.device):
            torch.manual_seed(seed)
            transformer = SD3Transformer2DModel(**arch)
        self.transformer = transformer.to(dtype=self.dtype).requires_grad_(False).eval()
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


def check(model, overrides: dict, repeats: int, device: str) -> list[tuple[str, dict | str]]:
    """(label, measure.run result or an out-of-memory line) per Flow-GRPO variant, then ("op_grpo", its timing)."""
    overrides = {"group_size": 4, **overrides}
    out = []
    # the recompute update with the CFG pair split (cfg_batch auto at this size) and in one batched call as the released
    # loop makes it: on the first GPU run (docs/perf.md) the split one was 1.38x the reference loop
    for label, extra in (("flow_grpo, recompute", {"reuse_rollout_graph": False}),
                         ("flow_grpo, recompute, batched CFG", {"reuse_rollout_graph": False, "cfg_batch": "batched"}),
                         ("flow_grpo, defaults", {})):
        try:
            out.append((label, measure.run(model, {**overrides, **extra}, repeats=repeats, device=device)))
        except torch.cuda.OutOfMemoryError as error:
            out.append((label, f"out of GPU memory: {str(error).splitlines()[0]}"))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    try:
        out.append(("op_grpo", _op_grpo(model, overrides, repeats, device)))
    except torch.cuda.OutOfMemoryError as error:
        out.append(("op_grpo", f"out of GPU memory: {str(error).splitlines()[0]}"))
    return out


def report(results: list[tuple[str, dict | str]], device: str, header: str) -> str:
    lines = [header]
    for label, result in results:
        lines.append(f"-- {label}")
        if isinstance(result, str):
            lines.append(result)
        elif label == "op_grpo":
            lines.append(f"{result['seconds']:.3f} s/iteration (median), peak memory {result['peak_gib']:.2f} GiB, "
                         f"off-policy fraction {result['off_policy_frac']:.2f}")
        else:
            lines.append(f"{result['ours']['total']:.3f} s/iteration (median; reference loop "
                         f"{result['reference']['total']:.3f})")
            lines.append(measure.format_result(result, device))
    return "\n".join(lines)


def main(device: str, overrides: dict, repeats: int = 3, arch: dict | None = None, resolution: int = 512,
         dtype: str = "bfloat16") -> int:
    if arch is None and not device.startswith("cuda"):
        raise ConfigError(f"perf --gpu-check: device {device!r} is not a GPU; run it with --device cuda (the CPU dry "
                          "run is tests/test_gpu_check.py)")
    arch = SD35_MEDIUM if arch is None else arch
    t0 = time.perf_counter()
    model = RandomSD3(arch, resolution, device, dtype, lora_rank=32)
    params = sum(p.numel() for p in model.transformer.parameters()) / 1e9
    header = (f"random SD3 transformer, {params:.2f} B parameters, {resolution} px, {dtype}, LoRA r32, "
              f"device {device}, built in {time.perf_counter() - t0:.0f} s")
    results = check(model, overrides, repeats, device)
    print(report(results, device, header))
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    # beside SD3.5-Medium: FLUX.1-dev- and Qwen-Image-shaped models at their released recipes (gpu_large.py)
    from flowzoo.benchmark.perf import gpu_large

    gpu_large.main(device, {k: v for k, v in overrides.items() if k == "group_size"}, repeats, dtype)
    return 0


def dry_run(repeats: int = 1) -> list[tuple[str, dict | str]]:
    """The GPU check's code path with tiny dimensions on the CPU, in float32 (seconds)."""
    model = RandomSD3(TINY, resolution=32, device="cpu", dtype="float32", lora_rank=4, text_tokens=6)
    results = check(model, {"group_size": 2, "num_steps": 6}, repeats, "cpu")
    print(report(results, "cpu", "dry run"))
    return results
