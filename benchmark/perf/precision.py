"""``flowzoo perf --precision``: how far the update's recomputed log-probabilities drift from the rollout's under
reduced precision, step by step (issue trackers of every release: "the first PPO ratio is not 1 under bf16").

For each compute dtype the SD3 adapter samples a Flow-GRPO rollout (no gradients, as the rollout does) and then
scores the same recorded transitions as the update does (autograd on, the detached unconditional branch), once on
the whole batch, once in two halves (what ``minibatches: 2`` recomputes), and once with a float32 copy of the model
(a rollout in reduced precision trained in float32). The drift of a step is
max |log pi_recomputed - log pi_sampled| over the batch: the first on-policy PPO ratio is exp(drift) away from 1.
bfloat16 and float16 run under CPU/GPU autocast (the adapter's ``dtype``); float32 is the reference.
"""

from __future__ import annotations

import torch

from flowzoo.benchmark.perf.measure import PROMPT, load_model, make_algorithm
from flowzoo.markdown import markdown_table

PRECISIONS = ("float32", "bfloat16", "float16")


def step_drift(alg, prompts: list[str], parts: int = 1, scorer=None) -> list[float]:
    """Per trained step, max |recomputed - sampled log-prob| of one rollout of ``alg``, the batch scored in ``parts``
    pieces by ``scorer`` (another algorithm over the same weights, e.g. in float32; default ``alg`` itself)."""
    traj = alg.collect(prompts, [{}] * len(prompts))
    if scorer is not None:  # the scorer's own prompt encoding (its encoders run in its precision)
        traj.cond = scorer.model.encode(traj.prompts, traj.metadata)
    scorer = scorer or alg
    drift = []
    for t in range(traj.num_steps):
        rows = torch.nonzero(traj.train[:, t]).squeeze(1)
        if not len(rows):
            continue
        worst = 0.0
        with torch.enable_grad():  # the update's path (the unconditional branch detached), not the rollout's
            for piece in rows.chunk(parts):
                out = scorer.score_transition(traj, piece, t)
                worst = max(worst, float((out.log_prob.detach() - traj.log_probs[piece, t]).abs().max()))
        drift.append(worst)
    return drift


def measure(path: str | None, device: str, lora_rank: int, precisions=PRECISIONS, prompts: int = 1,
            overrides: dict | None = None) -> dict[str, dict[str, list[float]]]:
    """{precision: {"whole batch": per-step drift, "two halves": ..., "float32 weights": ...}}: the rollout's own
    precision recomputing on the whole batch and in two halves, and a float32 copy of the model recomputing it."""
    overrides = {"reuse_rollout_graph": False, **(overrides or {})}
    reference = make_algorithm(load_model(path, device, lora_rank, dtype="float32"), overrides)
    batch = [PROMPT] * prompts
    result = {}
    for precision in precisions:
        alg = make_algorithm(load_model(path, device, lora_rank, dtype=precision), overrides)
        result[precision] = {"whole batch": step_drift(alg, batch), "two halves": step_drift(alg, batch, parts=2),
                             "float32 weights": step_drift(alg, batch, scorer=reference)}
    return result


def format_drift(result: dict[str, dict[str, list[float]]]) -> str:
    rows = []
    for precision, drifts in result.items():
        for how, drift in drifts.items():
            steps = " ".join(f"{d:.1e}" for d in drift)
            worst = max(drift, default=0.0)
            rows.append([precision, how, steps, f"{worst:.2e}",
                         f"[{torch.tensor(-worst).exp():.6f}, {torch.tensor(worst).exp():.6f}]"])
    return "\n".join(["max |log pi_recomputed - log pi_sampled| per trained step (Flow-GRPO, one rollout)",
                      *markdown_table(["precision", "recomputed on", "per step", "max", "first ratio within"], rows)])
