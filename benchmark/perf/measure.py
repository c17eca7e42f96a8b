"""``flowzoo perf``: one Flow-GRPO training iteration of ours against a reference-style loop, timed in one process.

Both variants run on the same SD3 adapter (by default a tiny random pipeline, ``benchmark/perf/pipeline.py``, saved
and loaded through the adapter's real ``from_pretrained`` path), interleaved A B A B ..., and the medians are
compared. The reference iteration shares our rollout and reward code (the released rollout is the same batched-CFG
SDE sampling under no_grad) and trains as the released Flow-GRPO trainer does: per trained timestep one batched
transformer call on [uncond; cond] with the unconditional half detached, that timestep's loss backward, gradients
accumulated over the timesteps, one optimizer step per minibatch (scripts/train_sd3.py:180-195, 872-939 at ac4c86e;
the transcription is ``benchmark/perf/reference.py``).
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from flowzoo.benchmark.perf.memory import SavedActivations
from flowzoo.benchmark.perf.pipeline import MAX_SEQ, RESOLUTION, MeanBrightness, build_tiny_sd3
from flowzoo.benchmark.perf.reference import released_gradient, released_pair_loss
from flowzoo.errors import ConfigError

PROMPT = "a photo of a cat"
#: the released recipe's CFG scale
GUIDANCE = 4.5


def load_model(path: str | None, device: str, lora_rank: int, dtype: str = "float32"):
    """The SD3 adapter on ``path``, or on a tiny random pipeline written to a temporary directory, computing in
    ``dtype`` (half precisions under autocast)."""
    from flowzoo.models.sd3 import SD3Model

    if path is None:
        tmp = Path(tempfile.mkdtemp(prefix="flowzoo_perf_"))
        (tmp / "tok").mkdir()
        path = str(build_tiny_sd3(tmp / "sd3", tmp / "tok"))
        return SD3Model(path=path, resolution=RESOLUTION, max_sequence_length=MAX_SEQ, lora_rank=lora_rank,
                        lora_alpha=2 * lora_rank, device=device, dtype=dtype)
    return SD3Model(path=path, lora_rank=lora_rank, lora_alpha=2 * lora_rank, device=device, dtype=dtype)


def make_algorithm(model, overrides: dict, seed: int = 0, name: str = "flow_grpo"):
    from flowzoo import algorithms

    config = {"group_size": 8, "num_steps": 10, "guidance": GUIDANCE, **overrides}
    if config.get("cfg_grad", "cond") != "cond":
        raise ConfigError(f"perf: cfg_grad {config['cfg_grad']!r} is not supported; the released loop detaches the "
                          "unconditional branch (cond)")
    return algorithms.get(name)(model, MeanBrightness(), config, seed=seed)


def reference_update(alg, traj, advantages, saved: SavedActivations | None = None) -> None:
    """The released per-timestep update: for each of ``minibatches`` random parts of the batch, the loss of each
    trained timestep over the part, backward, accumulate (divided by the number of trained timesteps), one optimizer
    step with the same clipping and optimizer as ours."""
    model, cfg = alg.model, alg.config
    steps = [t for t in range(traj.num_steps) if traj.train[:, t].any()]
    perm = torch.randperm(len(traj), generator=torch.Generator().manual_seed(alg.iteration))
    for _ in range(cfg.inner_epochs):
        for rows in perm.chunk(cfg.minibatches):
            rows = rows.sort().values
            alg.optimizer.zero_grad(set_to_none=True)
            for t in steps:
                if saved is not None:
                    saved.mark()
                loss, _ = released_pair_loss(model, traj, advantages, rows, t, cfg)
                (loss.mean() / len(steps)).backward()
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), cfg.max_grad_norm)
            alg.optimizer.step()
    alg.optimizer.zero_grad(set_to_none=True)


def reference_step(alg, prompts, saved: SavedActivations | None = None) -> dict[str, float]:
    """One reference iteration with the phase split: our rollout (under no_grad, as released) and reward, then
    ``reference_update``."""
    reuse, alg.config.reuse_rollout_graph = alg.config.reuse_rollout_graph, False
    t0 = time.perf_counter()
    try:
        traj = alg.collect(list(prompts), [{} for _ in prompts])
    finally:
        alg.config.reuse_rollout_graph = reuse
    t1 = time.perf_counter()
    if traj.rewards is None:
        alg.score(traj)
    batch = alg.dist.gather_batch(traj)
    advantages = alg.advantages(batch)[batch.local]
    t2 = time.perf_counter()
    with model_autocast(alg.model):
        reference_update(alg, traj, advantages, saved)
    t3 = time.perf_counter()
    return {"sampling": t1 - t0, "reward": t2 - t1, "training": t3 - t2}


def model_autocast(model):
    """The adapter's autocast (bf16 on GPU runs), so that the reference's direct transformer calls match ours."""
    import contextlib

    return model._autocast() if hasattr(model, "_autocast") else contextlib.nullcontext()


def gradient_check(alg, prompts) -> float:
    """Relative difference between our update's gradient and the released loss's gradient on one rollout (before
    clipping and the optimizer step), for one optimizer step per rollout. The LoRA weights are restored afterwards."""
    if (alg.config.inner_epochs, alg.config.minibatches) != (1, 1):
        raise ConfigError("perf: the gradient check needs one optimizer step per rollout (inner_epochs 1, "
                          f"minibatches 1); got {alg.config.inner_epochs}, {alg.config.minibatches}")
    params = alg.model.trainable_parameters()
    state = alg.model.trainable_state_dict()
    seen = {}
    plain_update, plain_step = alg.update, alg.optimizer.step

    def update(traj, advantages):
        with model_autocast(alg.model):
            seen["released"] = released_gradient(alg.model, traj, advantages, alg.config, "flow_grpo")
        alg.optimizer.step = lambda *a, **k: seen.setdefault("ours", torch.cat([p.grad.flatten() for p in params]))
        return plain_update(traj, advantages)

    alg.update = update
    try:
        alg.step(list(prompts))
    finally:
        alg.update, alg.optimizer.step = plain_update, plain_step
        alg.optimizer.zero_grad(set_to_none=True)
        alg.model.load_trainable_state_dict(state)
    ref = seen["released"]
    return float((seen["ours"] - ref).norm() / ref.norm().clamp_min(1e-30))


def _peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> float:
    """GiB: peak allocated GPU memory since the last reset on CUDA; the process's peak RSS on CPU (monotonic)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def activation_peaks(alg, prompts) -> dict[str, float]:
    """GiB of autograd-saved activations alive at the peak of one iteration of each variant (frozen weights left
    out): what the kept rollout graphs, or one recomputed timestep, hold. Device-independent; not timed."""
    state, opt_state = alg.model.trainable_state_dict(), alg.optimizer.state_dict()
    out = {}
    for name in ("ours", "reference"):
        alg.model.load_trainable_state_dict(state)
        alg.optimizer.load_state_dict(opt_state)
        with SavedActivations(alg.model.transformer) as saved:
            if name == "ours":
                plain = alg._step_terms

                def step_terms(*args, **kwargs):
                    if not alg.keeps_rollout_graph():  # a recomputed timestep's forward and backward
                        saved.mark()
                    return plain(*args, **kwargs)

                alg._step_terms = step_terms
                try:
                    alg.step(list(prompts))
                finally:
                    del alg._step_terms
            else:
                reference_step(alg, prompts, saved)
        out[name] = saved.peak / 2**30
    alg.model.load_trainable_state_dict(state)
    alg.optimizer.load_state_dict(opt_state)
    return out


def run(model, overrides: dict, repeats: int = 5, prompts_per_step: int = 1, device: str = "cpu",
        algorithm: str = "flow_grpo", check_gradient: bool = True) -> dict:
    """Interleaved timing; returns per-variant median phase times and their spread, peak memory, saved activations
    and (one optimizer step per rollout) the gradient check."""
    alg = make_algorithm(model, overrides, name=algorithm)
    prompts = [PROMPT] * prompts_per_step
    one_step = (alg.config.inner_epochs, alg.config.minibatches) == (1, 1)
    rel = gradient_check(alg, prompts) if check_gradient and one_step else None
    state = model.trainable_state_dict()
    opt_state = alg.optimizer.state_dict()
    times = {"ours": [], "reference": []}
    peaks = {"ours": 0.0, "reference": 0.0}

    def once(name):
        model.load_trainable_state_dict(state)
        alg.optimizer.load_state_dict(opt_state)
        _peak_reset(device)
        if name == "ours":
            s = alg.step(prompts)
            phases = {"sampling": s.t_sampling, "reward": s.t_reward, "training": s.t_training}
        else:
            phases = reference_step(alg, prompts)
        peaks[name] = max(peaks[name], _peak(device))
        times[name].append(phases)

    once("ours")  # warm-up of both, not timed
    once("reference")
    times = {"ours": [], "reference": []}
    for _ in range(repeats):
        once("ours")
        once("reference")
    model.load_trainable_state_dict(state)
    alg.optimizer.load_state_dict(opt_state)
    out = {"grad_rel_diff": rel, "peak_gib": peaks, "activations_gib": activation_peaks(alg, prompts),
           "config": dataclasses.asdict(alg.config), "keeps_rollout_graph": alg.keeps_rollout_graph(),
           "split_cfg": alg.config.cfg_batch == "split" or (alg.config.cfg_batch == "auto" and model.split_cfg_pays())}
    for name, rows in times.items():
        out[name] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        out[name]["total"] = statistics.median(sum(r.values()) for r in rows)
    pairs = [sum(o.values()) / sum(r.values()) for o, r in zip(times["ours"], times["reference"])]
    out["ratio"] = out["ours"]["total"] / out["reference"]["total"]
    out["pair_ratios"] = (min(pairs), max(pairs))
    out["training_ratio"] = out["ours"]["training"] / out["reference"]["training"]
    return out


def format_result(result: dict, device: str) -> str:
    mem = "peak GPU memory allocated" if device.startswith("cuda") else "peak process RSS (whole process, monotonic)"
    lines = [f"{'':10s} {'sampling':>9s} {'reward':>9s} {'training':>9s} {'total':>9s}  activations  {mem}"]
    for name in ("ours", "reference"):
        r = result[name]
        lines.append(f"{name:10s} {r['sampling']:9.3f} {r['reward']:9.3f} {r['training']:9.3f} {r['total']:9.3f}"
                     f"  {result['activations_gib'][name] * 1024:8.2f} MiB  {result['peak_gib'][name]:.2f} GiB")
    low, high = result["pair_ratios"]
    lines.append(f"ratio ours/reference: iteration {result['ratio']:.3f} (interleaved pairs {low:.3f}-{high:.3f}), "
                 f"training phase {result['training_ratio']:.3f}  (medians, seconds)")
    lines.append(f"ours: recompute-free update {'on' if result['keeps_rollout_graph'] else 'off'}, CFG "
                 f"{'split' if result['split_cfg'] else 'batched'} (cfg_batch {result['config']['cfg_batch']})")
    rel = result["grad_rel_diff"]
    lines.append("gradient relative difference: " + ("n/a (more than one optimizer step per rollout)" if rel is None
                                                       else f"{rel:.2e}"))
    return "\n".join(lines)


def parse_overrides(items) -> dict:
    """``key=value`` algorithm overrides (``algorithm.`` optional), values read as a config's overrides are, and
    checked against Flow-GRPO's config before any model is built."""
    from flowzoo import algorithms
    from flowzoo.benchmark.config.schema import parse_override
    from flowzoo.schema import from_mapping

    overrides = {}
    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"perf: override {item!r} is not key=value (e.g. reuse_rollout_graph=false)")
        path, value = parse_override(item)
        overrides[".".join(path).removeprefix("algorithm.")] = value
    from_mapping(algorithms.get("flow_grpo").Config, {"group_size": 8, "num_steps": 10, "guidance": GUIDANCE,
                                                      **overrides}, where="algorithm")
    return overrides
