"""The lockstep contract of a sharded run, checked: every process makes the same transformer calls, of the same kind,
in the same order, whatever rows it holds.

Under FSDP2 (``models/sharding.py``) every call of a sharded transformer is a collective: its forward all-gathers each
block's weights, and a backward through it all-gathers them again and reduce-scatters their gradients. A process that
makes a call its peers do not make leaves them waiting in a collective (a hang on NCCL) or pairs its all-gather with a
peer's reduce-scatter (gloo: "Received data size doesn't match expected size"). Rollouts, updates and evaluations
keep the processes in step by construction (equal slices of the batch, padding calls of the same kind where a
process holds fewer rows: ``Algorithm.lockstep_padding``); this module checks it.

:class:`CallLedger` wraps a model's ``predict`` (one transformer call; ``models/base.py``) and records, per phase of a
training step (``rollout``, ``update``, ``evaluation``), one event per call:

* ``f``: a forward without autograd (rollout, evaluation, a recomputed old or reference log-prob);
* ``g``: a forward with autograd (its graph will be back-propagated);
* ``b``: a backward through one such forward's graph (recorded by a hook on the call's output, when the gradient
  reaches it: a graph kept from the rollout and back-propagated in the update counts its ``g`` in ``rollout`` and its
  ``b`` in ``update``).

A call of the frozen reference copy of a full fine-tuning (a second sharded module, ``FlowModel.fsdp_modules``) is
marked ``F``/``G``/``B`` instead. :meth:`CallLedger.check` gathers every process's events at the end of a step and
raises :class:`LockstepError`, one line naming the step, the phase and each process's counts, when they differ.

The check runs under sharding when ``FLOWZOO_CHECK_LOCKSTEP=1`` is set (a debug switch: the tests of every sharded
path set it); it costs one small ``all_gather_object`` per step and per evaluation. A replicated run keeps no lockstep
(its only collectives are the gradient all-reduce and the statistics) and is not checked.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from flowzoo.algorithms.engine.rollout import sample_ode
from flowzoo.models.base import at_least_float32

if TYPE_CHECKING:
    from flowzoo.algorithms.engine.trajectory import Trajectory

#: the environment switch of the check
ENV = "FLOWZOO_CHECK_LOCKSTEP"
KINDS = {"f": "forward", "g": "forward+grad", "b": "backward", "F": "reference forward",
         "G": "reference forward+grad", "B": "reference backward"}


class LockstepError(RuntimeError):
    """The processes of a sharded run made different transformer calls in one phase (a bug: one line)."""


def requested() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


class CallLedger:
    """The transformer calls of one process, per phase (see the module docstring)."""

    def __init__(self, model: Any):
        self.model = model
        self.events: dict[str, list[str]] = {}
        self.phase_name = "outside a step"
        inner = model.predict
        ledger = self

        def predict(x, sigma, cond):
            out = inner(x, sigma, cond)
            reference = ledger._is_reference()
            if torch.is_grad_enabled() and out.requires_grad:
                ledger.record("G" if reference else "g")
                out.register_hook(lambda grad, tag="B" if reference else "b": ledger.record(tag) or None)
            else:
                ledger.record("F" if reference else "f")
            return out

        model.predict = predict  # an instance attribute: every call of the adapter goes through it

    @classmethod
    def attach(cls, model: Any) -> "CallLedger":
        """The model's ledger (one per model instance, however many algorithms are built on it)."""
        ledger = model.__dict__.get("_call_ledger")
        if ledger is None:
            ledger = model.__dict__["_call_ledger"] = cls(model)
        return ledger

    def _is_reference(self) -> bool:
        modules = self.model.fsdp_modules()
        current = getattr(self.model, "transformer", None)
        return len(modules) > 1 and current is not None and current is modules[1]

    def record(self, event: str) -> None:
        self.events.setdefault(self.phase_name, []).append(event)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous, self.phase_name = self.phase_name, name
        try:
            yield
        finally:
            self.phase_name = previous

    def check(self, dist: Any, where: str) -> None:
        """Compare this process's events since the last check with every other process's (a collective: every
        process calls it at the same point); raise :class:`LockstepError` on a difference. Clears the events."""
        mine, self.events = {k: "".join(v) for k, v in self.events.items()}, {}
        every = dist.all_gather_object(mine)
        phases = sorted(set().union(*every))
        for phase in phases:
            calls = [ranks.get(phase, "") for ranks in every]
            if len(set(calls)) == 1:
                continue
            counts = "; ".join(f"rank {r}: {describe(c)}" for r, c in enumerate(calls))
            if len({describe(c) for c in calls}) == 1:
                first = next(i for i in range(min(map(len, calls))) if len({c[i] for c in calls}) > 1)
                counts += (f" (same counts, another order: call {first + 1} is "
                           + ", ".join(f"{KINDS[c[first]]} on rank {r}" for r, c in enumerate(calls)) + ")")
            raise LockstepError(f"lockstep broken at {where}, phase {phase!r}: the processes made different "
                                f"transformer calls ({counts}); under FSDP each is a collective")


def describe(events: str) -> str:
    """``"3 forward, 2 forward+grad, 2 backward"`` (``"no call"`` when empty)."""
    counts = Counter(events)
    return ", ".join(f"{counts[k]} {name}" for k, name in KINDS.items() if counts[k]) or "no call"


#: a method's forward-process draws: (the rows' generators, a tensor like their samples) -> (steps or times, noise)
ForwardDraw = Callable[[list[torch.Generator], torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class UpdatePart:
    """One forward-backward part of an update that scores whole samples (``LockstepPadding.update_parts``): rows of
    ``source`` with their clean samples and forward-process draws, ready to score. A padding part (``scale`` 0) is
    one row of a padding trajectory: its calls keep a sharded model's processes in lockstep, its loss is multiplied by
    0, its calls are not counted in NFE (``counted``) and it records nothing."""

    source: Trajectory  # the trajectory ``rows`` index
    rows: torch.Tensor  # host indices of the part's samples in ``source``
    scale: float  # 1.0, or 0.0 for a padding part
    x0: torch.Tensor  # the samples' clean latents (``source.final[rows]``, at least float32)
    draws: tuple[torch.Tensor, torch.Tensor] | None = None  # their forward draws, one row per sample

    @property
    def padding(self) -> bool:
        return not self.scale

    def counted(self, model: Any) -> contextlib.AbstractContextManager:
        """Within this context the model's calls count in NFE unless the part is padding (``FlowModel.uncounted``)."""
        return model.uncounted(self.padding)

    def take(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (one per sample of the update's trajectory, e.g. advantages) at the part's rows; zeros for a
        padding part, whose row has none."""
        return values.new_zeros(len(self.rows)) if self.padding else values[self.rows]


def _cut(draws: tuple[torch.Tensor, ...] | None, part: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    return None if draws is None else tuple(d[part] for d in draws)


class LockstepPadding:
    """The padding calls of ``Algorithm`` (its base class): where a process holds fewer rows than another, the calls
    it makes only to keep a sharded model's processes in lockstep, each of the same kind as the calls it stands for.
    Uses the algorithm's ``model``, ``dist``, ``seed``, ``lockstep`` (the ledger or None), ``_padding_source``,
    ``score_transition``, ``_step_terms`` and ``transition_chunks``."""

    def lockstep_phase(self, name: str) -> contextlib.AbstractContextManager:
        """Within this context the lockstep check files the transformer calls under phase ``name``."""
        return self.lockstep.phase(name) if self.lockstep is not None else contextlib.nullcontext()

    def check_lockstep(self, where: str) -> None:
        """Compare the transformer calls every process made since the last check (a collective; a no-op unless
        the check is on): one-line ``LockstepError`` naming ``where``, the phase and the counts on a difference."""
        if self.lockstep is not None:
            self.lockstep.check(self.dist, where)

    def lockstep_padding(self, calls: int) -> int:
        """How many network calls this process adds to its ``calls`` so that every process makes as many: a sharded
        transformer's every call is a collective (models/sharding.py), and a process whose share of a minibatch has
        fewer trained (sample, step) chunks than another's would otherwise leave it waiting. 0 unless sharded."""
        if not self.model.sharded:
            return 0
        return max(self.dist.all_gather_object(calls)) - calls

    @torch.no_grad()
    def padding_forwards(self, count: int, traj: Trajectory) -> None:
        """``count`` transformer calls without autograd whose results are discarded (each scores a row of ``traj``):
        a process's share of calls that only some processes make, counted beforehand with ``lockstep_padding``
        (forwards without autograd are the same collectives whatever their input and order)."""
        if count:
            source = self.padding_rows(traj)
            with self.model.uncounted():
                for _ in range(count):
                    self.score_transition(source, torch.zeros(1, dtype=torch.long, device=source.train.device), 0)

    @torch.no_grad()
    def padding_samples(self, chunks: int, prompts: Sequence[str], metadata: Sequence[dict], sigmas: torch.Tensor,
                        guidance: float | None) -> int:
        """An evaluation's padding: where this process samples fewer of its ``chunks`` than another (an evaluation
        that does not split evenly over the processes), one discarded one-sample ODE sample (the first prompt, zero
        noise) per missing chunk, so that every process makes as many calls of a sharded transformer; not counted in
        NFE. Returns how many it sampled (0 unless sharded)."""
        count = self.lockstep_padding(chunks)
        with self.model.uncounted():
            for _ in range(count):
                cond = self.model.encode(list(prompts[:1]), list(metadata[:1]))
                x1 = torch.zeros(1, *self.model.latent_shape, device=self.model.device, dtype=self.model.latent_dtype)
                sample_ode(self.model, cond, sigmas, x1, guidance)
        return count

    def update_parts(self, traj: Trajectory, minibatch: torch.Tensor, micro_batch: int | None,
                     draw: ForwardDraw | None = None, generators: Sequence[torch.Generator] = ()) -> list[UpdatePart]:
        """The forward-backward parts of an update that scores whole samples (DiffusionNFT, AWM): one
        :class:`UpdatePart` for each micro-batch of this process's rows of ``minibatch``, then, under sharding, as many
        padding parts (a one-row padding trajectory, weight 0) as this process lacks against the one with the most,
        whose calls keep the processes in lockstep and whose loss is multiplied by 0.

        ``draw(generators, like)``: the method's forward-process draws (``algorithms/engine/plans.py``
        ``forward_draws``), made once for the minibatch's rows from ``generators`` (one per row, in order) and cut per
        part; a padding part's row draws from a generator seeded with the algorithm's seed (any draw: weighted 0)."""
        positions = torch.arange(len(minibatch), device=minibatch.device)  # host indices, as the minibatch
        x0 = at_least_float32(traj.final[minibatch])
        draws = draw(list(generators), x0) if draw is not None and len(minibatch) else None
        parts = [UpdatePart(traj, minibatch[part], 1.0, x0[part], _cut(draws, part))
                 for part in positions.split(micro_batch or max(len(minibatch), 1)) if len(part)]
        padding = self.lockstep_padding(len(parts))
        if padding:
            source = self.padding_rows(traj)
            row = torch.zeros(1, dtype=torch.long, device=minibatch.device)
            x0 = at_least_float32(source.final[row])
            draws = draw([torch.Generator().manual_seed(self.seed)], x0) if draw is not None else None
            parts += [UpdatePart(source, row, 0.0, x0, draws)] * padding
        return parts

    def padding_rows(self, traj: Trajectory) -> Trajectory:
        """A one-row trajectory a padding call runs on: ``traj``'s first row, or, when this process holds no row of
        it (a filtering sampler kept only other processes' groups), the first row of this step's first rollout."""
        if len(traj):
            return traj.select([0])
        if self._padding_source is None:
            raise RuntimeError("a padding call on a process that holds no rows, before any rollout")
        return self._padding_source

    def _padding_call(self, traj: Trajectory, fused: list[torch.Tensor], step: int | None = None) -> None:
        """The collectives of one update chunk, with no effect on the update: a row's transition ``step`` scored
        (with the KL reference's call when there is one) and back-propagated with weight 0 (zero gradients). With a
        kept rollout graph at ``step`` (``traj.live``) the row's kept graph is back-propagated, as a real chunk of that
        step is; otherwise the transition is recomputed (a forward with autograd, then its backward)."""
        live = traj.live if step is not None and traj.live and step in traj.live else None
        source = traj if live else self.padding_rows(traj)  # a kept graph implies rows: the rollout's
        rows = torch.zeros(1, dtype=torch.long, device=source.train.device)
        with self.model.uncounted():
            out, kl = self._step_terms(source, rows, 0 if step is None else step, live)
        loss = (out.log_prob.sum() + kl.sum()) * 0.0
        if self.model.fused_update:
            fused.append(loss)
        else:
            loss.backward()

    def padded_chunks(self, traj: Trajectory, minibatch: torch.Tensor) -> list[tuple[torch.Tensor | None, Any]]:
        """The minibatch's chunks (``transition_chunks``) with, under sharding, the padding chunks (rows None) that
        keep the processes in lockstep: first as many recomputed chunks (step None) as this process lacks against the
        one with the most, then, in step order, one chunk for every step with a kept rollout graph (each is
        back-propagated once on every process, whatever rows of the minibatch it holds there)."""
        chunks = list(self.transition_chunks(traj, minibatch))
        if not self.model.sharded:
            return chunks
        live = traj.live or {}
        recomputed = sum(1 for _, t in chunks if not (isinstance(t, int) and t in live))
        padding = [(None, None)] * self.lockstep_padding(recomputed)
        covered = {t for _, t in chunks if isinstance(t, int) and t in live}
        missing = [(None, t) for t in sorted(set(live) - covered)]
        if missing:  # the kept graphs' chunks in step order, as transition_chunks yields them
            chunks = sorted(chunks + missing, key=lambda chunk: chunk[1] if isinstance(chunk[1], int) else -1)
        return padding + chunks

