"""Bytes of activations autograd keeps for the backward, counted as they are saved: a device-independent measure of
what a training variant holds (the kept rollout graphs of a recompute-free update, or one recomputed timestep), where
a CPU process's peak RSS cannot separate two variants run in one process."""

from __future__ import annotations

import torch


class SavedActivations:
    """Context manager counting the bytes of distinct storages autograd saves, frozen module weights left out.

    ``mark()`` starts a new unit of work (e.g. one timestep's forward and backward, after which its saves are freed):
    the running count restarts; ``peak`` is the largest count seen. Without marks every save counts until the end
    (graphs kept alive together)."""

    def __init__(self, module: torch.nn.Module | None = None):
        self._weights = {p.untyped_storage().data_ptr() for p in module.parameters()} if module is not None else set()
        self._seen: set[int] = set()
        self.current = 0
        self.peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._weights and key not in self._seen:
            self._seen.add(key)
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        return tensor

    def mark(self) -> None:
        self._seen.clear()
        self.current = 0

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
