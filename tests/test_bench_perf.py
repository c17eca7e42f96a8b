"""pytest-benchmark: one Flow-GRPO iteration of ours and of the released-style loop of benchmark/perf/measure.py on the
tiny random SD3 pipeline (batch 8 of one prompt, T = 10, CFG 4.5, the first 9 steps trained, one optimizer step),
timed as interleaved pairs (ours, reference) so that the ratio survives a noisy machine. Each benchmark's
``extra_info`` holds both variants' seconds per round and ``ratio``, the median over pairs of ours / reference,
which ``make perf`` compares with the committed baseline (benchmark/perf/baseline.json, via benchmark/perf/compare.py).

Skipped by the default ``--benchmark-skip``; ``make perf`` runs it with ``-o addopts="" --benchmark-only``.
"""

import statistics
import time

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from flowzoo.benchmark.perf import measure as perf  # noqa: E402
from tests.test_fidelity_sd3 import model  # noqa: E402,F401
from tests.test_models_sd3 import sd3_dir  # noqa: E402,F401

VARIANTS = {"defaults": {}, "recompute": {"reuse_rollout_graph": False},
            "released_two_steps": {"minibatches": 2}}


@pytest.fixture
def fresh(model):  # noqa: F811
    state = model.trainable_state_dict()
    yield model
    model.load_trainable_state_dict(state)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bench_perf_pair(benchmark, fresh, variant):
    alg = perf.make_algorithm(fresh, VARIANTS[variant])
    state, opt_state = fresh.trainable_state_dict(), alg.optimizer.state_dict()
    seconds = {"ours": [], "reference": []}

    def pair():
        for name in ("ours", "reference"):
            fresh.load_trainable_state_dict(state)
            alg.optimizer.load_state_dict(opt_state)
            t0 = time.perf_counter()
            alg.step([perf.PROMPT]) if name == "ours" else perf.reference_step(alg, [perf.PROMPT])
            seconds[name].append(time.perf_counter() - t0)

    benchmark.pedantic(pair, rounds=10, iterations=1, warmup_rounds=0)
    ours, reference = seconds["ours"][1:], seconds["reference"][1:]  # the first pair warms up
    benchmark.extra_info.update(ours_s=ours, reference_s=reference,
                                ratio=statistics.median(o / r for o, r in zip(ours, reference)))


#: iterations per timed variant: the toy step is ~50 ms, the tiny one ~2 s
TIER_STEPS = {"toy": 5, "tiny": 1}


@pytest.mark.parametrize("tier", ["toy", "tiny"])
def test_bench_tier_step_pair(benchmark, tier):
    """A study cell's training step (benchmark/perf/tier_steps.py): the tier's fast path (ours) against the per-step
    path every tier ran before (reference), interleaved from the same state. The toy tier fuses its update (one call
    and one backward per minibatch, fused AdamW) and draws its rollout noise 7 steps at a time; the tiny tier keeps the
    per-step update (fusing measured 5-7% slower there, docs/perf.md), so its ratio guards against a regression."""
    from flowzoo.benchmark.perf import tier_steps

    alg = tier_steps.build_cell(tier)
    state = __import__("copy").deepcopy(alg.state_dict())
    seconds = {"ours": [], "reference": []}

    def pair():
        seconds["ours"].append(tier_steps.timed_step(alg, state, "fast", TIER_STEPS[tier]))
        seconds["reference"].append(tier_steps.timed_step(alg, state, "per_step", TIER_STEPS[tier]))

    benchmark.pedantic(pair, rounds=6 if tier == "toy" else 4, iterations=1, warmup_rounds=0)
    ours, reference = seconds["ours"][1:], seconds["reference"][1:]  # the first pair warms up
    benchmark.extra_info.update(ours_s=ours, reference_s=reference,
                                ratio=statistics.median(o / r for o, r in zip(ours, reference)))
