"""Counting what an iteration would read back from (and copy to) an accelerator, on a machine without one.

The model runs on PyTorch's ``meta`` device: tensors with shapes and no values, while the host-side bookkeeping
(plans, group ids, generators, the replay buffer) stays on the CPU as it does beside a GPU. A dispatch mode then sees
every operation that would move data between the two:

* a **device read** (a host sync on a GPU): ``item()``/``float()``/``bool()``/``int()`` of a device tensor
  (``aten._local_scalar_dense``), ``nonzero`` (boolean-mask indexing; its output size depends on the values) and a
  copy from the device to the host (``.cpu()``, ``.tolist()``);
* a **host-to-device copy** (``_to_copy`` from the CPU onto the device): from pageable memory each one also waits.

A meta tensor has no values, so a read is answered with a placeholder (``True``, ``1``, ones; ``nonzero``: every
position, so a mask keeps every row): the count is what matters, not where the placeholder values lead.
"""

from __future__ import annotations

import collections
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _on_meta(args) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.device.type == "meta"]


class DeviceReads(TorchDispatchMode):
    """``reads``: device-to-host reads by kind; ``copies``: host-to-device copies; ``where``: the two innermost zoo
    frames of each read (a failing test prints them)."""

    def __init__(self):
        super().__init__()
        self.reads: collections.Counter = collections.Counter()
        self.copies = 0
        self.where: collections.Counter = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.reads.values())

    def _note(self, kind: str) -> None:
        self.reads[kind] += 1
        frames = [f for f in traceback.extract_stack() if "/site-packages/" not in f.filename
                  and not f.filename.endswith(("device_reads.py",))]
        self.where[" <- ".join(f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                               for f in reversed(frames[-2:]))] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        metas = _on_meta(args)
        if func is aten._local_scalar_dense.default and metas:
            self._note("scalar")
            tensor = metas[0]
            return True if tensor.dtype == torch.bool else (1.0 if tensor.is_floating_point() else 1)
        if func is aten.nonzero.default and metas:
            self._note("nonzero")
            return torch.nonzero(torch.ones(metas[0].shape, dtype=torch.bool)).to("meta")  # every position
        if func is aten._to_copy.default and isinstance(args[0], torch.Tensor) and kwargs.get("device") is not None:
            source, target = args[0].device.type, torch.device(kwargs["device"]).type
            if source == "meta" and target == "cpu":
                self._note("to_host")
                return torch.ones(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
            if source == "cpu" and target == "meta":
                self.copies += 1
        return func(*args, **kwargs)
