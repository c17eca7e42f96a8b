"""FSDP2 sharding of a model's transformer(s) over the processes of a run, and the conversions between sharded and
full tensors that checkpoints, the EMA and the optimizer state need.

``shard_model(model, reshard_after_forward)`` applies ``torch.distributed.fsdp.fully_shard`` (FSDP2; torch docs
"torch.distributed.fsdp.fully_shard") bottom-up, as its documentation asks: once to every block of each module list
the adapter names in ``shard_blocks`` (one all-gather / reduce-scatter group per block), then to the transformer itself
(what is left: embeddings, final norm and projection). Every parameter of the transformer becomes a ``DTensor``
sharded on dim 0 over a 1-D device mesh of all processes, so each process holds ~1/N of the weights; the optimizer,
built on these parameters afterwards, keeps its state (Adam's two moments) as DTensors of the same sharding, ~1/N
per process too. Forward and backward all-gather one block at a time and free it after (``reshard_after_forward``);
gradients are reduce-scattered with a **sum** (``set_gradient_divide_factor(1.0)`` with sum-only collectives), because
each process's loss is already normalised by the global batch (``algorithms/engine/distributed.py``): the sum over processes
is the single-process gradient, as the replicated all-reduce makes it.

Checkpoints stay **full** state dicts (``gathered``: each DTensor's ``full_tensor()``), so a checkpoint is the same
file whatever the number of processes that wrote it, and resumes on any number (``like``: a full tensor cut to this
process's shard with ``distribute_tensor(..., src_data_rank=None)``, which takes the local chunk without any
communication since every process read the same checkpoint).

Every FSDP call is a collective: every process must run its sharded transformer the same number of times, of the
same kind, in the same order, whatever rows it holds. Rollouts do (every process rolls out an equal slice with the
same step plan); where the rows differ (OP-GRPO's replayed rows, dropped zero-advantage rows, a filtering sampler's
kept groups, the evaluation's last chunk) a process that holds fewer pads with calls of the same kind whose result is
discarded (``algorithms/engine/lockstep.py``: ``LockstepPadding``, and the check ``FLOWZOO_CHECK_LOCKSTEP=1``).
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import torch

from flowzoo.errors import ConfigError

#: the model arg that asks for sharding (``model.args.fsdp: true``); the experiment takes it out before the model's
#: constructor sees it: sharding is how a run executes (a run's identity leaves it out), not part of the model
SHARD_ARG = "fsdp"


def is_sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a collective for a DTensor: every process must call it), else ``t`` itself."""
    return t.full_tensor() if is_sharded(t) else t


def gathered(value: Any) -> Any:
    """``value`` (nested dicts, lists, tuples) with every DTensor replaced by its full tensor, in a deterministic
    order (every process walks the same structure, so the all-gathers pair up)."""
    if isinstance(value, torch.Tensor):
        return full_tensor(value)
    if isinstance(value, dict):
        return {k: gathered(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(gathered(v) for v in value)
    return value


def like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The full tensor ``value`` on ``param``'s device and dtype, cut to this process's shard when ``param`` is a
    sharded DTensor of the same global shape (no communication: every process holds ``value``)."""
    if is_sharded(param) and tuple(value.shape) == tuple(param.shape):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(value.to(device=param.device, dtype=param.dtype), param.device_mesh,
                                 param.placements, src_data_rank=None)
    return value.to(device=param.device, dtype=param.dtype)


def local_numel(tensors: Iterable[torch.Tensor]) -> int:
    """Elements this process holds of ``tensors`` (a DTensor's local shard, a plain tensor whole)."""
    return sum((t.to_local() if is_sharded(t) else t).numel() for t in tensors)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's per-parameter state tensors (Adam's moments; its scalar step counters left out)."""
    return [v for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0]


def shard_request(model_args: dict) -> bool:
    """Whether a run asks for sharding: ``model.args.fsdp: true``, or ``accelerate launch`` with
    ``distributed_type: FSDP`` (its environment: ``ACCELERATE_USE_FSDP=true``)."""
    return bool(model_args.get(SHARD_ARG)) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def check_request(model_cls: type, model_args: dict) -> None:
    """A one-line ConfigError for a sharding request this model cannot honour (checked before any weight loads)."""
    value = model_args.get(SHARD_ARG)
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"model.args.{SHARD_ARG} must be true or false, got {value!r}")
    if not shard_request(model_args):
        return
    if not getattr(model_cls, "shardable", False):
        from flowzoo import models

        valid = [n for n in models.names() if getattr(models.get(n), "shardable", False)]
        source = (f"model.args.{SHARD_ARG}: true" if model_args.get(SHARD_ARG)
                  else "the accelerate config's distributed_type: FSDP")
        raise ConfigError(f"{source} asks for FSDP sharding, but model {model_cls.name!r} has no transformer blocks "
                          f"to shard; shardable models: {', '.join(valid)}")
    if not sum_reduction_available():
        raise ConfigError(f"FSDP sharding needs torch >= 2.8 (FSDPModule.set_force_sum_reduction_for_comms, which makes "
                          f"the gradient reduce-scatter a plain sum); this is torch {torch.__version__}")
    version = os.environ.get("FSDP_VERSION")
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and version not in (None, "2"):
        raise ConfigError(f"the accelerate config asks for fsdp_version {version}; the runner shards with FSDP2: "
                          f"set fsdp_version: 2")


def sum_reduction_available() -> bool:
    """Whether this torch's FSDP2 can reduce gradients with a plain sum (``set_force_sum_reduction_for_comms``,
    pytorch/pytorch PR 155915, first released in torch 2.8): the runner's sharding needs it, since each process's loss
    is already normalised by the global batch and gloo has no pre-multiplied sum."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6: no public FSDP2
        return False
    return hasattr(FSDPModule, "set_force_sum_reduction_for_comms")


def reshard_after_forward() -> bool:
    """accelerate's ``fsdp_reshard_after_forward`` (FSDP2: true/false; default true: free each block after use)."""
    value = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower()
    if value not in ("true", "false"):
        raise ConfigError(f"fsdp_reshard_after_forward must be true or false for FSDP2, got {value!r}")
    return value == "true"


def block_lists(transformer: torch.nn.Module, names: tuple[str, ...] | None) -> dict[str, torch.nn.ModuleList]:
    """The transformer's block lists: ``names`` (an adapter's ``shard_blocks``), or, when None, every
    ``ModuleList`` attribute of the transformer whose name ends in ``blocks`` (FLUX's ``transformer_blocks`` and
    ``single_transformer_blocks``, Qwen-Image's ``transformer_blocks``)."""
    if names is None:
        names = tuple(n for n, m in transformer.named_children()
                      if isinstance(m, torch.nn.ModuleList) and n.endswith("blocks"))
    found = {}
    for name in names:
        blocks = getattr(transformer, name, None)
        if not isinstance(blocks, torch.nn.ModuleList) or not len(blocks):
            raise ConfigError(f"{type(transformer).__name__} has no block list {name!r} to shard")
        found[name] = blocks
    if not found:
        raise ConfigError(f"{type(transformer).__name__} has no block list to shard")
    return found


def fully_shard_transformer(transformer: torch.nn.Module, names: tuple[str, ...] | None, mesh,
                            reshard: bool = True) -> list[str]:
    """``fully_shard`` every block of ``names`` then the transformer (bottom-up); gradients reduce with a sum.
    Returns the block lists sharded."""
    from torch.distributed.fsdp import fully_shard

    lists = block_lists(transformer, names)
    for blocks in lists.values():
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(transformer, mesh=mesh, reshard_after_forward=reshard)
    for module in transformer.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            # a sum, not FSDP's default mean: the loss is normalised by the global batch already; sum-only collectives
            # because a factor of 1 would otherwise ask for a pre-multiplied sum, which gloo lacks
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return list(lists)


def shard_model(model, world_size: int, reshard: bool = True) -> dict[str, Any]:
    """Shard ``model``'s transformer(s) (``model.fsdp_modules()``) over the ``world_size`` processes of the process
    group; returns what was sharded (block lists, parameter counts)."""
    if world_size < 2:
        raise ConfigError(f"FSDP sharding needs several processes (accelerate launch / torchrun with "
                          f"--num_processes >= 2), got {world_size}; drop model.args.{SHARD_ARG} for a 1-process run")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(model.device.type, (world_size,))
    modules = model.fsdp_modules()
    blocks = []
    for module in modules:
        blocks = fully_shard_transformer(module, model.shard_blocks, mesh, reshard)
    model.sharded = True
    return {"world_size": world_size, "block_lists": blocks, "modules": len(modules),
            "parameters": sum(p.numel() for m in modules for p in m.parameters())}
