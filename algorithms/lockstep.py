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
from typing import Any, Iterator

import torch

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
