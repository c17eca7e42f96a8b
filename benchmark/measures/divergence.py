"""Stop a run cleanly when training diverges, and say what diverged.

After every training step the runner asks :meth:`DivergenceGuard.check` whether the step's loss, its gradient norm
and the trainable parameters are finite; the first that is not stops the run with one line (a
:class:`DivergenceError`, exit 2 from the CLI) naming the step, the quantity, the algorithm's step-size settings and
the last checkpoint written before it. The failing step writes nothing: metrics.csv ends at the step before and the
checkpoint keeps the last good state.

A policy can also diverge into finite but huge parameters whose samples overflow: the reward is then handed NaN or
inf samples and refuses them (:class:`rewards.errors.NonFiniteSamplesError`); :meth:`DivergenceGuard.during` turns
that into the same one-line divergence error, so the reward is never blamed for the policy's samples.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterable, Iterator

import torch

from flowzoo.algorithms.engine.base import AlgorithmConfig, StepStats
from flowzoo.errors import RunError
from flowzoo.rewards.errors import NonFiniteSamplesError

#: the algorithm settings a divergence message shows (those that set the size of an update)
SETTINGS = ("lr", "max_grad_norm", "clip_range", "adv_clip", "kl_beta")


class DivergenceError(RunError):
    """Training produced a non-finite quantity; the message names the step, the quantity and the last checkpoint."""


def nonfinite_parameters(parameters: Iterable[torch.Tensor]) -> int:
    """How many of ``parameters`` hold a NaN or inf (one synchronisation per device, not one per tensor). A sharded
    (FSDP) parameter is checked shard by shard, and every process gets the same count: an all-reduce of the flags."""
    from flowzoo.models.sharding import is_sharded

    flags: dict[torch.device, list[torch.Tensor]] = {}
    sharded = False
    for p in parameters:
        local = p.detach()
        if is_sharded(local):
            local, sharded = local.to_local(), True
        flags.setdefault(local.device, []).append(~torch.isfinite(local).all())
    if not sharded:
        return sum(int(torch.stack(device_flags).sum()) for device_flags in flags.values())
    import torch.distributed as dist

    (device, device_flags), = flags.items()  # a sharded model lives on one device
    counts = torch.stack(device_flags).to(torch.int64)
    dist.all_reduce(counts)  # per tensor: the processes whose shard of it is not finite
    return int((counts > 0).sum())


class DivergenceGuard:
    """Checks each training step of one run; ``last_good``: the step of the last checkpoint written (None: none)."""

    def __init__(self, config: AlgorithmConfig, last_good: int | None = None):
        self.config = config
        self.last_good = last_good

    def fail(self, step: int, what: str) -> DivergenceError:
        settings = ", ".join(f"{name}={getattr(self.config, name)}" for name in SETTINGS if hasattr(self.config, name))
        last = ("no checkpoint was written before it" if self.last_good is None
                else f"the last good checkpoint is step {self.last_good}")
        return DivergenceError(f"training diverged at step {step}: {what} ({settings}); {last}")

    @contextlib.contextmanager
    def during(self, step: int) -> Iterator[None]:
        """Around a training step or its evaluation: non-finite samples are the policy's divergence."""
        try:
            yield
        except NonFiniteSamplesError as error:
            raise self.fail(step, f"the decoded samples are not finite ({error.bad} of {error.total}), so the "
                                  f"reward {error.reward!r} could not score them") from None

    def check(self, step: int, stats: StepStats, parameters: Iterable[torch.Tensor]) -> None:
        """Raise :class:`DivergenceError` if the step's loss, gradient norm or the parameters are not finite."""
        for name, value in (("the loss", stats.loss), ("the gradient norm", stats.grad_norm)):
            if not math.isfinite(value):
                raise self.fail(step, f"{name} is not finite ({value})")
        bad = nonfinite_parameters(parameters)
        if bad:
            raise self.fail(step, f"the trainable parameters are not finite ({bad} tensors hold NaN or inf)")

    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` was written (after its check passed)."""
        self.last_good = step
