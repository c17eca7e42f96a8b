"""How varied a policy's samples for one prompt are: the first of the measures of what a reward gain costs.

* :func:`mean_pairwise_distance`: the mean Euclidean distance between two different samples of one prompt, on the
  samples' values flattened and divided by the square root of their size (a root-mean-square distance per value, so
  images of any resolution and 2-D points read on one scale). A policy that has collapsed to one sample per prompt
  scores 0.
* :func:`spread_ratio`: per prompt, the policy's mean pairwise distance over the base model's on the same evaluation
  noise and prompts, averaged over prompts: 1 where the fine-tune keeps the base's variety, 0 where it collapsed.
* :func:`toy_spread`: the toy tier's closed form: the trace of one condition's sample covariance over the true
  spread of its target mode (``2 mode_std^2`` for an isotropic 2-D Gaussian of std ``mode_std``): 1 for samples of the
  true mode, 0 for a collapsed policy, above 1 for samples spread wider than the mode.

* :func:`mean_cosine_distance` / :class:`ClipFeatures`: the image tiers' spread on a fixed feature extractor: the
  mean cosine distance (1 - cos) between two different samples' CLIP image embeddings (``train.spread_features``,
  the runner's ``eval_spread_features``). Pixels weigh every shift of a scene; a CLIP embedding reads what the image
  shows, which is what "the fine-tune draws the same picture for every seed" is about. CLIP (a transformers
  ``CLIPModel`` directory, e.g. openai/clip-vit-large-patch14, the CLIP score's weights) because the OCR, PickScore,
  CLIP-score and aesthetic rewards already load it from local files, so every machine that trains on them has it.

For two independent samples of an isotropic Gaussian with std ``s`` in ``d`` dimensions the difference has std
``sqrt(2) s`` per value, so the mean pairwise distance here is ``sqrt(2) s E[chi_d] / sqrt(d)``; in 2-D,
``E[chi_2] = sqrt(pi / 2)`` gives ``s sqrt(pi) / sqrt(2)`` (the tests check these).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


def mean_pairwise_distance(samples: torch.Tensor) -> float:
    """The mean distance between two different samples of ``samples`` [n, ...] (n >= 2), per value (module
    docstring). ValueError for fewer than 2 samples: one sample has no spread to measure."""
    n = samples.shape[0]
    if n < 2:
        raise ValueError(f"the spread of a prompt's samples needs at least 2 samples, got {n}")
    flat = samples.reshape(n, -1).double()
    distances = torch.cdist(flat, flat)  # [n, n], 0 on the diagonal
    return float(distances.sum() / (n * (n - 1)) / math.sqrt(flat.shape[1]))


def per_prompt_spread(samples: torch.Tensor, samples_per_prompt: int) -> list[float]:
    """:func:`mean_pairwise_distance` of each prompt's samples, for ``samples`` ordered prompt by prompt, each prompt's
    ``samples_per_prompt`` consecutive (the evaluation's order)."""
    if samples_per_prompt < 2 or samples.shape[0] % samples_per_prompt:
        raise ValueError(f"{samples.shape[0]} samples do not split into prompts of {samples_per_prompt} >= 2 samples")
    return [mean_pairwise_distance(group) for group in samples.split(samples_per_prompt)]


def spread_ratio(policy: Sequence[float], base: Sequence[float]) -> float:
    """The mean over prompts of the policy's spread over the base's (the same prompts, in the same order); a prompt
    whose base samples have no spread is left out (its ratio is undefined). NaN when none is left."""
    if len(policy) != len(base):
        raise ValueError(f"{len(policy)} policy prompts against {len(base)} base prompts")
    ratios = [p / b for p, b in zip(policy, base) if b > 0]
    return sum(ratios) / len(ratios) if ratios else math.nan


def toy_spread(points: torch.Tensor, mode_std: float) -> float:
    """One toy condition's samples [n, 2]: the trace of their covariance over ``2 mode_std^2``, the true mode's."""
    if points.ndim != 2 or points.shape[1] != 2 or points.shape[0] < 2:
        raise ValueError(f"toy_spread takes [n >= 2, 2] points, got shape {tuple(points.shape)}")
    centred = points.double() - points.double().mean(dim=0)
    trace = float((centred ** 2).sum() / (points.shape[0] - 1))
    return trace / (2 * mode_std * mode_std)


def mean_cosine_distance(embeddings: torch.Tensor) -> float:
    """The mean of 1 - cos between two different rows of ``embeddings`` [n >= 2, d] (rows of any norm): 0 when every
    sample embeds alike, 1 for orthogonal embeddings."""
    n = embeddings.shape[0]
    if n < 2:
        raise ValueError(f"the spread of a prompt's samples needs at least 2 samples, got {n}")
    unit = torch.nn.functional.normalize(embeddings.double(), dim=-1)
    cosine = unit @ unit.T
    return float((n * n - cosine.sum()) / (n * (n - 1)))  # the diagonal's 1 - 1 = 0 adds nothing


class ClipFeatures:
    """``train.spread_features``: CLIP image embeddings of the evaluation samples (``rewards.clip_family``'s loader:
    ``path`` a local CLIPModel directory, else ``$FLOWZOO_CLIPSCORE_PATH``)."""

    def __init__(self, path: str | None = None, device: str = "cpu"):
        from flowzoo.rewards.clip_family import ClipScore

        self.encoder = ClipScore(path=path, device=device)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.encoder.image_embeddings(images).cpu()


def feature_spread(embeddings: torch.Tensor, samples_per_prompt: int) -> float:
    """The mean over prompts of :func:`mean_cosine_distance` of each prompt's ``samples_per_prompt`` consecutive
    embeddings (the evaluation's order)."""
    groups = embeddings.split(samples_per_prompt)
    return sum(mean_cosine_distance(group) for group in groups) / len(groups)
