"""A study cell's training step on the toy and tiny tiers, on the per-step path and on the tier's fast path, for the
interleaved pytest-benchmark pairs of ``tests/test_bench_perf.py`` (``make perf``).

The per-step path is the update as every tier ran it before the tiers chose a fused one: one network call and one
backward per trained step (``FlowModel.fused_update`` off), torch's default AdamW, and rollout noise drawn one step at a
time (``algorithms.engine.sde.SERIAL_NORMAL_LIMIT`` 0). Both paths compute the same iteration to float rounding
(tests/test_fused_update.py, tests/test_noise_streams.py); the pair times them from the same state, in one process.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Iterator

import torch

from flowzoo.algorithms.engine import sde

PATHS = ("fast", "per_step")
#: the cells the pairs time: (suite, task, algorithm), each suite's first study task
CELLS = {"toy": ("op-grpo-study", "toy2d_sep64_sparse", "flow_grpo"),
         "tiny": ("tiny-rare-counting-study", "tiny_counting_rare", "flow_grpo")}


def build_cell(tier: str, algorithm: str | None = None):
    """The algorithm of a tier's study cell (its suite's resolved config, seed 0), nothing written."""
    from flowzoo.benchmark.run import experiment
    from flowzoo.benchmark.run.suite import expand, load_suite

    suite_name, task, default = CELLS[tier]
    name = algorithm or default
    suite = load_suite(suite_name)
    config = next(c for c in expand(suite, Path("unused-runs"))  # nothing is written
                  if c.task == task and c.algorithm_name == name and c.seed == suite.seeds[0])
    return experiment.build(config).algorithm


@contextlib.contextmanager
def per_step_path(alg) -> Iterator[None]:
    """Within the block ``alg`` trains on the per-step path (see the module docstring); its optimizer state is kept
    across the switch."""
    model, optimizer, limit = alg.model, alg.optimizer, sde.SERIAL_NORMAL_LIMIT
    had_own = "fused_update" in vars(model)
    own = vars(model).get("fused_update")
    model.fused_update = False
    plain = torch.optim.AdamW(optimizer.param_groups[0]["params"], **{
        k: optimizer.defaults[k] for k in ("lr", "weight_decay", "eps", "betas")})
    plain.load_state_dict(optimizer.state_dict())
    alg.optimizer, sde.SERIAL_NORMAL_LIMIT = plain, 0
    try:
        yield
    finally:
        optimizer.load_state_dict(plain.state_dict())
        alg.optimizer, sde.SERIAL_NORMAL_LIMIT = optimizer, limit
        if had_own:
            model.fused_update = own
        else:
            del model.fused_update


def timed_step(alg, state: dict, path: str, steps: int = 1) -> float:
    """Seconds of ``steps`` training iterations of ``alg`` from ``state`` on ``path`` (``fast`` or ``per_step``)."""
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; known: {', '.join(PATHS)}")
    alg.load_state_dict(copy.deepcopy(state))
    with per_step_path(alg) if path == "per_step" else contextlib.nullcontext():
        t0 = time.perf_counter()
        for i in range(steps):
            alg.train_step(i + 1)
        return time.perf_counter() - t0


def timed_pairs(alg, rounds: int, steps: int = 1) -> dict[str, list[float]]:
    """Seconds of ``steps`` training iterations on the fast and the per-step path, alternately, each from the same
    saved state; the first pair warms up and is dropped."""
    state = copy.deepcopy(alg.state_dict())
    seconds: dict[str, list[float]] = {path: [] for path in PATHS}
    for _ in range(rounds + 1):
        for path in PATHS:
            seconds[path].append(timed_step(alg, state, path, steps))
    return {path: values[1:] for path, values in seconds.items()}
