"""Gold measures: what a run's samples are worth by a judge the method never trains on, beside the proxy reward it
optimises (reward hacking shows as a proxy gain without a gold gain). ``train.gold`` names one; every evaluation then
logs it on the same samples the reward reads: ``eval_gold`` for a judge where higher is better (a reward),
``eval_gold_distance`` for a distance where lower is better (``toy_w2``).

* ``toy_w2`` (toy tier): the 2-Wasserstein distance between one condition's samples and the condition's *ideal*
  density, averaged over conditions; lower is better. The ideal density (ours) is the class's pretrained mode shape,
  an isotropic Gaussian of the layout's ``mode_std`` (``models/toy2d.py``), centred where the reward asks: the target
  disc's centre (``hard_target``, the ``toy_target`` reward's) or the minority mode (``mode_target``, ``toy_mode``'s;
  on the many-condition layouts both are the disc's centre). A policy that collapses onto the disc's centre earns every
  proxy point and still sits ``sqrt(2) mode_std`` away from it; the base model sits about the disc's offset away.
  The samples' distance uses their Gaussian fit (mean ``m``, covariance ``S``), for which W2 has the closed form
  ``W2^2 = |m - t|^2 + tr S + 2 s^2 - 2 s tr(S^(1/2))`` against ``N(t, s^2 I)`` (Dowson & Landau 1982; Givens & Shortt
  1984: ``tr(S + s^2 I - 2 (s S s)^(1/2))``); for Gaussian samples it is the exact distance of the fitted densities.
* any reward of the registry (``rewards/``), e.g. ``{name: shapes_geneval, score: partial}`` beside the strict score,
  or OCR read-back beside a learned judge: its mean score over the evaluation samples; higher is better.

``column`` is the metrics.csv column; the study's cost table turns both into a "gold gain" where positive means better
by the gold (:mod:`benchmark.analysis.costs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.named_spec import named_spec

#: the toy measure's targets: metadata key -> the reward that asks for it
TOY_TARGETS = {"hard_target": "toy_target", "mode_target": "toy_mode"}
TOY_MEASURES = ("toy_w2",)


def spec_of(value: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``train.gold`` as ``{name: ..., <arguments>}`` (a bare name is ``{name: name}``); None stays None."""
    return named_spec(value, f"train.gold: give a gold measure ({', '.join(TOY_MEASURES)}) or a reward name, or "
                             f"{{name: ..., <arguments>}}, got {value!r}")


def gaussian_w2(points: torch.Tensor, target: Sequence[float], std: float) -> float:
    """The 2-Wasserstein distance between the Gaussian fit of ``points`` [n >= 2, d] and ``N(target, std^2 I)``
    (module docstring)."""
    if points.ndim != 2 or points.shape[0] < 2:
        raise ValueError(f"gaussian_w2 takes [n >= 2, d] points, got shape {tuple(points.shape)}")
    x = points.double()
    mean = x.mean(dim=0)
    cov = torch.cov(x.T).reshape(x.shape[1], x.shape[1])
    root_trace = float(torch.linalg.eigvalsh(cov).clamp(min=0).sqrt().sum())
    shift = float(((mean - torch.as_tensor(target, dtype=torch.float64)) ** 2).sum())
    w2_sq = shift + float(torch.trace(cov)) + x.shape[1] * std * std - 2 * std * root_trace
    return math.sqrt(max(w2_sq, 0.0))


@dataclass
class ToyW2:
    """``toy_w2``: the mean over conditions of :func:`gaussian_w2` to the condition's ideal density."""

    target: str  # the metadata key of the ideal density's centre (TOY_TARGETS)
    name: str = "toy_w2"
    column: str = "eval_gold_distance"  # lower is better
    needs_groups: bool = True  # reads each prompt's samples together (the gathered evaluation)

    def measure(self, samples: torch.Tensor, metadata: Sequence[dict], per_prompt: int) -> float:
        from flowzoo.models.toy2d import mode_std_of

        distances = [gaussian_w2(samples[i:i + per_prompt], metadata[i][self.target], mode_std_of(metadata[i]))
                     for i in range(0, len(metadata), per_prompt)]
        return sum(distances) / len(distances)


@dataclass
class RewardGold:
    """A reward of the registry as the gold: its mean score (higher is better)."""

    reward: Any  # rewards.base.Reward
    name: str
    column: str = "eval_gold"  # higher is better
    needs_groups: bool = False  # scored per sample, on each process's shard

    def scores(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> torch.Tensor:
        return self.reward.score(samples, list(prompts), list(metadata)).score.float()


def check(value: str | Mapping[str, Any] | None, reward_names: Sequence[str], samples_per_prompt: int,
          sample_kind: str) -> dict[str, Any] | None:
    """``train.gold`` checked for a run of the rewards ``reward_names`` (nothing built; a reward's constructor
    arguments are checked by ``benchmark.run.experiment.check``): its spec with a toy measure's
    target resolved, or None. One-line ConfigError for an unknown name, bad arguments, a toy measure on another tier,
    the trained reward itself, or a measure that cannot read these samples."""
    spec = spec_of(value)
    if spec is None:
        return None
    name, args = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    if name == "toy_w2":
        if sample_kind != "points":
            raise ConfigError(f"train.gold toy_w2 measures the toy tier's 2-D points; this model makes {sample_kind!r} "
                              f"samples (give a reward of the registry as the gold)")
        unknown = sorted(set(args) - {"target"})
        if unknown:
            raise ConfigError(f"train.gold toy_w2: unknown argument {unknown[0]!r}; valid: target")
        target = args.get("target") or next((key for key, reward in TOY_TARGETS.items() if reward in reward_names),
                                            "hard_target")
        if target not in TOY_TARGETS:
            raise ConfigError(f"train.gold toy_w2: target must be one of {', '.join(TOY_TARGETS)}, got {target!r}")
        if samples_per_prompt < 2:
            raise ConfigError(f"train.gold toy_w2 fits each condition's samples: train.eval_samples_per_prompt must be "
                              f">= 2, got {samples_per_prompt}")
        return {"name": name, "target": target}
    from flowzoo import rewards

    if name not in rewards.names():
        raise ConfigError(f"train.gold: unknown gold measure {name!r}; gold measures: {', '.join(TOY_MEASURES)}, or "
                          f"a reward: {', '.join(rewards.names())}")
    if name in reward_names and not args:
        raise ConfigError(f"train.gold {name!r} is the reward the run trains on, with its own arguments: a gold "
                          "measure is a judge the method never sees (give other arguments or another reward)")
    cls = rewards.get(name)
    if sample_kind not in cls.accepts:
        raise ConfigError(f"train.gold {name!r} scores {', '.join(cls.accepts)} samples; this model makes "
                          f"{sample_kind!r}")
    return {"name": name, **args}  # the constructor's arguments: experiment.check


def build(value: str | Mapping[str, Any] | None, reward_names: Sequence[str], samples_per_prompt: int,
          sample_kind: str):
    """The gold measure of ``train.gold`` (:func:`check`'s errors), or None."""
    spec = check(value, reward_names, samples_per_prompt, sample_kind)
    if spec is None:
        return None
    if spec["name"] == "toy_w2":
        return ToyW2(spec["target"])
    from flowzoo import rewards

    name, args = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    return RewardGold(rewards.get(name)(**args), name)
