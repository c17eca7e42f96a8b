"""What a bit-identical resume needs of an algorithm: the checkpoint state of ``Algorithm`` (its base class
:class:`CheckpointState`): the iteration, the trainable weights, the optimizer's moments, the update order's generator,
the prompt sampler's and the weight average's state and the method's ``extra_state``. A sharded model's state is
gathered whole, so that a checkpoint resumes on any number of processes."""

from __future__ import annotations

from typing import Any

import torch

from flowzoo.errors import FlowZooError
from flowzoo.models.sharding import gathered, like


class CheckpointState:
    """The checkpoint state of ``Algorithm`` (its base class). Uses the algorithm's ``iteration``, ``model``,
    ``optimizer``, ``update_generator``, ``prompt_sampler``, ``ema``, ``extra_state`` and ``load_extra_state``."""

    def state_dict(self) -> dict[str, Any]:
        state = {
            "iteration": self.iteration,
            "model": self.model.trainable_state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "update_generator": self.update_generator.get_state(),
            "extra": self.extra_state(),
        }
        sampler_state = self.prompt_sampler.state_dict() if self.prompt_sampler is not None else {}
        if sampler_state:  # only then: a run with a stateless sampler keeps the checkpoint it always had
            state["prompt_sampler"] = sampler_state
        if self.ema is not None:  # only then: a checkpoint without EMA is the one it always was
            state["ema"] = self.ema.state_dict()
        # a sharded model's weights, moments and copies gathered whole (a collective: every process calls
        # state_dict), so the checkpoint is the one a single process writes and resumes on any number of processes
        return gathered(state) if self.model.sharded else state

    def _optimizer_state_for_shards(self, saved: dict[str, Any]) -> dict[str, Any]:
        """A full optimizer state dict with each tensor of a sharded parameter's state cut to this process's shard
        (the checkpoint holds full tensors, ``state_dict``)."""
        if not self.model.sharded:
            return saved
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        state = {index: {k: like(v, params[index]) if isinstance(v, torch.Tensor) and v.dim() > 0 else v
                         for k, v in per_param.items()} if 0 <= index < len(params) else per_param
                 for index, per_param in saved.get("state", {}).items()}
        return {**saved, "state": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iteration = state["iteration"]
        self.model.load_trainable_state_dict(state["model"])
        self.optimizer.load_state_dict(self._optimizer_state_for_shards(state["optimizer"]))
        self.update_generator.set_state(state["update_generator"])
        self.load_extra_state(state["extra"])
        if self.prompt_sampler is not None and "prompt_sampler" in state:
            self.prompt_sampler.load_state_dict(state["prompt_sampler"])
        if self.ema is not None:
            if "ema" not in state:
                raise FlowZooError("the checkpoint holds no EMA weights, but algorithm.ema is on")
            self.ema.load_state_dict(state["ema"])

