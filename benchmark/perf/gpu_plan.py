"""The GPU check's plan (``flowzoo perf --gpu-check``): its variants with their expected memory and time, the time
budget, the rules that skip a variant (memory that would not fit, a start past the budget) and the handling of an
allocation failure, which ends only its own variant. No model code here: ``gpu.py`` and ``gpu_large.py`` run them.

Expected figures come from the first GPU run (one H200, 2026-12-04; docs/perf.md "The first GPU run"): a figure is
either *measured* there, or *estimated* from those measurements, and says which in its ``source``. Seconds are for an
H100 80 GB: the H200 seconds x ``H100_PER_H200`` (the two share the bf16 matrix peak, the H100 has 0.7x the memory
bandwidth; no H100 run yet). Memory is the peak allocated on the GPU; it does not depend on the card. The
memory rule (``expected_gib > device memory x MEMORY_SHARE``) stands until a memory estimate of the cell replaces it.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import torch

#: command time the check is sized for (8 minutes on one H100 80 GB)
BUDGET_S = 480.0
#: H100 seconds per H200 second (an allowance, not a measurement: see the module docstring)
H100_PER_H200 = 1.15
#: a variant is skipped when its expected peak exceeds this share of the device's memory
MEMORY_SHARE = 0.95
#: timed repeats per variant, after one untimed warm-up (docs/perf.md)
REPEATS = 3
#: before the first variant: installing the carried wheel, imports, CUDA start-up (H200 seconds, estimated)
STARTUP_H200_S = 20.0


@dataclass(frozen=True)
class Variant:
    """One timed configuration of the check. ``reference``: the released structure it is timed against
    (``benchmark/perf/reference.py``), or None. ``h200_s``: expected seconds of the whole variant on an H200 (warm-up
    and ``REPEATS`` pairs); ``expected_gib``: expected peak GPU memory; each with its source."""

    name: str
    family: str  # sd3 | flux | qwen_image: the model it runs on (built once per family)
    algorithm: str
    overrides: dict = field(default_factory=dict)
    reference: str | None = None
    expected_gib: float = 0.0
    gib_source: str = ""
    h200_s: float = 0.0
    seconds_source: str = ""
    default: bool = True
    why_not_default: str = ""

    @property
    def expected_s(self) -> float:
        """Expected seconds on an H100."""
        return self.h200_s * H100_PER_H200


@dataclass(frozen=True)
class Build:
    """Building one family's random transformer (once, before its variants)."""

    family: str
    h200_s: float
    source: str

    @property
    def expected_s(self) -> float:
        return self.h200_s * H100_PER_H200


# The H200 run's figures (docs/perf.md): SD3 Flow-GRPO recompute ours 8.04 s/iteration (sampling 1.60, training 6.31),
# the released loop 5.84 (its update 5.84 - 1.60 = 4.24); kept graph ours 4.95 (2.34 / 2.63); OP-GRPO 7.61;
# FLUX DanceGRPO 13.09, MixGRPO 17.88, Qwen-Image Flow-GRPO-Fast 10.30 s/iteration (phases not recorded). A variant
# with a reference runs 1 + REPEATS pairs of (our iteration, the released update on the same rollout); where a phase
# split was not recorded, the update's share is estimated from the row-passes of the released recipe (a forward and
# backward pass = 3 forwards, 4 with gradient checkpointing): DanceGRPO 72 of 120 (0.6), MixGRPO 48 of 148 (0.32).
_PAIRS = 1 + REPEATS
BUILDS = (
    Build("sd3", 15.0, "measured: 15 s on the H200 (in float32, then cast)"),
    Build("flux", 2.0, "measured: 2 s on the H200"),
    Build("qwen_image", 5.0, "estimated (not timed on the H200)"),
)

VARIANTS = (
    Variant("sd3: flow_grpo, recompute", "sd3", "flow_grpo", {"reuse_rollout_graph": False}, "flow_grpo_sd3",
            23.1, "measured: the released loop's 23.1 GiB peak (ours 14.2) on the H200",
            _PAIRS * (8.04 + 4.24), "measured per pair on the H200: ours 8.04 + the released update 4.24"),
    Variant("sd3: flow_grpo, recompute, batched CFG", "sd3", "flow_grpo",
            {"reuse_rollout_graph": False, "cfg_batch": "batched"}, "flow_grpo_sd3",
            23.1, "estimated: the released loop's measured 23.1 GiB (the same rows per call with gradient)",
            _PAIRS * (1.60 + 4.24 + 4.24), "estimated: ours' rollout 1.60 + an update as long as the released 4.24, twice"),
    Variant("sd3: flow_grpo, kept rollout graph (defaults)", "sd3", "flow_grpo", {}, "flow_grpo_sd3",
            85.6, "measured: 85.6 GiB peak on the H200 (the released loop 23.1)",
            _PAIRS * (4.95 + 4.24), "measured per pair on the H200: ours 4.95 + the released update 4.24",
            default=False, why_not_default="85.6 GiB: does not fit an 80 GB GPU"),
    Variant("sd3: op_grpo", "sd3", "op_grpo", {}, None,
            23.7, "measured: 23.7 GiB on the H200",
            (1 + REPEATS) * 7.61, "measured: 7.61 s/iteration on the H200",
            default=False, why_not_default="no released reference to compare with; its 35 s keep the default list "
                                           "inside the budget with a margin"),
    Variant("flux: dance_grpo", "flux", "dance_grpo", {}, "dance_grpo",
            52.1, "measured: 52.1 GiB peak on the H200 (ours; the released update calls 1 row at a time)",
            _PAIRS * (13.09 + 0.6 * 13.09), "measured 13.09 s/iteration on the H200, the released update estimated "
                                            "at ours' 0.6 share"),
    Variant("flux: mix_grpo", "flux", "mix_grpo", {}, "mix_grpo",
            38.8, "measured: 38.8 GiB peak on the H200 (ours)",
            _PAIRS * (17.88 + 0.32 * 17.88), "measured 17.88 s/iteration on the H200, the released update estimated "
                                             "at ours' 0.32 share"),
    Variant("qwen_image: flow_grpo_fast", "qwen_image", "flow_grpo_fast", {}, "flow_grpo_fast",
            46.0, "estimated: 97.6 GiB measured on the H200 without gradient checkpointing; with it, as the paper "
                  "suite and the release train, 38.9 GiB of bf16 weights + 60 block inputs and one block's "
                  "activations (58.7 / 60 GiB) + LoRA and AdamW state: about 46",
            _PAIRS * (10.30 * 144 / 128 + 10.30 * 64 / 128), "measured 10.30 s/iteration on the H200 without "
                                                             "checkpointing; with it 144 / 128 of that, the released "
                                                             "update 64 / 128"),
)

DEFAULT = tuple(v for v in VARIANTS if v.default)


def plan_total_s(variants=DEFAULT) -> float:
    """Expected H100 seconds of the check: start-up, each family's build, each variant."""
    families = {v.family for v in variants}
    return (STARTUP_H200_S * H100_PER_H200 + sum(b.expected_s for b in BUILDS if b.family in families)
            + sum(v.expected_s for v in variants))


def format_plan(variants=DEFAULT, device_gib: float | None = None) -> str:
    """The dry-run listing: every variant with its expected memory and H100 seconds, the total against the budget."""
    lines = [f"GPU check plan: {REPEATS} timed repeats after one warm-up per variant; budget {BUDGET_S:.0f} s of "
             f"command time; seconds expected on an H100 = the H200 figures x {H100_PER_H200} (docs/perf.md)"]
    if device_gib is not None:
        lines.append(f"device memory {device_gib:.1f} GiB: a variant expected above {MEMORY_SHARE * device_gib:.1f} "
                     "GiB is skipped")
    lines.append(f"{'':3s}{'variant':48s} {'ref':>4s} {'GiB':>6s} {'H100 s':>7s}  sources")
    lines.append(f"{'':3s}{'start-up (wheel, imports, CUDA)':48s} {'':>4s} {'':>6s} "
                 f"{STARTUP_H200_S * H100_PER_H200:7.0f}  estimated")
    families = []
    for v in variants:
        if v.family not in families:
            families.append(v.family)
            build = next(b for b in BUILDS if b.family == v.family)
            lines.append(f"{'':3s}{'build ' + v.family + ' (bf16)':48s} {'':>4s} {'':>6s} {build.expected_s:7.0f}  "
                         f"{build.source}")
        mark = "" if v.default else "*"
        skip = device_gib is not None and v.expected_gib > MEMORY_SHARE * device_gib
        lines.append(f"{mark:>2s} {v.name:48s} {'yes' if v.reference else '-':>4s} {v.expected_gib:6.1f} "
                     f"{v.expected_s:7.0f}  {v.gib_source}; {v.seconds_source}" + ("  [skipped: memory]" if skip else ""))
    total = plan_total_s(variants)
    lines.append(f"total {total:.0f} s expected on an H100 ({total / 60:.1f} min) against the budget of "
                 f"{BUDGET_S:.0f} s ({BUDGET_S / 60:.0f} min)")
    others = [v for v in VARIANTS if v not in variants]
    for v in others:
        why = v.why_not_default or "not in this run's list"
        lines.append(f"not run: {v.name} ({v.expected_gib:.1f} GiB, {v.expected_s:.0f} s): {why}")
    return "\n".join(lines)


# ---- allocation failures ----------------------------------------------------------------------------------------
_ALLOCATION_MESSAGES = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                        "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE", "cudaErrorMemoryAllocation")


def is_allocation_failure(error: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, torch.AcceleratorError (torch >= 2.8: a CUDA error raised as such), or a
    RuntimeError whose message names an allocation failure (cuBLAS / cuDNN ALLOC_FAILED, "out of memory")."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return isinstance(error, RuntimeError) and any(m.lower() in str(error).lower() for m in _ALLOCATION_MESSAGES)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


class Budget:
    """Command time since ``start`` against ``BUDGET_S`` (or ``limit_s``); ``start`` is taken when the check begins,
    and the start-up allowance counts as already spent."""

    def __init__(self, limit_s: float = BUDGET_S, startup_s: float = STARTUP_H200_S * H100_PER_H200,
                 clock=time.perf_counter):
        self.limit_s, self.startup_s, self.clock = limit_s, startup_s, clock
        self.start = clock()

    def elapsed(self) -> float:
        return self.startup_s + self.clock() - self.start

    def refuses(self, expected_s: float) -> str | None:
        """Why a step expected to take ``expected_s`` must not start now, or None."""
        elapsed = self.elapsed()
        if elapsed + expected_s > self.limit_s:
            return (f"skipped: {elapsed:.0f} s spent + {expected_s:.0f} s expected would pass the budget of "
                    f"{self.limit_s:.0f} s")
        return None


def run_variant(variant: Variant, run, budget: Budget, device_gib: float | None) -> dict | str:
    """``run()`` unless the variant's memory would not fit or its time would pass the budget; an allocation
    failure of any kind becomes one line (memory freed), so the next variant runs. Returns run's result or the line."""
    if device_gib is not None and variant.expected_gib > MEMORY_SHARE * device_gib:
        return (f"skipped: expected {variant.expected_gib:.1f} GiB > {MEMORY_SHARE} x {device_gib:.1f} GiB of device "
                f"memory ({variant.gib_source})")
    refusal = budget.refuses(variant.expected_s)
    if refusal is not None:
        return refusal
    line = None
    try:
        return run()
    except Exception as error:  # noqa: BLE001 (only allocation failures are caught: the rest re-raise)
        if not is_allocation_failure(error):
            raise
        line = f"allocation failure, variant abandoned: {_first_line(error)}"
    free_memory()  # outside the except clause: the traceback's frames (and their tensors) are gone by now
    return line


def device_memory_gib(device: str) -> float | None:
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index
        return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).total_memory \
            / 2**30
    return None
