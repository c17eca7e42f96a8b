"""The Reward interface: score a batch of samples with their prompts and metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import torch

from flowzoo.rewards.errors import NonFiniteSamplesError


@dataclass
class RewardOutput:
    """Per-sample scores [B] (float32, higher is better) and named sub-scores, each [B]; through
    :meth:`Reward.__call__` both are on the samples' device (a reward may compute anywhere)."""

    score: torch.Tensor
    components: dict[str, torch.Tensor] = field(default_factory=dict)


class Reward:
    """A reward model. Subclasses set ``name`` and implement ``score``.

    ``samples`` are what ``FlowModel.decode`` returns: points [B, D], images [B, C, H, W] or videos
    [B, F, C, H, W] in [0, 1]. A reward that cannot score raises (naming itself and the cause); it never
    silently returns zeros.
    """

    name: ClassVar[str] = "base"
    #: sample kinds this reward accepts ("points", "image", "video")
    accepts: ClassVar[tuple[str, ...]] = ("image",)
    #: the closed range [low, high] every score lies in, where the reward guarantees one (None: unbounded or not
    #: guaranteed); read by config checks (a success threshold outside it is refused), never to clip scores
    bounds: ClassVar[tuple[float, float] | None] = None

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        raise NotImplementedError

    def __call__(
        self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict] | None = None
    ) -> RewardOutput:
        if metadata is None:
            metadata = [{} for _ in prompts]
        if len(prompts) != samples.shape[0] or len(metadata) != samples.shape[0]:
            raise ValueError(
                f"reward {self.name!r}: got {samples.shape[0]} samples, {len(prompts)} prompts, "
                f"{len(metadata)} metadata entries"
            )
        if samples.is_floating_point() and not torch.isfinite(samples).all():
            bad = int((~torch.isfinite(samples.reshape(samples.shape[0], -1))).any(dim=1).sum())
            raise NonFiniteSamplesError(self.name, bad, samples.shape[0])
        out = self.score(samples, prompts, metadata)
        # where the samples are (the model's device in training): the scores meet the log-probs there
        out.score = out.score.detach().to(device=samples.device, dtype=torch.float32)
        out.components = {name: torch.as_tensor(value, device=samples.device).detach()
                          for name, value in out.components.items()}
        if out.score.shape != (samples.shape[0],):
            raise ValueError(f"reward {self.name!r} returned scores of shape {tuple(out.score.shape)}")
        if not torch.isfinite(out.score).all():
            raise ValueError(f"reward {self.name!r} returned non-finite scores: {out.score.tolist()}")
        return out
