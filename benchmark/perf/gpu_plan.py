"""The GPU check's plan (``flowzoo perf --gpu-check``): its variants with their expected memory and time, the time
budget, the rules that skip a variant (memory that would not fit, a start past the budget) and the handling of an
allocation failure, which ends only its own variant. No model code here: ``gpu.py`` and ``gpu_large.py`` run them.

Expected figures come from the first GPU run (one H200, 2026-12-04; docs/perf.md "The first GPU run"): a figure is
either *measured* there, or *estimated* from those measurements, and says which in its ``source``. Seconds are for an
H100 80 GB: the H200 seconds x ``H100_PER_H200`` (the two share the bf16 matrix peak, the H100 has 0.7x the memory
bandwidth; no H100 run yet). Memory is the memory estimate of the variant's shape (``benchmark/run/memory.py``,
the one the launch check uses, calibrated on the same H200 run to within 2%); a variant is skipped where it would not
fit (``memory.fits``: the estimate plus its reserve against the device's memory), as a launch would be refused.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import torch

from flowzoo.benchmark.run import memory
from flowzoo.benchmark.run.memory import FLUX_CHECK, QWEN_CHECK, SD3_CHECK, RunShape, check_shape

#: command time the check is sized for (8 minutes on one H100 80 GB)
BUDGET_S = 480.0
#: H100 seconds per H200 second (an allowance, not a measurement: see the module docstring)
H100_PER_H200 = 1.15
#: timed repeats per variant, after one untimed warm-up (docs/perf.md)
REPEATS = 3
#: before the first variant: installing the carried wheel, imports, CUDA start-up (H200 seconds, estimated)
STARTUP_H200_S = 20.0


@dataclass(frozen=True)
class Variant:
    """One timed configuration of the check. ``reference``: the released structure it is timed against
    (``benchmark/perf/reference.py``), or None. ``h200_s``: expected seconds of the whole variant on an H200 (warm-up
    and ``REPEATS`` pairs), with its source; ``shape``: what the memory estimate reads of it; ``measured``: what the
    H200 run measured of its memory, where it ran."""

    name: str
    family: str  # sd3 | flux | qwen_image: the model it runs on (built once per family)
    algorithm: str
    overrides: dict = field(default_factory=dict)
    reference: str | None = None
    shape: RunShape | None = None
    measured: str = ""
    h200_s: float = 0.0
    seconds_source: str = ""
    default: bool = True
    why_not_default: str = ""

    @property
    def expected_s(self) -> float:
        """Expected seconds on an H100."""
        return self.h200_s * H100_PER_H200

    @property
    def expected_gib(self) -> float:
        """The memory estimate's peak for the variant (GiB)."""
        return memory.estimate(self.shape).total

    @property
    def gib_source(self) -> str:
        return f"memory estimate{'; ' + self.measured if self.measured else ''}"

    def fits(self, device_gib: float) -> bool:
        """Whether the estimate fits ``device_gib`` with the launch check's reserve (``memory.fits``)."""
        return memory.fits(memory.estimate(self.shape), device_gib)


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

#: the SD3 recompute update at 4 samples: the CFG pair batched (``cfg_batch: auto`` on a GPU), as the released loop
_SD3_RECOMPUTE = check_shape("sd3", **{**SD3_CHECK, "grad_rows": 2})
VARIANTS = (
    Variant("sd3: flow_grpo, recompute", "sd3", "flow_grpo", {"reuse_rollout_graph": False}, "flow_grpo_sd3",
            shape=_SD3_RECOMPUTE,
            measured="measured on the H200: 14.2 GiB with the CFG pair split (the former auto), the released loop "
                     "(batched, as auto is now on a GPU) 23.1",
            h200_s=_PAIRS * (1.60 + 4.24 + 4.24),
            seconds_source="estimated: ours' rollout 1.60 + an update as long as the released 4.24, twice (the "
                           "split form measured 8.04 + 4.24 per pair)"),
    Variant("sd3: flow_grpo, recompute, split CFG (former auto)", "sd3", "flow_grpo",
            {"reuse_rollout_graph": False, "cfg_batch": "split"}, "flow_grpo_sd3",
            shape=check_shape("sd3", **SD3_CHECK), measured="measured: 14.2 GiB on the H200",
            h200_s=_PAIRS * (8.04 + 4.24), seconds_source="measured per pair on the H200: ours 8.04 + the released "
                                                          "update 4.24",
            default=False, why_not_default="the former default, 1.38x the released loop on the H200; run it to "
                                           "compare"),
    Variant("sd3: flow_grpo, kept rollout graph", "sd3", "flow_grpo", {"reuse_rollout_graph": True}, "flow_grpo_sd3",
            shape=check_shape("sd3", **{**SD3_CHECK, "grad_rows": 2}, keeps_graphs=True),
            measured="measured: 85.6 GiB with the CFG pair split on the H200",
            h200_s=_PAIRS * (4.95 + 4.24), seconds_source="measured per pair on the H200: ours 4.95 + the released "
                                                          "update 4.24",
            default=False, why_not_default="does not fit an 80 GB GPU"),
    Variant("sd3: op_grpo", "sd3", "op_grpo", {}, None,
            shape=check_shape("sd3", **{**SD3_CHECK, "grad_rows": 2, "samples": 8, "rollout_rows": 8,
                                        "decode_rows": 8, "update_rows": 8}),
            measured="measured: 23.7 GiB on the H200 (CFG split)",
            h200_s=(1 + REPEATS) * 7.61, seconds_source="measured: 7.61 s/iteration on the H200",
            default=False, why_not_default="no released reference to compare with; its 35 s keep the default list "
                                           "inside the budget with a margin"),
    Variant("flux: dance_grpo", "flux", "dance_grpo", {}, "dance_grpo",
            shape=check_shape("flux", **FLUX_CHECK, num_steps=12, update_rows=2, rollout_rows=1, decode_rows=1),
            measured="measured: 52.1 GiB on the H200 (4 samples per rollout call then)",
            h200_s=_PAIRS * (13.09 + 0.6 * 13.09),
            seconds_source="measured 13.09 s/iteration on the H200, the released update estimated at ours' 0.6 share"),
    Variant("flux: mix_grpo", "flux", "mix_grpo", {}, "mix_grpo",
            shape=check_shape("flux", **FLUX_CHECK, num_steps=25, update_rows=1, rollout_rows=1, decode_rows=1),
            measured="measured: 38.8 GiB on the H200 (4 samples per rollout call then)",
            h200_s=_PAIRS * (17.88 + 0.32 * 17.88),
            seconds_source="measured 17.88 s/iteration on the H200, the released update estimated at ours' 0.32 "
                           "share"),
    Variant("qwen_image: flow_grpo_fast", "qwen_image", "flow_grpo_fast", {}, "flow_grpo_fast",
            shape=check_shape("qwen_image", **QWEN_CHECK, update_rows=2, checkpointing=True),
            measured="measured: 97.6 GiB on the H200 without gradient checkpointing (the paper suite and the "
                     "release train with it, as the check now does)",
            h200_s=_PAIRS * (10.30 * 144 / 128 + 10.30 * 64 / 128),
            seconds_source="measured 10.30 s/iteration on the H200 without checkpointing; with it 144 / 128 of "
                           "that, the released update 64 / 128"),
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
        lines.append(f"device memory {device_gib:.1f} GiB: a variant whose estimate + {memory.RESERVE_GIB:.0f} GiB "
                     "reserve exceeds it is skipped")
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
        skip = device_gib is not None and not v.fits(device_gib)
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
    if device_gib is not None and not variant.fits(device_gib):
        return (f"skipped: estimated {variant.expected_gib:.1f} GiB + {memory.RESERVE_GIB:.0f} GiB reserve > "
                f"{device_gib:.1f} GiB of device memory ({variant.measured})")
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
