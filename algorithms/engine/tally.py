"""The PPO update's bookkeeping (:class:`UpdateTally`: its sums, kept on the device until the update ends) and the
one host-to-device copy of a minibatch's row indices (:func:`rows_on_device`)."""

from __future__ import annotations

from typing import Any

import torch

from flowzoo.algorithms.engine.distributed import SingleProcess
from flowzoo.algorithms.engine.losses import approx_kl, binding_clips
from flowzoo.algorithms.engine.stats import CLIP_FRAC_NEG, CLIP_FRAC_POS


class UpdateTally:
    """The PPO update's bookkeeping: sums over the trained (sample, step) pairs, the clipped pairs of named subsets of
    the samples (``Algorithm.clip_subsets``), with ``clip_range`` the pairs whose clip binds by advantage sign
    (``losses.binding_clips``) and the gradient norms; ``finish`` sums them over processes.

    The sums accumulate on the device, in float64 (each chunk's float32 sums widened, as Python floats held them
    before), and reach the host once, in ``finish``: a chunk adds no host read (on a GPU each would wait for it)."""

    FIELDS = ("clipped", "approx_kl", "kl", "ratio", "loss")

    def __init__(self, subsets: dict[str, torch.Tensor], device: torch.device | str = "cpu",
                 clip_range: float | None = None):
        self.subsets = subsets
        #: the subsets' masks on the device, moved once (they index the device's rows)
        self._masks = {name: mask.to(device) for name, mask in subsets.items()}
        #: the clip range whose binding sides are counted (None: not counted)
        self.clip_range = clip_range
        sides = 0 if clip_range is None else 4
        #: [clipped, approx_kl x rows, kl, ratio, loss, then (clipped, total) per subset, then (bound, total) for
        #: positive and negative advantages when counted], float64 on the device
        self._acc = torch.zeros(len(self.FIELDS) + 2 * len(subsets) + sides, dtype=torch.float64, device=device)
        self.pairs = 0
        self.grad_norms: list[float] = []

    @torch.no_grad()
    def add(self, rows: torch.Tensor, terms, log_prob: torch.Tensor, old: torch.Tensor, kl: torch.Tensor,
            per_sample: torch.Tensor, advantages: torch.Tensor | None = None) -> None:
        wide = torch.float64
        values = [terms.clipped.sum().to(wide), approx_kl(log_prob, old).to(wide) * len(rows), kl.sum().to(wide),
                  terms.ratio.sum().to(wide), per_sample.sum().to(wide)]
        for mask in self._masks.values():
            member = mask[rows]
            values += [(terms.clipped & member).sum().to(wide), member.sum().to(wide)]
        if self.clip_range is not None:
            positive, negative = binding_clips(terms.ratio, advantages, self.clip_range)
            values += [positive.sum().to(wide), (advantages > 0).sum().to(wide), negative.sum().to(wide),
                       (advantages < 0).sum().to(wide)]
        self._acc += torch.stack(values)
        self.pairs += len(rows)

    def finish(self, dist: SingleProcess) -> tuple[dict[str, float], dict[str, float]]:
        """(the StepStats fields of the update, {subset column: its clip fraction}) over all processes; the subsets'
        fractions only when every subset holds trained pairs; with ``clip_range`` the binding fractions of the
        positive- and negative-advantage pairs, each when the update trained such pairs."""
        acc = self._acc.tolist()  # the update's one read of its sums
        local = dict(zip(self.FIELDS, acc[: len(self.FIELDS)]), pairs=self.pairs)
        sums = dist.sum(local)
        n = max(sums["pairs"], 1)
        result = {
            "clip_frac": sums["clipped"] / n,
            "approx_kl": sums["approx_kl"] / n,
            "kl": sums["kl"] / n,
            "ratio_mean": sums["ratio"] / n,
            "loss": sums["loss"] / n,
            "grad_norm": sum(self.grad_norms) / max(len(self.grad_norms), 1),
        }
        counts = acc[len(self.FIELDS):]
        pairs = {name: dist.sum(torch.tensor(counts[2 * i: 2 * i + 2], dtype=torch.float64))
                 for i, name in enumerate(self.subsets)}
        fractions = ({} if not pairs or any(c[1] == 0 for c in pairs.values())
                     else {name: float(c[0] / c[1]) for name, c in pairs.items()})
        if self.clip_range is not None:
            sides = dist.sum(torch.tensor(counts[2 * len(self.subsets):], dtype=torch.float64))
            for column, (bound, total) in ((CLIP_FRAC_POS, sides[:2]), (CLIP_FRAC_NEG, sides[2:])):
                if total > 0:
                    fractions[column] = float(bound / total)
        return result, fractions


def rows_on_device(chunks: list[tuple[torch.Tensor | None, Any]], device: torch.device
                   ) -> list[tuple[torch.Tensor | None, Any]]:
    """The update's chunks (host row indices, step) with their rows on ``device``: the rows of every chunk of a
    minibatch go there in one copy, not one per chunk (each would wait for the device: a pageable host-to-device
    copy synchronises)."""
    host = [rows for rows, _ in chunks if rows is not None]
    if not host:
        return chunks
    moved = iter(torch.cat(host).to(device).split([len(rows) for rows in host]))
    return [(rows if rows is None else next(moved), t) for rows, t in chunks]
