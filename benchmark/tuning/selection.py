"""How often a tuning's pick is worse than the default recipe: the plain argmax against the confirmed pick.

A synthetic objective with a known optimum: a knob x in [0, 1] (think log learning rate) with true objective
``f(x) = peak - depth * ((x - optimum) / 0.5) ** 2``; the default recipe sits at ``default`` (f(default) a little below
the peak, as a released or shared recipe usually is). A trial draws x uniformly and is scored as the mean of
``tuning_seeds`` noisy runs, each ``f(x) + N(0, noise_sd)`` (the between-seed spread of a run's objective). The
**argmax** pick is the best-scored trial; the **confirmed** pick re-runs the ``top_k`` best trials and the default on
``confirm_seeds`` fresh seeds and keeps the default unless a trial's confirmation mean beats it
(benchmark/tuning/confirm.py). A pick is *worse than the default* when its true f is below f(default).

    flowzoo tuning-selection [--simulations 4000]

prints, for a few noise levels, each rule's rate of worse-than-default picks and the mean true gain over the default.
The numbers docs/tuning.md quotes come from this command.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from flowzoo.command_line import run_alias
from flowzoo.errors import ConfigError
from flowzoo.markdown import markdown_table


@dataclass(frozen=True)
class Landscape:
    peak: float = 0.20
    depth: float = 0.15  # the objective falls by this much half the range away from the optimum
    optimum: float = 0.6
    default: float = 0.45

    def value(self, x):
        return self.peak - self.depth * ((np.asarray(x, dtype=float) - self.optimum) / 0.5) ** 2


@dataclass(frozen=True)
class Outcome:
    worse_argmax: float  # share of simulated tunings whose argmax pick is truly worse than the default
    worse_confirmed: float
    gain_argmax: float  # mean true f(pick) - f(default)
    gain_confirmed: float


def simulate(noise_sd: float, trials: int = 24, tuning_seeds: int = 1, top_k: int = 3, confirm_seeds: int = 3,
             simulations: int = 4000, landscape: Landscape = Landscape(), seed: int = 0) -> Outcome:
    """The two rules over ``simulations`` independent tunings (module docstring)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(simulations, trials))
    truth = landscape.value(x)
    scored = truth + rng.normal(0, noise_sd, size=(simulations, trials, tuning_seeds)).mean(axis=-1)
    base = float(landscape.value(landscape.default))
    argmax = truth[np.arange(simulations), scored.argmax(axis=1)]
    top = np.argsort(-scored, axis=1)[:, :top_k]
    top_truth = np.take_along_axis(truth, top, axis=1)
    confirmed_scores = top_truth + rng.normal(0, noise_sd, size=(simulations, top_k, confirm_seeds)).mean(axis=-1)
    default_scores = base + rng.normal(0, noise_sd, size=(simulations, confirm_seeds)).mean(axis=-1)
    best = confirmed_scores.argmax(axis=1)
    beats = confirmed_scores[np.arange(simulations), best] > default_scores
    confirmed = np.where(beats, top_truth[np.arange(simulations), best], base)
    return Outcome(float((argmax < base).mean()), float((confirmed < base).mean()),
                   float((argmax - base).mean()), float((confirmed - base).mean()))


DESCRIPTION = ("A synthetic objective with a known optimum, tuned many times at a few noise levels: each rule's rate "
               "of\nworse-than-default picks and its mean true gain over the default, as a markdown table (the "
               "numbers\ndocs/tuning.md quotes).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo tuning-selection``'s argument."""
    parser.add_argument("--simulations", type=int, default=4000, metavar="N", help="simulated tunings per noise level")


def run(args: argparse.Namespace) -> int:
    """``flowzoo tuning-selection``: the table."""
    if args.simulations < 1:
        raise ConfigError(f"--simulations {args.simulations}: give at least 1 simulated tuning")
    landscape = Landscape()
    print(f"f(x) = {landscape.peak} - {landscape.depth} ((x - {landscape.optimum}) / 0.5)^2, default x = "
          f"{landscape.default} (f = {float(landscape.value(landscape.default)):.4f}); 24 trials; confirmation: top 3 "
          f"+ the default on 3 fresh seeds; {args.simulations} simulated tunings each")
    rows = []
    for noise, seeds in ((0.01, 1), (0.03, 1), (0.05, 1), (0.05, 3), (0.08, 1), (0.08, 3)):
        out = simulate(noise, tuning_seeds=seeds, simulations=args.simulations)
        rows.append([noise, seeds, f"{out.worse_argmax:.1%}", f"{out.worse_confirmed:.1%}", f"{out.gain_argmax:+.4f}",
                     f"{out.gain_confirmed:+.4f}"])
    print("\n".join(markdown_table(["noise sd (one run)", "tuning seeds", "argmax worse than default",
                                    "confirmed worse", "argmax mean gain", "confirmed mean gain"], rows)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flowzoo.benchmark.tuning.selection``: the older spelling of ``flowzoo tuning-selection``."""
    return run_alias("flowzoo.benchmark.tuning.selection", DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
