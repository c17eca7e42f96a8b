"""Tuning: ``flowzoo tune SUITE`` gives every algorithm of a suite the same Optuna budget (docs/tuning.md).

- ``design.py``: the suite's ``tuning:`` section (objective, trials, seeds, sampler, pruner), fixed before any trial;
- ``tune.py``: the command's trials (one Optuna study per cell, runs through the runner), from its parts:
  ``cells.py`` (the cells, their spaces, a trial's runs), ``objective.py``, ``budget.py`` (the budget and the queue of
  re-runs), ``storage.py``, ``studies.py``, ``trial_worker.py`` (a trial and a worker's loop), ``local_workers.py``
  and ``jobs.py`` (workers as processes here or as scheduler jobs);
- ``pruners.py``: the pruning rules, the same for every cell;
- ``report.py``: ``flowzoo tune --out``: trial tables, the chosen configurations, sensitivity figures.

What a trial may change is declared beside each recipe (benchmark/config/search_space.py); the chosen values
enter a run as its tuned layer (benchmark/config/tuned.py, resolved with every other layer by
benchmark/config/resolve.py). This room sits above experiments and analysis: only its design reader (and the
pruner names it checks) is read by the suite loader.
"""
