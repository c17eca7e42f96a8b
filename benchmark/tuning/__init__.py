"""Tuning: ``flowzoo tune SUITE`` gives every algorithm of a suite the same Optuna budget (docs/tuning.md).

- ``design.py``: the suite's ``tuning:`` section (objective, trials, seeds, sampler, pruner), fixed before any trial;
- ``tune.py``: the trials (one Optuna study per cell, runs through the runner, storage, workers, scheduler jobs);
- ``pruners.py``: the pruning rules, the same for every cell;
- ``report.py``: ``flowzoo tune --out``: trial tables, the chosen configurations, sensitivity figures.

What a trial may change is declared beside each recipe (benchmark/config/search_space.py); the chosen values
enter a run as its tuned layer (benchmark/config/tuned.py, resolved with every other layer by
benchmark/config/resolve.py). This room sits above experiments and analysis: only its design reader (and the
pruner names it checks) is read by the suite loader.
"""
