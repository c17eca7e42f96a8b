"""An exact Gaussian-mixture flow on the toy tier's plane: the example of docs/adding-a-model.md.

Class c's data is a mixture of two Gaussians (toy2d's 8-mode tier: modes 2c and 2c + 1 on the circle of radius 2,
weights ``majority`` and 1 - ``majority``, std ``std``). Under the interpolation x = (1 - s) x0 + s eps the velocity
E[eps - x0 | x] of such a mixture has a closed form, so the model needs no network and no pretraining: its trainable
parameters are the mixture's per-class log-weights and means, which RL moves. It reads the toy tier's prompts
("class 0" .. "class 3") and makes points, which the toy rewards score. Save this file as ``models/gmm2d.py`` to add
it to the zoo.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.ranges import Range
from flowzoo.models import register
from flowzoo.models.base import Condition, FlowModel

CLASSES, MODES, RADIUS = 4, 2, 2.0


@register("gmm2d")
class GaussianMixtureFlow(FlowModel):
    """Exact flow of a per-class 2-D Gaussian mixture (toy2d's data); RL trains its weights and means."""

    sample_kind = "points"  # what decode returns; the config check matches it against the reward's `accepts`
    default_num_steps = 10
    default_eval_num_steps = 20
    default_eval_batch = 8192  # 2-D points: one evaluation chunk
    preferred_threads = 1  # tiny tensors: intra-op threads only add overhead
    fused_update = True  # one call for every trained step of a minibatch (predict takes one sigma per row)
    argument_ranges = {"std": Range(0.01, 1.0), "majority": Range(0.5, 1.0, high_open=True)}

    def __init__(self, std: float = 0.25, majority: float = 0.8):
        super().__init__()
        self.std = float(std)
        angles = 2 * math.pi * torch.arange(CLASSES * MODES) / (CLASSES * MODES)
        means = RADIUS * torch.stack([angles.cos(), angles.sin()], dim=1).view(CLASSES, MODES, 2)
        logits = torch.tensor([math.log(majority), math.log(1 - majority)]).repeat(CLASSES, 1)
        self.params = {"logits": torch.nn.Parameter(logits), "means": torch.nn.Parameter(means)}
        self.frozen = {k: v.detach().clone() for k, v in self.params.items()}  # the reference policy
        self._active = self.params

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return (2,)

    def encode(self, prompts: Sequence[str], metadata: Sequence[dict] | None = None) -> Condition:
        ids = []
        for prompt in prompts:
            word, _, index = prompt.partition(" ")
            if word != "class" or not index.isdigit() or int(index) >= CLASSES:
                raise ConfigError(f"gmm2d: unknown prompt {prompt!r}; valid: 'class 0' .. 'class {CLASSES - 1}'")
            ids.append(int(index))
        return Condition({"class": torch.tensor(ids, device=self.device)})

    def null_condition(self, n: int) -> Condition:
        return Condition({"class": torch.full((n,), CLASSES, device=self.device)})  # CFG's unconditional branch

    def predict(self, x: torch.Tensor, sigma: torch.Tensor, cond: Condition) -> torch.Tensor:
        """E[eps - x0 | x] = sum_k r_k(x) (((s - (1 - s) std^2) / V) (x - (1 - s) mu_k) - mu_k), V = (1 - s)^2 std^2
        + s^2, r_k the posterior of component k (the null class: the mixture of every class)."""
        log_w = torch.log_softmax(self._active["logits"], dim=-1)  # [C, M]
        classes = cond.tensors["class"]
        own = (classes[:, None] == torch.arange(CLASSES, device=x.device))[..., None]  # [B, C, 1]
        log_pi = torch.where(own, log_w, -math.inf)
        log_pi = torch.where(classes[:, None, None] == CLASSES, log_w - math.log(CLASSES), log_pi).flatten(1)
        mu = self._active["means"].reshape(-1, 2)  # [C M, 2]
        s = sigma.to(x.dtype)[:, None, None]
        var = (1 - s) ** 2 * self.std ** 2 + s ** 2
        centred = x[:, None, :] - (1 - s) * mu  # [B, C M, 2]
        r = torch.softmax(log_pi - (centred ** 2).sum(-1) / (2 * var[..., 0]), dim=-1)
        v = (s - (1 - s) * self.std ** 2) / var * centred - mu
        return (r[..., None] * v).sum(dim=1)

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        return x0.float()  # the points themselves

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.params.values())

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        self._active = self.frozen
        try:
            yield
        finally:
            self._active = self.params

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.params.items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for k, v in self.params.items():
                v.copy_(state[k])
