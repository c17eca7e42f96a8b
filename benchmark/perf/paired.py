"""Our training iteration against a released step structure on the same rollout, in one process: the GPU check's
timing (``benchmark/perf/gpu.py``) and its CPU gradient check.

Each pair: our iteration (``alg.step``: rollout, reward, our update), then, from the same LoRA weights and optimizer
state, the released update (``reference``) on that iteration's own rollout and advantages. The reference iteration is
our rollout and reward (the releases sample the same way, under no_grad) plus the released update, so the ratio
compares the updates on identical data, and each rollout is paid once. The first pair is an untimed warm-up.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings

import torch

from flowzoo.benchmark.perf.measure import _peak, _peak_reset, model_autocast


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def counted_syncs(device: str, into: dict):
    """On a GPU, count into ``into["host_syncs"]`` the operations inside the block that make the host wait for the
    device (``torch.cuda.set_sync_debug_mode("warn")``: a warning per synchronizing call: ``item()``, a blocking copy,
    ``nonzero``, ...); elsewhere nothing is counted. The mode is restored whatever happens."""
    if not device.startswith("cuda"):
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    into["host_syncs"] = sum("synchroniz" in str(w.message) for w in caught)


def _capture_update(alg, seen: dict):
    plain = alg.update

    def update(traj, advantages):
        seen["traj"], seen["advantages"] = traj, advantages
        return plain(traj, advantages)

    return update


def time_pairs(alg, prompts, reference, repeats: int, device: str) -> dict:
    """``1 + repeats`` pairs (the first untimed); ``reference(alg, traj, advantages)`` runs the released update and
    returns its number of transformer calls with gradient. Medians in seconds, per-pair ratios, peak memory (GiB; on
    the CPU the process's peak RSS). The LoRA weights and optimizer state are restored afterwards."""
    model = alg.model
    state, opt_state = model.trainable_state_dict(), alg.optimizer.state_dict()
    seen: dict = {}
    alg.update = _capture_update(alg, seen)
    rows, peaks, calls, syncs = [], {"ours": 0.0, "reference": 0.0}, None, {}
    try:
        for pair in range(1 + repeats):
            model.load_trainable_state_dict(state)
            alg.optimizer.load_state_dict(opt_state)
            iteration = alg.iteration
            _peak_reset(device)
            # the untimed warm-up counts our iteration's host syncs (the debug mode's warnings cost time)
            with counted_syncs(device, syncs) if pair == 0 else contextlib.nullcontext():
                stats = alg.step(list(prompts))
            peaks["ours"] = max(peaks["ours"], _peak(device))
            traj, advantages = seen.pop("traj"), seen.pop("advantages")
            traj.live = None  # a kept rollout graph is spent; the released update recomputes
            model.load_trainable_state_dict(state)
            alg.optimizer.load_state_dict(opt_state)
            after, alg.iteration = alg.iteration, iteration  # the released update's permutation: this iteration's
            _peak_reset(device)
            t0 = time.perf_counter()
            with model_autocast(model):
                calls = reference(alg, traj, advantages)
            _sync(device)
            released = time.perf_counter() - t0
            peaks["reference"] = max(peaks["reference"], _peak(device))
            alg.iteration = after
            del traj, advantages
            if pair:
                shared = stats.t_sampling + stats.t_reward
                rows.append({"sampling": stats.t_sampling, "reward": stats.t_reward, "ours_training": stats.t_training,
                             "reference_training": released, "ours": shared + stats.t_training,
                             "reference": shared + released})
    finally:
        del alg.update
        model.load_trainable_state_dict(state)
        alg.optimizer.load_state_dict(opt_state)
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    pairs = [r["ours"] / r["reference"] for r in rows]
    out.update(ratio=out["ours"] / out["reference"], pair_ratios=(min(pairs), max(pairs)),
               training_ratio=out["ours_training"] / out["reference_training"], peak_gib=peaks,
               reference_calls=calls, nfe_sampling=stats.nfe_sampling, num_steps=alg.num_steps,
               keeps_rollout_graph=alg.keeps_rollout_graph(), config=dict(vars(alg.config)),
               host_syncs=syncs.get("host_syncs"))
    return out


def gradient_difference(alg, prompts, reference) -> float:
    """Relative difference between our update's gradient and the released update's on one rollout, both for one
    optimizer step over the whole batch without clipping (``minibatches`` 1, ``max_grad_norm`` 0 for the check; the
    config is restored). The LoRA weights and optimizer state are restored afterwards."""
    cfg = alg.config
    saved_config = (cfg.minibatches, cfg.max_grad_norm)
    cfg.minibatches, cfg.max_grad_norm = 1, 0.0
    params = alg.model.trainable_parameters()
    state, opt_state = alg.model.trainable_state_dict(), alg.optimizer.state_dict()
    grads: dict[str, torch.Tensor] = {}
    plain_update, plain_step = alg.update, alg.optimizer.step

    def capture(name):
        def step(*args, **kwargs):
            # a LoRA factor that no trained output depends on (a last block's text stream) has no gradient: zero
            grads.setdefault(name, torch.cat([torch.zeros(p.numel(), device=p.device) if p.grad is None
                                              else p.grad.flatten().float() for p in params]))
        return step

    def update(traj, advantages):
        alg.optimizer.step = capture("reference")
        with model_autocast(alg.model):
            reference(alg, traj, advantages)
        alg.optimizer.step = capture("ours")
        return plain_update(traj, advantages)

    alg.update = update
    try:
        alg.step(list(prompts))
    finally:
        del alg.update
        alg.optimizer.step = plain_step
        cfg.minibatches, cfg.max_grad_norm = saved_config
        alg.optimizer.zero_grad(set_to_none=True)
        alg.model.load_trainable_state_dict(state)
        alg.optimizer.load_state_dict(opt_state)
    ref = grads["reference"]
    if not float(ref.norm()) > 0:
        raise RuntimeError("gradient check: the released update's gradient is zero (nothing to compare)")
    return float((grads["ours"] - ref).norm() / ref.norm())


def format_pairs(result: dict, device: str) -> str:
    mem = "peak GPU memory" if device.startswith("cuda") else "peak process RSS (monotonic)"
    low, high = result["pair_ratios"]
    lines = [f"ours {result['ours']:.3f} s/iteration (sampling {result['sampling']:.3f}, reward {result['reward']:.3f}, "
             f"training {result['ours_training']:.3f}); reference {result['reference']:.3f} (the same rollout and "
             f"reward + the released update {result['reference_training']:.3f}, {result['reference_calls']} "
             "transformer calls with gradient)",
             f"ratio ours/reference: iteration {result['ratio']:.3f} (pairs {low:.3f}-{high:.3f}), training phase "
             f"{result['training_ratio']:.3f}  (medians; T {result['num_steps']}, {result['nfe_sampling']} sampling NFE)",
             f"{mem}: ours {result['peak_gib']['ours']:.2f} GiB, reference {result['peak_gib']['reference']:.2f} GiB; "
             f"recompute-free update {'on' if result['keeps_rollout_graph'] else 'off'}, cfg_batch "
             f"{result['config'].get('cfg_batch')}"]
    if result.get("host_syncs") is not None:
        lines.append(f"host syncs in one iteration of ours (the warm-up, torch.cuda sync debug mode): "
                     f"{result['host_syncs']}")
    if result.get("grad_rel_diff") is not None:
        lines.append(f"gradient relative difference (float32 CPU check): {result['grad_rel_diff']:.2e}")
    return "\n".join(lines)
