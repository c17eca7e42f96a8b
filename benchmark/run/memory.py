"""The per-GPU memory estimate of one training run, and the launch check that refuses a run it says cannot fit.

The estimate (:func:`estimate`, in GiB per process) is a sum of named parts:

* held through the iteration (``resident``): the transformer's weights in their dtype (a full fine-tuning's float32
  master weights), the text encoders, the VAE, the trainable state (LoRA weights, gradients and AdamW moments, EMA
  copies; a full fine-tuning's reference copy, gradients and moments), the FSDP all-gather of the blocks in flight,
  and the batch (every rollout step's latents and each sample's text condition). With ``model.args.fsdp`` the
  transformer's parts are divided by the processes;
* the recompute-free update's kept graphs (``reuse_rollout_graph``): every trained step of every sample's
  activations, held from the rollout until the update;
* the peak call of each phase, of which only the largest counts (they run one after another): the rollout's no-grad
  transformer call (``rollout_batch`` samples, 2 rows each with CFG), the decode (``rollout_batch`` samples through
  the VAE: its largest full-resolution convolution's input, output and a float32 normalisation temporary) and the
  update's call with autograd (``micro_batch`` samples; 2 rows each where the CFG pair is batched or both branches
  carry the gradient; gradient checkpointing keeps each block's input and one block's activations).

Activations are ``coefficient x blocks x tokens x hidden`` numbers of the compute dtype per row; the coefficient of
each family is fit on the first GPU run (docs/perf.md, "The first GPU run", one H200) and :data:`CALIBRATION` holds
those runs with their measured peaks (``tests/test_memory_estimate.py`` holds the estimate to the stated error on each).
Not counted: the reward model, the CUDA context and the allocator's fragmentation (:data:`RESERVE_GIB` covers the last
two in :func:`fits`).

The launch check (:func:`fit_run`, called by the runner before a model loads and by ``flowzoo bench`` before a grid
starts): with a known device memory (a CUDA device's ``total_memory``, or ``FLOWZOO_DEVICE_MEMORY_GIB``) a run whose
estimate does not fit is refused in one line naming the knobs to change; ``reuse_rollout_graph: auto`` that would keep
the graphs is set to false when only the recompute update fits. On the CPU without a budget nothing is checked or
changed. ``FLOWZOO_NO_MEMORY_CHECK=1`` (``--no-memory-check``) skips the check.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from dataclasses import dataclass

from flowzoo import algorithms, models
from flowzoo.errors import ConfigError
from flowzoo.models.diffusers_common import cfg_split_pays
from flowzoo.models.footprint import Arch

GIB = 2**30
#: GiB a device needs beyond the estimate: the CUDA context (~0.5 GiB) and the caching allocator's fragmentation
RESERVE_GIB = 2.0
#: the device memory ``flowzoo memory`` checks against by default: an H100 80 GB's total_memory (81,559 MiB)
H100_80GB_GIB = 81_559 / 1024
#: the environment variables of the launch check: a budget in GiB (a test's, or a user's who knows the device), and
#: the bypass (``--no-memory-check``)
BUDGET_ENV, BYPASS_ENV = "FLOWZOO_DEVICE_MEMORY_GIB", "FLOWZOO_NO_MEMORY_CHECK"
#: numbers of the compute dtype a no-grad transformer call holds per (row, token, hidden unit) at its peak: a block's
#: input, its float32 normalised copy (2), q, k, v and the attention output (4), the MLP's 4x hidden before and after
#: its activation (8). Not calibrated (no no-grad peak was measured apart); the rollout is rarely the peak phase
NO_GRAD_NUMBERS = 16
#: numbers of the compute dtype that gradient checkpointing keeps per (row, block, token, hidden unit): the block's input
CHECKPOINT_NUMBERS = 1
#: bytes per element of the dtype names the adapters take
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "bf16": 2, "fp16": 2, "fp32": 4}


# ---- the shape of one run ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunShape:
    """Everything the estimate reads of a run (:func:`run_shape` makes it from a config)."""

    arch: Arch
    samples: int  # this process's samples per iteration
    tokens: int  # tokens per sample in the transformer's stream
    weight_bytes: int = 2  # bytes per transformer / text-encoder weight (and per activation number)
    vae_bytes: int = 2
    text_encoders: bool = True
    vae: bool = True
    text_tokens: int = 0
    latent_numbers: int = 0  # latent numbers per sample (a trajectory keeps T + 1 of them, float32)
    records_means: bool = False  # the trajectory also keeps each step's Gaussian mean (T more, float32: Flow-DPPO)
    pixels: int = 0  # decoded pixels per sample at a decode's peak
    num_steps: int = 10
    finetune: str = "lora"
    master_bytes: int = 4  # a full fine-tuning's weight bytes (master_weights float32, or the model's)
    lora_params: int = 0
    copies: int = 0  # extra float32 copies of the trainable weights (EMA, an old-policy copy)
    processes: int = 1
    fsdp: bool = False
    rollout_rows: int = 1  # samples per rollout transformer call
    decode_rows: int = 1  # samples per VAE call
    cfg: bool = False  # classifier-free guidance: 2 rows per sample in no-grad calls
    grad_rows: int = 1  # rows with autograd per sample (2: CFG batched, or both branches trained)
    update_rows: int = 1  # samples per update call with autograd
    kl: bool = False  # a no-grad reference call beside each update call
    keeps_graphs: bool = False
    kept_steps: int = 0  # trained steps per sample whose graphs a recompute-free rollout keeps
    checkpointing: bool = False


@dataclass(frozen=True)
class Estimate:
    """GiB per process: ``resident`` parts, the kept graphs, and the peak call of each phase (the largest counts)."""

    resident: dict
    kept_graphs: float
    phases: dict

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def total(self) -> float:
        return sum(self.resident.values()) + self.kept_graphs + self.phases[self.peak_phase]

    def parts(self) -> dict[str, float]:
        """Every part by name, in the order the table prints them."""
        return {**self.resident, "kept graphs": self.kept_graphs, **self.phases}


def row_bytes(shape: RunShape, grad: bool) -> float:
    """Bytes one row (one sample's, or one CFG branch's, pass) holds in a transformer call: with autograd its saved
    activations (checkpointed: each block's input plus one block's activations), without it the call's peak."""
    per_number = shape.tokens * shape.arch.hidden * shape.weight_bytes
    if not grad:
        return NO_GRAD_NUMBERS * per_number
    if shape.checkpointing:
        return (CHECKPOINT_NUMBERS * shape.arch.blocks + shape.arch.activation) * per_number
    return shape.arch.activation * shape.arch.blocks * per_number


def estimate(shape: RunShape) -> Estimate:
    """The per-process peak of one training iteration of ``shape``, in GiB, by parts (module docstring)."""
    a = shape.arch
    shard = shape.processes if shape.fsdp else 1
    if shape.finetune == "full":
        transformer = a.transformer_params * shape.master_bytes / shard
        # the frozen reference copy, gradients and AdamW's two moments in the master dtype, EMA copies
        trainable = a.transformer_params * (shape.weight_bytes + shape.master_bytes * (3 + shape.copies)) / shard
    else:
        transformer = a.transformer_params * shape.weight_bytes / shard
        trainable = shape.lora_params * 4 * (4 + shape.copies) / shard  # float32 weights, gradients, 2 moments
    resident = {
        "transformer": transformer,
        "text encoders": a.text_encoder_params * shape.weight_bytes if shape.text_encoders else 0.0,
        "VAE": a.vae_params * shape.vae_bytes if shape.vae else 0.0,
        "trainable state": trainable,
        # FSDP2 gathers one block ahead of the one computing
        "FSDP gather": 2 * a.transformer_params / a.blocks * shape.weight_bytes if shape.fsdp else 0.0,
        "batch": shape.samples * ((2 * shape.num_steps + 1 if shape.records_means else shape.num_steps + 1)
                                  * shape.latent_numbers * 4
                                  + shape.text_tokens * a.text_width * shape.weight_bytes),
    }
    cfg_rows = 2 if shape.cfg else 1
    kept = shape.samples * shape.kept_steps * shape.grad_rows * row_bytes(shape, True) if shape.keeps_graphs else 0.0
    # the recompute update's call with autograd (none where the kept graphs are back-propagated instead)
    update = 0.0 if shape.keeps_graphs else shape.update_rows * shape.grad_rows * row_bytes(shape, True)
    if shape.kl:  # the reference policy's no-grad call while the update's graph is held
        update += shape.update_rows * cfg_rows * row_bytes(shape, False)
    pixels_bytes = (2 * shape.vae_bytes + 4) * a.vae_channels * shape.pixels  # conv input + output, float32 norm
    phases = {
        "rollout": shape.rollout_rows * cfg_rows * row_bytes(shape, False),
        "decode": shape.decode_rows * pixels_bytes if shape.vae else 0.0,
        "update": update,
    }
    return Estimate({k: v / GIB for k, v in resident.items()}, kept / GIB, {k: v / GIB for k, v in phases.items()})


def _defaults(model_cls: type) -> dict:
    """The model constructor's keyword defaults (what a config that leaves an argument out gets)."""
    return {k: p.default for k, p in inspect.signature(model_cls).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _plan_facts(config, alg_cfg, batch: int, num_steps: int) -> tuple[int, bool]:
    """(trained steps per sample, whether the rollout keeps its graphs): the algorithm's own step plan and
    ``keeps_rollout_graph`` on the stand-in model of the config check (``experiment.DeclaredDefaults``); an algorithm
    whose plan reads more of the model than the stand-in has gets the template's ``timestep_fraction`` of T, and its
    graph rule is still ``Algorithm.keeps_rollout_graph`` (it reads only the config and the class)."""
    from types import SimpleNamespace

    from flowzoo.benchmark.run.experiment import DeclaredDefaults

    alg_cls, model_cls = algorithms.get(config.algorithm_name), models.get(config.model.name)
    try:
        alg = alg_cls(DeclaredDefaults(model_cls), None, alg_cfg, seed=config.seed)
        trained = int(alg.make_plan(batch).train.sum(1).max())
    except NotImplementedError:  # the stand-in's NotOnTheStandIn, or a FlowModel method it does not implement
        alg = SimpleNamespace(config=alg_cfg, rollout_graph_auto=alg_cls.rollout_graph_auto)
        trained = max(1, int(num_steps * getattr(alg_cfg, "timestep_fraction", 1.0)))
    return trained, bool(alg_cls.keeps_rollout_graph(alg)) and not alg_cls.likelihood_free


def rollout_batch(alg_cfg, model_cls: type, samples: int) -> int:
    """Samples per rollout transformer call, per VAE call and per reward call: ``algorithm.rollout_batch``, else the
    model's ``default_rollout_batch``, else (None) all of the process's samples in one call."""
    value = getattr(alg_cfg, "rollout_batch", None) or getattr(model_cls, "default_rollout_batch", None)
    return min(int(value), samples) if value else samples


def run_shape(config, processes: int = 1) -> RunShape:
    """The :class:`RunShape` of a resolved config run by ``processes`` data-parallel processes (one per GPU)."""
    from flowzoo.models.sharding import shard_request

    if processes < 1:
        raise ConfigError(f"memory estimate: processes must be >= 1, got {processes}")
    name, args = config.model.name, dict(config.model.args)
    model_cls, alg_cls = models.get(name), algorithms.get(config.algorithm_name)
    defaults = _defaults(model_cls)
    get = lambda key: args.get(key, defaults.get(key))  # noqa: E731
    footprint = model_cls.footprint({**defaults, **args})
    arch = footprint.arch
    alg_cfg = config.algorithm_config()
    batch = config.train.prompts_per_step * alg_cfg.group_size
    samples = -(-batch // processes)
    num_steps = alg_cfg.num_steps or model_cls.default_num_steps
    guidance = model_cls.default_guidance if alg_cfg.guidance is None else float(alg_cfg.guidance)
    cfg = guidance != 1.0
    dtype = str(get("dtype") or "float32")
    weight_bytes = DTYPE_BYTES.get(dtype, 4)
    tokens, text_tokens, latent, pixels = footprint.tokens, footprint.text_tokens, footprint.latent_numbers, \
        footprint.pixels
    finetune = "full" if name == "toy2d" else str(get("finetune") or "lora")  # toy2d trains its whole MLP
    targets = get("lora_targets")
    width = arch.lora_widths.get(tuple(targets) if targets else "default", arch.lora_widths.get("default", 0))
    trained, keeps = _plan_facts(config, alg_cfg, batch, num_steps)
    if not cfg or alg_cfg.cfg_grad == "both" or alg_cfg.cfg_batch == "batched":
        grad_rows = 2 if cfg else 1
    elif alg_cfg.cfg_batch == "split":
        grad_rows = 1
    else:  # auto: the model's rule on the accelerator this estimate is for (models.diffusers_common.cfg_split_pays)
        grad_rows = 1 if cfg_split_pays("cuda", arch.transformer_params) else 2
    local = min(-(-batch // alg_cfg.minibatches), samples)  # one minibatch's samples on this process, at most
    if model_cls.fused_update:  # the tier's update runs every trained (sample, step) pair of a minibatch in one call
        local *= trained
    update_rows = min(alg_cfg.micro_batch or local, local) * int(getattr(alg_cfg, "train_timesteps", 1) or 1)
    rows = rollout_batch(alg_cfg, model_cls, samples)
    return RunShape(
        arch=arch, samples=samples, tokens=tokens, weight_bytes=weight_bytes,
        vae_bytes=DTYPE_BYTES.get(str(get("vae_dtype") or dtype), 4), text_encoders=arch.text_encoder_params > 0,
        vae=arch.vae_params > 0, text_tokens=text_tokens, latent_numbers=latent, pixels=pixels, num_steps=num_steps,
        finetune=finetune, master_bytes=4 if get("master_weights") in (None, "float32") else weight_bytes,
        lora_params=width * int(get("lora_rank") or 0) if finetune == "lora" else 0,
        copies=int(alg_cfg.ema) + int(alg_cls.likelihood_free), processes=processes,
        fsdp=shard_request(args) and processes > 1, rollout_rows=rows, decode_rows=rows, cfg=cfg,
        grad_rows=grad_rows, update_rows=update_rows, kl=alg_cfg.kl_beta > 0, keeps_graphs=keeps,
        kept_steps=trained, checkpointing=bool(get("gradient_checkpointing")), records_means=alg_cls.records_means)


# ---- calibration ------------------------------------------------------------------------------------------------
def arch_of(name: str, args: dict | None = None) -> Arch:
    """Model ``name``'s architecture at ``args`` (over its constructor's defaults), as its adapter states it."""
    model_cls = models.get(name)
    return model_cls.footprint({**_defaults(model_cls), **(args or {})}).arch


def check_shape(model: str, **values) -> RunShape:
    """The shape of a run of ``flowzoo perf --gpu-check`` (benchmark/perf/gpu.py, gpu_large.py) on ``model``'s
    architecture: a random transformer in bf16 with LoRA, no text encoders or VAE, 4 samples of one prompt unless
    ``values`` say otherwise."""
    values = {"samples": 4, "rollout_rows": 4, "decode_rows": 4, **values}
    return RunShape(arch=models.get(model).architecture, text_encoders=False, vae=False, **values)


def _gpu_check(arch: str, measured: float, **values) -> tuple[RunShape, float]:
    """A run of the GPU check (:func:`check_shape`) and its measured peak (GiB, max_memory_allocated)."""
    return check_shape(arch, **values), measured


SD3_CHECK = dict(tokens=32 * 32 + 77 + 128, text_tokens=205, latent_numbers=16 * 64 * 64, num_steps=10,
                 lora_params=586_752 * 32, cfg=True, grad_rows=1, update_rows=4, kl=True, kept_steps=9)
#: the Qwen-Image check's shape (Flow-GRPO-Fast's recipe), without the update's rows
QWEN_CHECK = dict(tokens=32 * 32 + 322, text_tokens=512, latent_numbers=16 * 64 * 64, num_steps=10,
                  lora_params=6_635_520 * 64, cfg=True, grad_rows=2)
FLUX_CHECK = dict(tokens=45 * 45 + 512, text_tokens=512, latent_numbers=16 * 90 * 90, lora_params=1_167_360 * 128)
#: the first GPU run (docs/perf.md, one H200): {label: (the run's shape, its measured peak in GiB)}
CALIBRATION: dict[str, tuple[RunShape, float]] = {
    # T 10, CFG 4.5 split (cfg_batch auto at 2.2 B parameters), 9 trained steps, KL 0.04, one minibatch of 4
    "SD3.5-M Flow-GRPO, update recomputes": _gpu_check("sd3", 14.2, **SD3_CHECK),
    "SD3.5-M Flow-GRPO, kept graphs": _gpu_check("sd3", 85.6, **SD3_CHECK, keeps_graphs=True),
    # 720 px, DanceGRPO's FLUX recipe: T 12, no CFG, minibatches 2 of the 4 samples (2 rows per update call)
    "FLUX.1-dev DanceGRPO": _gpu_check("flux", 52.1, **FLUX_CHECK, num_steps=12, update_rows=2),
    # MixGRPO's: T 25, window 4, minibatches 4 (1 row per update call)
    "FLUX.1-dev MixGRPO": _gpu_check("flux", 38.8, **FLUX_CHECK, num_steps=25, update_rows=1),
    # Flow-GRPO-Fast's Qwen-Image recipe: true CFG 4 with both branches' gradient (2 rows a sample), minibatches 2;
    # the prompt's 322 valid text tokens (the longest of the call: the negative " " has 185) join 1024 image tokens
    "Qwen-Image Flow-GRPO-Fast": _gpu_check("qwen_image", 97.6, **QWEN_CHECK, update_rows=2),
}
#: the largest relative error of the estimate on CALIBRATION (docs/perf.md states it; the test holds it)
CALIBRATION_ERROR = 0.02


# ---- the launch check -------------------------------------------------------------------------------------------
def fits(estimate_: Estimate, budget_gib: float) -> bool:
    """Whether the estimate, with :data:`RESERVE_GIB` for the CUDA context and fragmentation, fits ``budget_gib``."""
    return estimate_.total + RESERVE_GIB <= budget_gib


def device_budget(config) -> tuple[float, str] | None:
    """(GiB, what it is) the launch check holds a run to: ``FLOWZOO_DEVICE_MEMORY_GIB`` when set, else a CUDA
    device's total memory; None on the CPU (no check: CPU runs are unchanged) or with ``FLOWZOO_NO_MEMORY_CHECK=1``."""
    if os.environ.get(BYPASS_ENV, "") not in ("", "0"):
        return None
    text = os.environ.get(BUDGET_ENV, "")
    if text:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{BUDGET_ENV}={text!r}: give the device's memory in GiB, a number > 0 (e.g. 79.6)")
        return value, f"{BUDGET_ENV}={text}"
    import torch

    args, model_cls = config.model.args, models.get(config.model.name)
    if "device" not in inspect.signature(model_cls).parameters:  # a model without a device argument (toy2d) runs on the CPU
        return None
    device = args.get("device", _defaults(model_cls).get("device"))
    if device is None:  # the diffusers adapters' default: the GPU when there is one
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return props.total_memory / GIB, f"{props.name} cuda:{index}"


def knobs(shape: RunShape, est: Estimate) -> list[str]:
    """The knobs that shrink the estimate's largest parts, largest first."""
    named: list[tuple[float, str]] = []
    if est.kept_graphs:
        named.append((est.kept_graphs, "algorithm.reuse_rollout_graph=false (or set algorithm.micro_batch)"))
    update = est.phases["update"]
    if update and shape.update_rows > 1:
        named.append((update, f"a smaller algorithm.micro_batch (now {shape.update_rows} rows a call)"))
    if update and not shape.checkpointing:
        named.append((update * 0.99, "model.args.gradient_checkpointing=true"))
    for phase in ("rollout", "decode"):
        if est.phases[phase] and shape.rollout_rows > 1:
            named.append((est.phases[phase], f"a smaller algorithm.rollout_batch (now {shape.rollout_rows} samples "
                                             f"a call)"))
            break
    weights = est.resident["transformer"] + est.resident["trainable state"]
    if not shape.fsdp:
        named.append((weights, "model.args.fsdp=true over more processes (GPUs)"))
    elif shape.processes > 1:
        named.append((weights, f"more processes (GPUs) than {shape.processes} for model.args.fsdp"))
    return [text for _, text in sorted(named, key=lambda item: -item[0])]


def refusal(label: str, shape: RunShape, est: Estimate, budget: float, where: str) -> str:
    """The one line that refuses a run whose estimate does not fit."""
    largest = sorted(est.parts().items(), key=lambda item: -item[1])[:3]
    parts = ", ".join(f"{name} {value:.1f}" for name, value in largest)
    return (f"{label}: needs ~{est.total:.1f} GiB per GPU by the memory estimate ({parts} GiB; "
            f"{shape.processes} process(es)) + {RESERVE_GIB:g} reserve, more than the {budget:.1f} GiB of {where}; "
            f"change {'; or '.join(knobs(shape, est))} (flowzoo memory shows the parts; --no-memory-check or "
            f"{BYPASS_ENV}=1 launches anyway)")


def fit_run(config, processes: int, budget: tuple[float, str] | None = None, label: str | None = None):
    """The launch check of one run: (config, note). ``budget``: (GiB, what it is), default :func:`device_budget`;
    None: nothing checked, ``config`` returned as it is. A run whose estimate does not fit raises a one-line
    ConfigError naming the knobs; ``reuse_rollout_graph: auto`` that would keep the graphs where only the recompute
    update fits comes back set to false (an execution key: the run's identity is unchanged) with a note saying so."""
    budget = device_budget(config) if budget is None else budget
    if budget is None:
        return config, None
    gib, where = budget
    label = label or f"{config.task}/{config.algorithm_name}"
    shape = run_shape(config, processes)
    est = estimate(shape)
    if fits(est, gib):
        return config, None
    if shape.keeps_graphs and config.algorithm.get("reuse_rollout_graph") == "auto":
        recompute = dataclasses.replace(
            config, algorithm={**config.algorithm, "reuse_rollout_graph": False})
        other = estimate(run_shape(recompute, processes))
        if fits(other, gib):
            note = (f"{label}: reuse_rollout_graph auto -> false: the kept rollout graphs need ~{est.total:.1f} GiB "
                    f"per GPU by the memory estimate, more than the {gib:.1f} GiB of {where}; the update recomputes "
                    f"instead (~{other.total:.1f} GiB)")
            return recompute, note
    raise ConfigError(refusal(label, shape, est, gib, where))
