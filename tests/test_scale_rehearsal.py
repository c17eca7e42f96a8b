"""Every paper suite rehearsed on tiny pipelines of its model, sharded and replicated on 2 CPU processes, killed and
resumed on 1, then evaluated and exported (tests/scale_rehearsal.py). ``make test`` rehearses OP-GRPO of
paper-sd3-ocr (the paper's method with its replay); ``make scale-check`` every algorithm of every suite."""

import os

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from tests import scale_matrix, scale_rehearsal  # noqa: E402

FULL = os.environ.get("FLOWZOO_SCALE_MATRIX") == "full"
SUITES = sorted(scale_rehearsal.SUITES) if FULL else ["paper-sd3-ocr"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{suite: [(algorithm, config file)]}, the tiny pipelines built once."""
    tmp = tmp_path_factory.mktemp("rehearsal")
    with scale_matrix.half_constant_reward():
        return {name: scale_rehearsal.cells(name, tmp) for name in SUITES}


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("suite", SUITES)
def test_every_algorithm_of_the_suite_rehearses_sharded_and_replicated(built, suite, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cells = built[suite]
    algorithms = [a for a, _ in cells]
    assert algorithms == scale_rehearsal.load_suite(suite).algorithms or not FULL
    if not FULL:
        cells = [c for c in cells if c[0] == "op_grpo"]
    problems = []
    with scale_matrix.half_constant_reward():
        for algorithm, config in cells:
            problems += scale_rehearsal.rehearse(config, tmp_path / algorithm)
    assert not problems, "\n".join(problems)
