"""pytest-benchmark: one Flow-GRPO iteration of ours and of the released-style loop of benchmark/perf.py on the
tiny random SD3 pipeline (batch 8 of one prompt, T = 10, CFG 4.5, the first 9 steps trained, one optimizer step).
``flowzoo perf`` prints the interleaved medians, ratio and phase split; this file gives pytest-benchmark's view.

Skipped by the default ``--benchmark-skip``; run with ``pytest tests/test_bench_perf.py --benchmark-only``.
"""

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from benchmark import perf  # noqa: E402
from tests.test_fidelity_sd3 import model  # noqa: E402,F401
from tests.test_models_sd3 import sd3_dir  # noqa: E402,F401


@pytest.fixture
def fresh(model):  # noqa: F811
    state = model.trainable_state_dict()
    yield model
    model.load_trainable_state_dict(state)


@pytest.mark.parametrize("reuse", [False, True], ids=["default", "reuse_rollout_graph"])
def test_bench_perf_ours(benchmark, fresh, reuse):
    alg = perf.make_algorithm(fresh, {"reuse_rollout_graph": reuse})
    benchmark.pedantic(alg.step, args=([perf.PROMPT],), rounds=3, iterations=1, warmup_rounds=1)


def test_bench_perf_reference(benchmark, fresh):
    alg = perf.make_algorithm(fresh, {})
    benchmark.pedantic(perf.reference_step, args=(alg, [perf.PROMPT]), rounds=3, iterations=1, warmup_rounds=1)
