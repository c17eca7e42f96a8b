"""The scale rehearsal's matrix: every registered algorithm x every prompt sampler it accepts x LoRA and full
fine-tuning x replicated data parallelism and FSDP2, each a 3-step tiny-tier run on 2 CPU processes (gloo, ranks
forked as tests/test_fsdp.py does) compared with the same run in 1 process.

Each run is built so that processes are left with uneven or no rows, the cases the lockstep contract must survive
(algorithms/engine/lockstep.py):

* the reward (``half_constant``, registered only while a matrix test runs) is the samples' mean brightness, except for
  prompts whose CRC-32 is even, which all score 0.5: their groups have zero advantages, so with
  ``drop_zero_advantage`` (on in every case) a process whose share of the batch is such a group trains no row;
* the filtering samplers (``dynamic``, ``difficulty``) drop such groups and draw again, so the kept groups may all lie
  on one process and the other holds no row of the batch: at seed 4, ``dynamic`` does so at steps 1 and 3 (its draws
  and the reward's constant prompts are known in advance; ``test_the_matrix_leaves_a_process_without_rows`` checks it);
* OP-GRPO and its ablations replay buffer samples from step 2 (``off_policy_groups`` 0.5, one replayed sample per
  such group, truncated at ``t_off`` 1), which lie on some processes only.

The reward is continuous (no JPEG byte or count that a rounding flip could move, as tests/test_distributed_tiny.py
describes), so 2 processes agree with 1 to float rounding: the sum of per-process gradients against one backward
over the batch (~1e-7 relative), amplified by Adam's first step into ~1e-6 of the weights. Tolerance: rtol 1e-4,
atol 1e-5 on every metrics.csv column but the timings (and the padding-call count, which only sharded runs log), and
atol 1e-4 on ``loss``: at ratio 1 the PPO surrogate is a sum of +-A terms that cancel to ~1e-5, so its rounding is the
terms' (DanceGRPO's, measured: 1.7e-5 between 1 and 2 replicated processes, whose ratios agree to 1e-6).

Every 2-process run sets ``FLOWZOO_CHECK_LOCKSTEP=1`` (tests/test_fsdp.py's ``_two_processes``): a sharded run
fails on the first step whose transformer calls differ between processes, naming the phase.
"""

from __future__ import annotations

import itertools
import os
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms import prompt_samplers
from flowzoo.algorithms.engine.base import FSDP_PADDING
from flowzoo.benchmark.cli import main
from flowzoo.rewards.base import Reward, RewardOutput
from tests.test_fsdp import ARGS, CONFIG, _metrics, _two_processes

#: tests/test_fsdp.py's small random tiny run, 3 steps, one minibatch without micro-batches (what DiffusionNFT and
#: AWM allow sharded; Flow-GRPO then back-propagates its rollout's kept graphs), no checkpoints
SEED = 4  # the dynamic sampler keeps one process's groups only at steps 1 and 3 (steps_leaving_a_process_without_rows)
BASE = [a for a in ARGS if not a.startswith(("algorithm.minibatches", "algorithm.micro_batch", "train.checkpoint_every",
                                             "reward=", "algorithm.kl_beta"))]
BASE += ["train.checkpoint_every=0", "reward=half_constant", "algorithm.drop_zero_advantage=true",
         "algorithm.kl_beta=0.04", f"seed={SEED}"]
#: the training prompts: the first scores a constant (even CRC-32), the second does not; every step draws both, so
#: OP-GRPO's dataset-prompt replay (replay_prompts: batch) finds its prompts in the buffer from step 2
TRAIN_PROMPTS = ("a red circle", "two blue squares")
TEST_PROMPTS = ("a green triangle", "the yellow square", "two red circles")
#: the algorithms whose default windows need more than the 3 sampling steps of the other cases
STEPS = {"flow_grpo_fast": 6, "mix_grpo": 6, "mix_grpo_flash": 6, "mix_grpo_flash_star": 6}
SAMPLERS = {
    "uniform": "uniform",
    "replay_buffer": "replay_buffer",
    "variance": "variance",
    "dynamic": "{name: dynamic, max_rounds: 2}",
    "difficulty": "{name: difficulty, max_rounds: 2, success_threshold: 0.5}",
}
FINETUNES = ("lora", "full")
MODES = ("replicated", "sharded")
RTOL, ATOL = 1e-4, 1e-5
#: columns whose value is a cancelling sum, compared with a wider absolute tolerance (see the module docstring)
CANCELLING = {"loss": 1e-4}


class HalfConstant(Reward):
    """Mean brightness of a sample, or 0.5 for every sample of a prompt whose CRC-32 is even (see the docstring)."""

    accepts = ("image", "video")

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        brightness = samples.float().flatten(1).mean(1)
        constant = torch.tensor([zlib.crc32(p.encode()) % 2 == 0 for p in prompts])
        return RewardOutput(torch.where(constant, torch.full_like(brightness, 0.5), brightness))


@contextmanager
def half_constant_reward() -> Iterator[None]:
    """``half_constant`` registered for the duration (forked ranks inherit it)."""
    rewards.REGISTRY.register_class("half_constant")(HalfConstant)
    try:
        yield
    finally:
        rewards.REGISTRY._entries.pop("half_constant", None)


def prompt_args(tmp: Path) -> list[str]:
    """The matrix's prompt files, written under ``tmp``, as config overrides."""
    folder = tmp / "prompts"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text("\n".join(TRAIN_PROMPTS) + "\n")
    (folder / "test.txt").write_text("\n".join(TEST_PROMPTS) + "\n")
    return ["prompts.source=files", f"prompts.train={folder / 'train.txt'}", f"prompts.test={folder / 'test.txt'}"]


def case_args(algorithm: str, sampler: str, finetune: str, tmp: Path) -> list[str]:
    args = [*BASE, *prompt_args(tmp), f"algorithm.name={algorithm}", f"train.prompt_sampler={SAMPLERS[sampler]}",
            f"model.args.finetune={finetune}"]
    if algorithm in STEPS:
        args.append(f"algorithm.num_steps={STEPS[algorithm]}")
    if issubclass(algorithms.get(algorithm), algorithms.get("op_grpo")):
        args += ["algorithm.off_policy_groups=0.5", "algorithm.replay_k=1",
                 f"algorithm.replay_prompts={'buffer' if sampler == 'replay_buffer' else 'batch'}"]
        if algorithms.get(algorithm).preset.get("t_off", 1) is not None:  # the no-truncation ablation keeps None
            args.append("algorithm.t_off=1")
    return args


def matrix() -> list[tuple[str, str, str]]:
    """(algorithm, sampler, finetune) of every case; each runs replicated and sharded. Every algorithm takes every
    sampler (OP-GRPO's buffer prompts come from ``replay_buffer``, its replays otherwise from the dataset's prompts:
    ``case_args``)."""
    return list(itertools.product(algorithms.names(), prompt_samplers.names(), FINETUNES))


#: the subset `make test` runs: the paper's method with its buffer prompts (the path that aborted), the on-policy
#: baseline with a filtering sampler (a process left with no row), a decoupled method (its own update), each sharded
SUBSET = [("op_grpo", "replay_buffer", "full"), ("flow_grpo", "dynamic", "full"), ("diffusion_nft", "uniform", "lora")]


#: settings the matrix's defaults do not reach, each a case of its own: {name: (algorithm, sampler, finetune, args)}
VARIANTS = {
    # DanceGRPO trains a random subset of steps per sample: a process keeps the graphs of the steps any sample of the
    # global batch trains (StepPlan.graph_steps), not of its own rows' (which hung sharded: one process back-propagated
    # a step's graph the other never kept)
    "dance_grpo-kept-graphs": ("dance_grpo", "uniform", "lora", ["algorithm.reuse_rollout_graph=true"]),
    # Flow-GRPO-Fast's first release: a group's ODE prefix runs once, then branches (a group may span processes)
    "flow_grpo_fast-shared-prefix": ("flow_grpo_fast", "dynamic", "full", ["algorithm.shared_prefix=true"]),
    # OP-GRPO with 2 epochs of 2 minibatches in chunks of 1 sample: the recomputed chunks are padded per minibatch
    "op_grpo-epochs-chunks": ("op_grpo", "replay_buffer", "full",
                              ["algorithm.inner_epochs=2", "algorithm.minibatches=2", "algorithm.micro_batch=1"]),
    # AWM with 2 minibatches of 1-sample micro-batches, the second against the rollout's weights
    "awm-chunks": ("awm", "dynamic", "full", ["algorithm.minibatches=2", "algorithm.micro_batch=1"]),
    # Flow-DPPO with 2 epochs of 2 minibatches in chunks of 1 sample: the rollout's means anchor every optimizer step
    # after the first, the KL mask acts, and its diagnostics are summed (and maxed) over processes
    "flow_dppo-epochs-chunks": ("flow_dppo", "dynamic", "full",
                                ["algorithm.inner_epochs=2", "algorithm.minibatches=2", "algorithm.micro_batch=1"]),
    # GRPO-Guard with 2 minibatches in chunks of 1 sample: the normalised ratio off the rollout's means
    "grpo_guard-chunks": ("grpo_guard", "uniform", "lora", ["algorithm.minibatches=2", "algorithm.micro_batch=1"]),
}


def run(tmp: Path, algorithm: str, sampler: str, finetune: str, modes: Sequence[str] = MODES,
        extra: Sequence[str] = (), name: str | None = None) -> dict[str, pd.DataFrame]:
    """The 1-process run and the 2-process runs of ``modes`` of one case (``extra``: more overrides):
    {"one" | mode: metrics}."""
    args = [*case_args(algorithm, sampler, finetune, tmp), *extra]
    name = name or f"{algorithm}-{sampler}-{finetune}"
    os.environ["OMP_NUM_THREADS"] = "1"
    found = {}
    code = main(["train", str(CONFIG), *args, f"run_dir={tmp / name / 'one'}", "--quiet"])
    assert code == 0, f"{name}: 1 process exited {code}"
    found["one"] = _metrics(tmp / name / "one")
    for mode in modes:
        shard = ["model.args.fsdp=true"] if mode == "sharded" else []
        codes = _two_processes([*args, *shard, f"run_dir={tmp / name / mode}"])  # the lockstep check on
        assert codes == [0, 0], f"{name} {mode}: the 2 processes exited {codes}"
        found[mode] = _metrics(tmp / name / mode)
    return found


def compare(found: dict[str, pd.DataFrame], what: str) -> list[str]:
    """The differences of each 2-process run from the 1-process one beyond the tolerance (empty: equal)."""
    one, problems = found["one"], []
    for mode, frame in found.items():
        if mode == "one":
            continue
        frame = frame.drop(columns=[FSDP_PADDING], errors="ignore")
        if list(frame.columns) != list(one.columns) or len(frame) != len(one):
            problems.append(f"{what} {mode}: columns or rows differ ({sorted(set(frame.columns) ^ set(one.columns))}, "
                            f"{len(frame)} vs {len(one)} rows)")
            continue
        for column in one.columns:
            a, b = one[column].to_numpy(float), frame[column].to_numpy(float)
            if not np.allclose(b, a, rtol=RTOL, atol=CANCELLING.get(column, ATOL), equal_nan=True):
                worst = np.nanmax(np.abs(a - b))
                problems.append(f"{what} {mode}: {column} differs by up to {worst:.3g} ({a.tolist()} vs {b.tolist()})")
    return problems


def steps_leaving_a_process_without_rows(max_rounds: int = 2, steps: int = 3, groups: int = 2) -> list[int]:
    """The training steps at which the ``dynamic`` sampler's kept groups all lie on one of the 2 processes (known from
    its draws and the reward's constant prompt, without running a model): the other process then holds no row."""
    from flowzoo.algorithms.prompt_samplers.base import uniform_order
    from flowzoo.streams import PROMPT_REFILL

    found = []
    for step in range(1, steps + 1):
        order = uniform_order(len(TRAIN_PROMPTS), SEED, step, groups * max_rounds, PROMPT_REFILL)
        kept = [i for i, index in enumerate(order) if zlib.crc32(TRAIN_PROMPTS[index].encode()) % 2]
        chosen = (kept + [i for i in range(len(order)) if i not in kept])[:groups]
        # position i of a round of `groups` groups lies on process i * 2 // groups
        if kept and len({(i % groups) * 2 // groups for i in chosen}) == 1:
            found.append(step)
    return found
