"""An exponential moving average of the trainable weights, for evaluation and export (``AlgorithmConfig.ema``).

Released Flow-GRPO keeps one (scripts/train_sd3.py:445 at ac4c86e: ``EMAModuleWrapper(trainable, decay=0.9,
update_step_interval=8)``, flow_grpo/ema.py) and evaluates and saves with it (train_sd3.py:217-219, 315-316,
323-332: the EMA weights are copied in, used, and the trained ones put back); training rollouts always sample the
trained weights. After optimizer step ``s`` (counted from 1, the release's ``global_step`` after its increment) the
average moves when ``(s + 1) % every == 0``:

    ema += (1 - d_s) (theta - ema),   d_s = min((1 + s) / (10 + s), decay)        (flow_grpo/ema.py:33-49)

so with every = 8 it first moves after the 7th optimizer step, with d = 8/17. Ours: one call per optimizer step; the
release calls its ``ema.step`` after every micro-batch (train_sd3.py:954-955), so where an update falls due it may be
applied once per micro-batch of that optimizer step (twice with its SD3 recipes' two micro-batches).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch

from flowzoo.models.sharding import full_tensor, like


class WeightEMA:
    """The moving average of ``parameters`` (the trainable tensors, updated in place by the optimizer)."""

    def __init__(self, parameters: Sequence[torch.nn.Parameter], decay: float, every: int):
        self.parameters = list(parameters)
        self.shadow = [p.detach().clone() for p in self.parameters]
        self.decay, self.every = decay, every
        self.steps = 0  # optimizer steps seen

    def current_decay(self, step: int) -> float:
        """d_s: the warm-up ``(1 + s) / (10 + s)`` capped at ``decay``."""
        return min((1 + step) / (10 + step), self.decay)

    @torch.no_grad()
    def update(self) -> None:
        """Called after every optimizer step."""
        self.steps += 1
        if (self.steps + 1) % self.every:
            return
        one_minus_decay = 1 - self.current_decay(self.steps)
        for average, parameter in zip(self.shadow, self.parameters, strict=True):
            average.add_(one_minus_decay * (parameter.detach().to(average.dtype) - average))

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Within this context the parameters hold the average; the trained values are restored after."""
        trained = [p.detach().clone() for p in self.parameters]
        try:
            with torch.no_grad():
                for parameter, average in zip(self.parameters, self.shadow, strict=True):
                    parameter.copy_(average)
            yield
        finally:
            with torch.no_grad():
                for parameter, value in zip(self.parameters, trained, strict=True):
                    parameter.copy_(value)

    def state_dict(self) -> dict[str, Any]:
        # whole tensors (gathered from every process when the model is sharded: a collective)
        return {"steps": self.steps, "shadow": [full_tensor(t.detach()).cpu().clone() for t in self.shadow]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        shadow = state["shadow"]
        if len(shadow) != len(self.shadow) or any(a.shape != b.shape for a, b in zip(shadow, self.shadow)):
            raise ValueError("the checkpoint's EMA weights do not match the model's trainable parameters")
        self.steps = int(state["steps"])
        self.shadow = [like(t, p).clone() for t, p in zip(shadow, self.shadow)]  # this process's shard if sharded


def load_average(model, algorithm_state: dict[str, Any]) -> bool:
    """Put the EMA weights of a checkpoint's algorithm state (``Algorithm.state_dict()``) into ``model``'s trainable
    parameters, after its trained weights were loaded; returns whether the state had an average (``flowzoo export``
    writes the weights the run evaluates with)."""
    ema = algorithm_state.get("ema")
    if ema is None:
        return False
    parameters = list(model.trainable_parameters())
    if len(ema["shadow"]) != len(parameters):
        raise ValueError("the checkpoint's EMA weights do not match the model's trainable parameters")
    with torch.no_grad():
        for parameter, average in zip(parameters, ema["shadow"], strict=True):
            parameter.copy_(average.to(device=parameter.device, dtype=parameter.dtype))
    return True
