"""The scale rehearsal's algorithm x prompt sampler x fine-tuning x sharding matrix (tests/scale_matrix.py): each
case on 2 CPU processes gives the metrics of 1 process. ``make test`` runs a subset; ``make scale-check`` runs every
case (``FLOWZOO_SCALE_MATRIX=full``)."""

import os

import pytest
import torch

from tests import scale_matrix

FULL = os.environ.get("FLOWZOO_SCALE_MATRIX") == "full"
CASES = scale_matrix.matrix() if FULL else scale_matrix.SUBSET


@pytest.fixture(autouse=True)
def _reward():
    with scale_matrix.half_constant_reward():
        yield


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("algorithm,sampler,finetune", CASES, ids=["-".join(c) for c in CASES])
def test_two_processes_replicated_and_sharded_equal_one(tmp_path, algorithm, sampler, finetune):
    modes = scale_matrix.MODES if FULL or (algorithm, sampler, finetune) != scale_matrix.SUBSET[1] else ("sharded",)
    found = scale_matrix.run(tmp_path, algorithm, sampler, finetune, modes)
    problems = scale_matrix.compare(found, f"{algorithm} x {sampler} x {finetune}")
    assert not problems, "\n".join(problems)
    if "off_policy_frac" in found["one"]:  # OP-GRPO and its ablations replayed buffer samples (from step 2)
        assert found["one"]["off_policy_frac"].max() > 0


VARIANTS = sorted(scale_matrix.VARIANTS) if FULL else ["dance_grpo-kept-graphs"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_beyond_the_defaults_equal_one_process(tmp_path, variant):
    algorithm, sampler, finetune, extra = scale_matrix.VARIANTS[variant]
    modes = scale_matrix.MODES if FULL else ("sharded",)
    found = scale_matrix.run(tmp_path, algorithm, sampler, finetune, modes, extra, name=variant)
    problems = scale_matrix.compare(found, variant)
    assert not problems, "\n".join(problems)


def test_the_matrix_leaves_a_process_without_rows():
    """The matrix's seed and reward make the filtering sampler keep one process's groups only (steps 1 and 3), and
    the 2 x 4 = 8 samples of a step split as 4 per process, so a constant group empties one process's trained rows."""
    assert scale_matrix.steps_leaving_a_process_without_rows() == [1, 3]
