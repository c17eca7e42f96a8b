"""Data parallelism over processes (``accelerate launch`` / ``torchrun``): the one place that knows about ranks.

An :class:`Algorithm` holds a ``dist`` context. The default, :data:`SINGLE_PROCESS`, is a no-op (every gather returns
the caller's own data), so a plain run needs neither ``torch.distributed`` nor accelerate. Under a launcher,
:func:`from_environment` joins the process group and returns a :class:`TorchDistributed`.

How a step is split (results do not depend on the number of processes, to float rounding):

* **Sharding by sample index.** The global batch of an iteration (``prompts_per_step x G`` samples, laid out in the
  single-process order) is cut into ``world_size`` contiguous, equal slices; rank r rolls out slice r. A group may
  span ranks (as Flow-GRPO's K-repeat sampler). Every rank builds the *global* list of per-sample generators
  (a pure function of seed, iteration, sample index) and takes its slice, so each sample sees the noise it would see
  in a single process. Batch-wide plans (DanceGRPO's random step subsets) are drawn for the global batch and sliced.
* **Rewards are gathered** (:meth:`gather_batch`: rewards, reward components, group ids, off-policy flags) before the
  group-relative advantages, which every rank computes on the global batch and then slices.
* **Gradients** are summed over ranks once per optimizer step (:meth:`all_reduce_gradients`); each rank's loss is
  normalised by the *global* number of trained (sample, step) pairs, so the sum is the single-process gradient.
  Clipping and the optimizer step then run identically everywhere. The minibatch permutation is drawn over global
  sample indices from the same generator on every rank; each rank trains the members it holds.
* **Statistics** are summed over ranks (:meth:`sum`), so StepStats describe the global batch.

Small values travel with ``all_gather_object`` (exact, and summed in rank order so every rank gets the same bits);
gradients with one ``all_reduce`` per (device, dtype) bucket.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

from flowzoo.errors import FlowZooError


class PeerFailure(FlowZooError):
    """A collective failed because another process of the run stopped (its own error names the cause)."""


@dataclass
class GatheredBatch:
    """What advantages and statistics need, for the *global* batch; ``local`` selects this rank's samples."""

    rewards: torch.Tensor
    reward_components: dict[str, torch.Tensor]
    group: torch.Tensor
    off_policy: torch.Tensor
    local: slice


class SingleProcess:
    """One process: the identity for every collective."""

    rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- primitives (overridden by TorchDistributed) --------------------------------------------------------
    def all_gather_object(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order."""
        return [obj]

    def all_reduce_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the ``.grad`` of ``params`` over ranks (a parameter without a gradient on every rank keeps None)."""

    def broadcast_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """Copy rank 0's values of ``params`` to every rank."""

    def barrier(self) -> None:
        """Wait for every rank (one process: nothing to wait for)."""

    def shutdown(self, clean: bool) -> None:
        """Leave the process group (one process: nothing to leave). See :func:`process_group`."""

    def describe(self) -> str:
        """``"rank r of n"`` under several processes, else ``""`` (for messages)."""
        return f"rank {self.rank} of {self.world_size}" if self.world_size > 1 else ""

    # ---- built on the primitives ----------------------------------------------------------------------------
    def shard(self, count: int, even: bool = True) -> range:
        """This rank's contiguous slice of ``count`` items (``even``: ``count`` must divide by world_size)."""
        if even and count % self.world_size:
            raise ValueError(f"a batch of {count} samples does not split evenly over {self.world_size} processes")
        return range(count * self.rank // self.world_size, count * (self.rank + 1) // self.world_size)

    def shard_parts(self, sizes: Sequence[int]) -> list[range]:
        """For a global batch laid out as consecutive parts of ``sizes``, this rank's sub-range of each part."""
        mine = self.shard(sum(sizes))
        spans, start = [], 0
        for size in sizes:
            lo, hi = max(mine.start, start), min(mine.stop, start + size)
            spans.append(range(lo - start, max(lo, hi) - start))
            start += size
        return spans

    def sum(self, value: Any) -> Any:
        """The sum over ranks of a number, tensor or dict of numbers (added in rank order: same bits everywhere). The
        values travel through the host (``all_gather_object``); a tensor's sum is returned on the tensor's device."""
        if self.world_size == 1:
            return value
        values = self.all_gather_object(_to_cpu(value))
        if isinstance(value, dict):
            return {k: _to_device(_sum([v[k] for v in values]), value[k]) for k in value}
        return _to_device(_sum(values), value)

    def cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """The concatenation (dim 0, rank order) of every rank's ``tensor``; lengths may differ."""
        if self.world_size == 1:
            return tensor
        parts = self.all_gather_object(tensor.detach().cpu())
        return torch.cat([p for p in parts if len(p)] or parts[:1]).to(tensor.device)  # a rank may hold none

    def local_span(self, local_count: int) -> tuple[int, int]:
        """(offset of this rank's first sample in the global batch, global batch size)."""
        if self.world_size == 1:
            return 0, local_count
        counts = self.all_gather_object(local_count)
        return sum(counts[: self.rank]), sum(counts)

    def gather_batch(self, traj: Any) -> GatheredBatch:
        """Rewards, reward components, groups and off-policy flags of the global batch (``traj`` is scored)."""
        if self.world_size == 1:
            return GatheredBatch(traj.rewards, traj.reward_components, traj.group, traj.off_policy, slice(None))
        local = {"rewards": traj.rewards, "group": traj.group, "off_policy": traj.off_policy,
                 **{f"component/{k}": v for k, v in traj.reward_components.items()}}
        parts = self.all_gather_object({k: v.detach().cpu() for k, v in local.items()})
        merged = {k: torch.cat([p[k] for p in parts]).to(local[k].device) for k in local}
        offset = sum(len(p["rewards"]) for p in parts[: self.rank])
        components = {k.split("/", 1)[1]: v for k, v in merged.items() if k.startswith("component/")}
        return GatheredBatch(merged["rewards"], components, merged["group"], merged["off_policy"],
                             slice(offset, offset + len(traj.rewards)))


class TorchDistributed(SingleProcess):
    """A process of a ``torch.distributed`` group (gloo for CPU tensors, NCCL for CUDA ones)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        with self._collective("all_gather_object"):
            self._dist.all_gather_object(out, obj)
        return out

    @contextlib.contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        """A collective whose peer died ends in one line, not a backend traceback (the peer names the cause)."""
        try:
            yield
        except RuntimeError as error:  # DistBackendError and gloo's "Connection closed by peer" are RuntimeErrors
            detail = (str(error).splitlines() or [""])[0][:160]
            raise PeerFailure(f"{self.describe()}: {what} failed because another process stopped "
                              f"({type(error).__name__}: {detail})") from None

    def all_reduce_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        params = list(params)
        if not params:
            return
        has_grad = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
        with self._collective("all_reduce"):
            self._dist.all_reduce(has_grad)
        buckets: dict[tuple, list[torch.nn.Parameter]] = {}
        for p, has in zip(params, has_grad.tolist()):
            if has:
                buckets.setdefault((p.device, p.dtype), []).append(p)
        for bucket in buckets.values():
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
            with self._collective("all_reduce"):
                self._dist.all_reduce(flat)
            for p, chunk in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad = chunk.view_as(p).clone()

    def broadcast_parameters(self, params: Iterable[torch.Tensor]) -> None:
        with torch.no_grad(), self._collective("broadcast"):
            for p in params:
                self._dist.broadcast(p.data, src=0)

    def barrier(self) -> None:
        with self._collective("barrier"):
            self._dist.barrier()

    def shutdown(self, clean: bool) -> None:
        """Leave the group. ``clean``: every rank got here; wait for all of them, then destroy the group, so no rank
        tears its gloo threads down while a peer still talks to it. Not clean (this rank failed): nothing here;
        the caller ends the process at once (``os._exit``), because a collective or a teardown could wait for, or
        trip over, peers that are gone."""
        if clean and self._dist.is_initialized():
            self.barrier()
            self._dist.destroy_process_group()


#: the default context of an Algorithm and a Runner
SINGLE_PROCESS = SingleProcess()


def from_environment() -> SingleProcess:
    """The context of this process: a TorchDistributed when launched with ``WORLD_SIZE`` > 1 (accelerate launch,
    torchrun) or when a process group already exists, else :data:`SINGLE_PROCESS`. Joins the group if needed
    (gloo, plus NCCL for CUDA tensors when a GPU is present) and pins each process to GPU ``LOCAL_RANK``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return TorchDistributed()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return SINGLE_PROCESS
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")
    return TorchDistributed()


@contextlib.contextmanager
def process_group() -> Iterator[SingleProcess]:
    """The data-parallel context of a command, shut down cleanly whatever happens.

    Success: every rank meets at a barrier, then the process group is destroyed while the interpreter is still fully
    alive. Left to the interpreter's exit, gloo's worker threads can still hold finished work objects whose tensors
    are released during finalization, which aborts the process ("terminate called without an active exception",
    SIGABRT; pytorch/pytorch issue 190489 and PR 179291 describe the same crash). Destroying the group makes that
    rare, not impossible (1 in 24 runs of the 2-process tests still aborted), so ``flowzoo train`` then ends a
    multi-process rank with ``os._exit(0)`` once everything is written, skipping the interpreter's teardown. Failure on one rank: the exception propagates at once (no
    waiting for peers); the command prints one line naming the rank and the cause and ends the process with
    ``os._exit``. A launcher's SIGTERM to the surviving ranks ends them with one line instead of a traceback.
    """
    dist = from_environment()
    if dist.world_size == 1:
        yield dist
        return
    previous = signal.getsignal(signal.SIGTERM)

    def stopped(signum: int, frame: Any) -> None:
        print(f"flowzoo: {dist.describe()} stopped by the launcher (another process failed; its message names the "
              "cause)", file=sys.stderr, flush=True)
        os._exit(128 + signum)  # no teardown of a group whose peer is gone: that is what could abort

    signal.signal(signal.SIGTERM, stopped)
    try:
        yield dist
        dist.shutdown(clean=True)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _to_device(total: Any, like: Any) -> Any:
    """``total`` (a sum gathered through the host) on ``like``'s device when both are tensors."""
    if isinstance(total, torch.Tensor) and isinstance(like, torch.Tensor):
        return total.to(like.device)
    return total


def _sum(values: list[Any]) -> Any:
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total
