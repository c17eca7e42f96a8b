"""OP-GRPO's replay buffer of high-reward trajectories (arXiv 2604.04142, its replay buffer).

Rules (the papers give the rules, not the numbers; every number here is a documented knob, see docs/op_grpo.md):

* **Best of group.** After each rollout the algorithm offers the highest-reward fresh trajectory of each group.
* **Admission gate** (``admits``): a candidate is offered only if it is a success relative to its group: with the
  rule ``above_group_mean`` its reward must be strictly greater than the mean reward of its whole group (fresh and
  replayed samples: the samples its advantage is computed against), i.e. its advantage is positive; a group whose
  rewards are all equal (e.g. all zero under a sparse reward) offers nothing. ``min_reward`` further requires
  ``reward >= min_reward``. Why: the method keeps "high-quality trajectories" (arXiv 2604.04142); without a gate the
  best of an all-failure group is stored and later replayed in place of a fresh sample, which under sparse rewards
  replays failures. ``any`` (no gate) is the ablation.
* **Uniqueness** (``unique=True``): at most one entry per prompt. A candidate whose prompt already has an entry is
  compared with *that* entry only and replaces it iff ``candidate.reward > score(entry)``. A prompt is its condition
  (``ReplayEntry.key``): the text, and an edit prompt's source image (``flowzoo.source_images.condition_key``), so
  one instruction on two source images holds two entries and each is replayed only with its own source.
* **Capacity.** A candidate for a prompt without an entry (or any candidate when ``unique=False``) is inserted while
  the buffer has room; when it is full it replaces the weakest entry (lowest decayed score; ties: the oldest, then the
  earliest inserted) iff ``candidate.reward > score(weakest)``. Comparisons are strict, so an equal reward never
  evicts an entry.
* **Decay.** ``step()`` is called once per training step and ages every entry by one. The decayed score of an entry
  inserted with reward ``r`` and aged ``a`` steps is ``r * decay**a`` for ``r >= 0`` and ``r / decay**a`` for
  ``r < 0``: multiplicative on the magnitude, and always in the direction of *lower* scores, so an old entry becomes
  easier to replace whatever the sign of its reward (a plain ``r * decay**a`` would move negative scores up towards 0
  and make old failures harder to evict). ``decay = 1`` disables decay. A zero reward stays 0.
  The stored ``reward`` is never changed; only the ranking score decays (OP-GRPO re-rewards a reused sample anyway).

An entry holds what a reuse needs: the recorded latents (only the first ``t_off + 1`` when the reuse truncates at
``t_off``), the behaviour log-probabilities pi_off of every step, the plan they were sampled under (its grid: sigmas,
SDE mask, kernel, noise level), the reward, the policy version (training iteration) that produced it, the prompt and its metadata. The text
condition is not stored: an entry is only reused in a group of its own prompt, whose condition the rollout encodes
anyway. Tensors are kept on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from flowzoo.algorithms.engine.trajectory import StepPlan
from flowzoo.source_images import condition_key

Outcome = Literal["inserted", "replaced", "rejected"]
Admission = Literal["above_group_mean", "any"]


def admits(reward: float, group_rewards: torch.Tensor, rule: Admission = "above_group_mean",
           min_reward: float | None = None) -> bool:
    """Whether a candidate of reward ``reward`` from a group whose rewards (its own included) are ``group_rewards``
    passes the admission gate (module docstring). A non-finite reward or group mean never passes."""
    if not math.isfinite(reward) or (min_reward is not None and not reward >= min_reward):
        return False
    if rule == "any":
        return True
    if rule != "above_group_mean":
        raise ValueError(f"unknown admission rule {rule!r}; valid: above_group_mean, any")
    group = group_rewards.double()
    # all-equal groups are rejected explicitly: their float mean may round a hair below the common value
    return bool(group.max() > group.min()) and reward > float(group.mean())


@dataclass
class ReplayEntry:
    prompt: str
    metadata: dict
    latents: torch.Tensor  # [L, ...] the recorded states 0 .. L-1 (L = T + 1, or t_off + 1 when truncating)
    log_probs: torch.Tensor  # [T] behaviour log-probs pi_off of each transition (0 on ODE steps)
    reward: float
    version: int  # the training iteration whose parameters sampled it
    #: the grid it was sampled on (sigmas, SDE steps, kernel, noise level; its ``train`` row is unused): a reuse
    #: needs the same grid (``StepPlan.same_grid``); None for an entry that holds a prompt and a reward only
    plan: StepPlan | None = None
    guidance: float | None = None
    age: int = 0  # training steps since insertion (drives the decay)
    serial: int = 0  # insertion counter (tie-break, bookkeeping)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The condition this entry replays in: its prompt text, with its source image where it has one."""
        return condition_key(self.prompt, self.metadata)

    def nbytes(self) -> int:
        held = [self.latents, self.log_probs] + ([self.plan.sigmas, self.plan.sde] if self.plan is not None else [])
        return sum(t.numel() * t.element_size() for t in held)

    @staticmethod
    def from_state(state: dict[str, Any]) -> "ReplayEntry":
        """An entry as ``ReplayBuffer.state_dict`` stored it; entries of checkpoints written before entries held their
        plan (``sigmas``, ``sde``, ``kind``, ``noise_level`` fields) load as the same grid."""
        state = dict(state)
        if "sigmas" in state:
            sigmas, sde = state.pop("sigmas"), state.pop("sde")
            kind, noise_level = state.pop("kind", "flow_grpo"), state.pop("noise_level", 0.7)
            state["plan"] = StepPlan(sigmas, sde, torch.zeros(1, len(sde), dtype=torch.bool), kind, noise_level)
        elif isinstance(state.get("plan"), dict):
            state["plan"] = StepPlan(**state["plan"])
        return ReplayEntry(**state)


class ReplayBuffer:
    """Prompt-keyed buffer of the best trajectories; see the module docstring for the rules."""

    def __init__(self, capacity: int, decay: float = 1.0, unique: bool = True):
        if capacity < 1:
            raise ValueError(f"replay buffer capacity must be >= 1, got {capacity}")
        if not 0 < decay <= 1:
            raise ValueError(f"replay buffer decay must be in (0, 1], got {decay}")
        self.capacity = int(capacity)
        self.decay = float(decay)
        self.unique = bool(unique)
        self.entries: list[ReplayEntry] = []
        self.serial = 0
        self.counts = {"inserted": 0, "replaced": 0, "rejected": 0}

    def __len__(self) -> int:
        return len(self.entries)

    # ---- scores ---------------------------------------------------------------------------------------------
    def score(self, entry: ReplayEntry) -> float:
        """The decayed score used for ranking (see the module docstring)."""
        if self.decay == 1.0 or entry.age == 0:
            return entry.reward
        factor = self.decay**entry.age
        return entry.reward * factor if entry.reward >= 0 else entry.reward / factor

    def step(self) -> None:
        """Age every entry by one training step."""
        for e in self.entries:
            e.age += 1

    def _weakest(self) -> int:
        return min(range(len(self.entries)), key=lambda i: (self.score(self.entries[i]), -self.entries[i].age,
                                                             self.entries[i].serial))

    # ---- insertion ------------------------------------------------------------------------------------------
    def offer(self, entry: ReplayEntry) -> Outcome:
        """Offer a candidate; returns what happened. The candidate's age is reset to 0."""
        if not math.isfinite(entry.reward):
            self.counts["rejected"] += 1
            return "rejected"
        entry.age = 0
        slot: int | None = None
        if self.unique:
            key = entry.key
            slot = next((i for i, e in enumerate(self.entries) if e.key == key), None)
        if slot is None and len(self.entries) < self.capacity:
            entry.serial = self.serial
            self.serial += 1
            self.entries.append(entry)
            self.counts["inserted"] += 1
            return "inserted"
        if slot is None:
            slot = self._weakest()
        if entry.reward > self.score(self.entries[slot]):
            entry.serial = self.serial
            self.serial += 1
            self.entries[slot] = entry
            self.counts["replaced"] += 1
            return "replaced"
        self.counts["rejected"] += 1
        return "rejected"

    # ---- lookup ---------------------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """Whether a condition (``ReplayEntry.key``: a text prompt is its own key) has an entry."""
        return any(e.key == key for e in self.entries)

    def lookup(self, key: str, k: int = 1) -> list[ReplayEntry]:
        """Up to ``k`` distinct entries of the condition ``key`` (``ReplayEntry.key``: a text prompt is its own key),
        highest decayed score first (ties: newest first)."""
        found = [e for e in self.entries if e.key == key]
        found.sort(key=lambda e: (-self.score(e), e.age, -e.serial))
        return found[:k]

    # ---- diagnostics ----------------------------------------------------------------------------------------
    def nbytes(self) -> int:
        return sum(e.nbytes() for e in self.entries)

    def mean_age(self) -> float:
        return sum(e.age for e in self.entries) / len(self.entries) if self.entries else 0.0

    def mean_score(self) -> float:
        return sum(self.score(e) for e in self.entries) / len(self.entries) if self.entries else 0.0

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "decay": self.decay,
            "unique": self.unique,
            "serial": self.serial,
            "counts": dict(self.counts),
            "entries": [asdict(e) for e in self.entries],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the entries and counters. The rules (capacity, decay, uniqueness) stay those this buffer was
        built with, so a resumed run may change them; entries beyond a smaller capacity are evicted weakest-first."""
        self.serial = int(state["serial"])
        self.counts = dict(state["counts"])
        self.entries = [ReplayEntry.from_state(e) for e in state["entries"]]
        while len(self.entries) > self.capacity:
            self.entries.pop(self._weakest())
