"""``flowzoo perf``: one Flow-GRPO training iteration of ours against a reference-style loop, timed in one process.

Both variants run on the same SD3 pipeline (by default a tiny random one built and saved by the SD3 adapter tests'
``build_tiny_sd3`` and loaded through the adapter's real ``from_pretrained`` path), interleaved A B A B ..., and the
medians are compared. The reference iteration shares our rollout and reward code (the released rollout is the same
batched-CFG SDE sampling under no_grad) and trains as the released Flow-GRPO trainer does: per trained timestep one
batched transformer call on [uncond; cond] with the unconditional half detached, that timestep's loss backward,
gradients accumulated over the timesteps, one optimizer step (scripts/train_sd3.py:180-195, 872-939 at ac4c86e; the
transcription is tests/test_fidelity_sd3.py's ``released_pair_loss``, reused here, not copied).

The benchmark imports the transcription and the tiny-pipeline builder from ``tests/`` so it runs from a checkout.
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from flowzoo.errors import ConfigError

PROMPT = "a photo of a cat"
#: the released recipe's CFG scale; the transcription in tests/test_fidelity_sd3.py is written for it
GUIDANCE = 4.5


def _helpers():
    root = str(Path(__file__).resolve().parents[1])
    if (Path(root) / "tests").is_dir() and root not in sys.path:  # the console script does not put the checkout on
        sys.path.append(root)  # sys.path
    try:
        from tests.test_fidelity_sd3 import released_gradient, released_pair_loss
        from tests.test_models_sd3 import MAX_SEQ, RESOLUTION, build_tiny_sd3
        from tests.adapter_training import MeanBrightness
    except ImportError as e:  # installed without the repository's tests/
        raise ConfigError(f"flowzoo perf needs the repository checkout (tests/ importable): {e}") from e
    return released_gradient, released_pair_loss, MAX_SEQ, RESOLUTION, build_tiny_sd3, MeanBrightness


def load_model(path: str | None, device: str, lora_rank: int):
    """The SD3 adapter on ``path``, or on a tiny random pipeline written to a temporary directory."""
    from models.sd3 import SD3Model

    _, _, max_seq, resolution, build, _ = _helpers()
    if path is None:
        tmp = Path(tempfile.mkdtemp(prefix="flowzoo_perf_"))
        (tmp / "tok").mkdir()
        path = str(build(tmp / "sd3", tmp / "tok"))
        return SD3Model(path=path, resolution=resolution, max_sequence_length=max_seq, lora_rank=lora_rank,
                        lora_alpha=2 * lora_rank, device=device)
    return SD3Model(path=path, lora_rank=lora_rank, lora_alpha=2 * lora_rank, device=device)


def make_algorithm(model, overrides: dict, seed: int = 0):
    import algorithms

    _, _, _, _, _, reward = _helpers()
    config = {"group_size": 8, "num_steps": 10, "guidance": GUIDANCE, **overrides}
    if float(config["guidance"]) != GUIDANCE:
        raise ConfigError(f"perf: guidance {config['guidance']!r} is not supported; the reference loop uses {GUIDANCE}")
    if config.get("cfg_grad", "cond") != "cond":
        raise ConfigError(f"perf: cfg_grad {config['cfg_grad']!r} is not supported; the released loop detaches the "
                          "unconditional branch (cond)")
    return algorithms.get("flow_grpo")(model, reward(), config, seed=seed)


def reference_update(alg, traj, advantages) -> None:
    """The released per-timestep update: loss of each trained timestep over the whole batch, backward, accumulate
    (divided by the number of trained timesteps), one optimizer step with the same clipping and optimizer as ours."""
    _, released_pair_loss, *_ = _helpers()
    model, cfg = alg.model, alg.config
    rows = torch.arange(len(traj))
    steps = [t for t in range(traj.num_steps) if traj.train[:, t].any()]
    alg.optimizer.zero_grad(set_to_none=True)
    for t in steps:
        loss, _ = released_pair_loss(model, traj, advantages, rows, t, cfg)
        (loss.mean() / len(steps)).backward()
    if cfg.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), cfg.max_grad_norm)
    alg.optimizer.step()
    alg.optimizer.zero_grad(set_to_none=True)


def reference_step(alg, prompts) -> dict[str, float]:
    """One reference iteration with the phase split: our rollout and reward, then ``reference_update``."""
    reuse, alg.config.reuse_rollout_graph = alg.config.reuse_rollout_graph, False  # the released rollout: no_grad
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
    reference_update(alg, traj, advantages)
    t3 = time.perf_counter()
    return {"sampling": t1 - t0, "reward": t2 - t1, "training": t3 - t2}


def gradient_check(alg, prompts) -> float:
    """Relative difference between our update's gradient and the released loss's gradient on one rollout (before
    clipping and the optimizer step). The LoRA weights are restored afterwards."""
    released_gradient, *_ = _helpers()
    params = alg.model.trainable_parameters()
    state = alg.model.trainable_state_dict()
    seen = {}
    plain_update, plain_step = alg.update, alg.optimizer.step

    def update(traj, advantages):
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


def run(model, overrides: dict, repeats: int = 5, prompts_per_step: int = 1, device: str = "cpu") -> dict:
    """Interleaved timing; returns per-variant median phase times, peak memory and the gradient check."""
    alg = make_algorithm(model, overrides)
    prompts = [PROMPT] * prompts_per_step
    rel = gradient_check(alg, prompts)
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
    out = {"grad_rel_diff": rel, "peak_gib": peaks, "config": dataclasses.asdict(alg.config)}
    for name, rows in times.items():
        out[name] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        out[name]["total"] = statistics.median(sum(r.values()) for r in rows)
    out["ratio"] = out["ours"]["total"] / out["reference"]["total"]
    out["training_ratio"] = out["ours"]["training"] / out["reference"]["training"]
    return out


def format_result(result: dict, device: str) -> str:
    mem = "peak GPU memory allocated" if device.startswith("cuda") else "peak process RSS (whole process, monotonic)"
    lines = [f"{'':10s} {'sampling':>9s} {'reward':>9s} {'training':>9s} {'total':>9s}  {mem}"]
    for name in ("ours", "reference"):
        r = result[name]
        lines.append(f"{name:10s} {r['sampling']:9.3f} {r['reward']:9.3f} {r['training']:9.3f} {r['total']:9.3f}"
                     f"  {result['peak_gib'][name]:.2f} GiB")
    lines.append(f"ratio ours/reference: iteration {result['ratio']:.3f}, training phase {result['training_ratio']:.3f}"
                 f"  (medians, seconds)")
    lines.append(f"gradient relative difference: {result['grad_rel_diff']:.2e}")
    return "\n".join(lines)
