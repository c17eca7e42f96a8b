"""Loading run directories for the analysis: each run's ``config.yaml`` and ``metrics.csv`` (found recursively) as
rows of one table, with the checks that keep a table to one experiment per (task, algorithm) cell. A run whose files
cannot be used is skipped with a warning (``SkippedRun``: the run and the cause); the definitions of what is computed
from the rows are in :mod:`benchmark.analysis.stats`."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from flowzoo.errors import ConfigError, RunError
from flowzoo.schema import differing_keys



REQUIRED_COLUMNS = ("step", "nfe", "wall_s", "eval_reward")


RUN_KEYS = ("run", "task", "algorithm", "seed", "train_steps", "finished")


LOG = logging.getLogger("flowzoo.report")


def find_run_dirs(runs_dir: str | Path) -> list[Path]:
    """Every directory under ``runs_dir`` (itself included, any depth) holding both config.yaml and metrics.csv."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise ConfigError(f"runs directory {str(runs_dir)!r} does not exist or is not a directory")
    found = {p.parent for p in runs_dir.rglob("config.yaml") if (p.parent / "metrics.csv").is_file()}
    return sorted(found)


def half_present_runs(runs_dir: str | Path) -> list[SkippedRun]:
    """Directories under ``runs_dir`` holding one of config.yaml and metrics.csv but not the other, each with why it
    is not a run to read (a run that has not written its first row yet, or a copy that lost a file)."""
    runs_dir = Path(runs_dir)
    half = []
    for name, other, cause in (("config.yaml", "metrics.csv", "not started, or still starting"),
                               ("metrics.csv", "config.yaml", "its metrics cannot be told apart from another run's")):
        for path in runs_dir.rglob(name):
            if not (path.parent / other).is_file():
                where = path.parent.relative_to(runs_dir).as_posix()
                half.append(SkippedRun(where, f"{path}: no {other} beside it ({cause})"))
    return sorted(half, key=lambda s: s.run)


def _config_value(config: Mapping, dotted_key: str, path: Path):
    value = config
    for key in dotted_key.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise ConfigError(f"{path}: missing key {dotted_key!r} (need task, seed, algorithm.name, train.steps)")
        value = value[key]
    return value


def read_run_keys(run_dir: str | Path) -> tuple[dict, tuple[str, str, int, int]]:
    """A run's stored config (read under the bounds of any config: ``read_stored_config``) and its keys ``(task,
    algorithm, seed, train.steps)``, validated; ``ConfigError`` naming the file when it cannot be read or lacks one.
    Every analysis reader of a run's config.yaml goes through here."""
    from flowzoo.benchmark.config.schema import read_stored_config

    config_path = Path(run_dir) / "config.yaml"
    config = read_stored_config(config_path)
    algorithm_name = _config_value(config, "algorithm.name", config_path)  # as every run's config.yaml holds it
    task_label = _config_value(config, "task", config_path)
    if not isinstance(task_label, str) or not isinstance(algorithm_name, str):
        raise ConfigError(f"{config_path}: task and algorithm.name must be names, got {task_label!r} and "
                          f"{algorithm_name!r}")
    return config, (task_label, algorithm_name, _config_int(config, "seed", config_path),
                    _config_int(config, "train.steps", config_path))


def load_run(run_dir: str | Path, runs_dir: str | Path | None = None) -> pd.DataFrame:
    """One run as tidy rows: the run keys (``RUN_KEYS``) repeated on every row of its metrics.csv.

    ``run`` is the run directory relative to ``runs_dir`` (POSIX style), unique within a runs directory. Raises
    ``ConfigError`` naming the file for a config.yaml or metrics.csv that cannot be read or lacks what is needed.
    """
    run_dir = Path(run_dir)
    config, (task_label, algorithm_name, seed, train_steps) = read_run_keys(run_dir)
    identity = cell_identity(config)
    check_done_matches_config(run_dir)
    metrics = read_metrics(run_dir / "metrics.csv")
    # a resumed run may log a step twice: the later row is the one that continued
    metrics = metrics.drop_duplicates("step", keep="last").sort_values("step", kind="stable").reset_index(drop=True)

    last_step = metrics["step"].max() if len(metrics) else -1
    keys = {
        "run": run_dir.relative_to(runs_dir).as_posix() if runs_dir is not None else run_dir.name,
        "task": str(task_label),
        "algorithm": str(algorithm_name),
        "seed": seed,
        "train_steps": train_steps,
        "finished": bool(last_step >= train_steps),
    }
    for position, (key, value) in enumerate(keys.items()):
        metrics.insert(position, key, [value] * len(metrics))
    metrics.attrs["identity"] = identity
    metrics.attrs["tuned"] = tuned_recipe(config)
    metrics.attrs["eval_protocol"] = evaluation_protocol(config)
    return metrics


def evaluation_protocol(config: Mapping) -> str:
    """The sampler a run's eval rewards come from (``train.eval_sampler``, benchmark/measures/evaluation.py), in
    words: ``pipeline`` (the model's own), with the shift, CFG scale and steps the run named, or ``algorithm`` (its
    algorithm's training shift and guidance: a run made before the protocol existed whose algorithm set either)."""
    train = config.get("train") if isinstance(config.get("train"), Mapping) else {}
    algorithm = config.get("algorithm") if isinstance(config.get("algorithm"), Mapping) else {}
    sampler = train.get("eval_sampler") or "algorithm"  # a run made before the protocol: its algorithm's sampler
    if sampler == "algorithm" and algorithm.get("guidance") is None and algorithm.get("shift") is None:
        sampler = "pipeline"  # the algorithm keeps the model's own shift and CFG scale: the same sampler
    parts = []
    if sampler == "pipeline":
        parts += [f"shift {train['eval_shift']:g}"] if train.get("eval_shift") is not None else []
        parts += [f"CFG {train['eval_guidance']:g}"] if train.get("eval_guidance") is not None else []
    parts.append(f"{train['eval_num_steps']} steps" if train.get("eval_num_steps") else "the model's steps")
    return f"{sampler} ({', '.join(parts)})"


def protocol_line(protocols: Mapping[str, str], tasks: Mapping[str, str] | None = None) -> str:
    """One line for a page: the evaluation protocol of every run (``protocols``: run -> :func:`evaluation_protocol`),
    or, where they differ, each with its count and a warning that those eval rewards are not of one sampler. With
    ``tasks`` (run -> task), protocols that differ only between tasks (each task's runs of one sampler: their rewards
    compare within the task, the only comparison a page makes) are listed per task, without the warning."""
    counts: dict[str, int] = {}
    for protocol in protocols.values():
        counts[protocol] = counts.get(protocol, 0) + 1
    if len(counts) == 1:
        return (f"Evaluation protocol: `{next(iter(counts))}` for every run (`pipeline`: the model's own sampler, its "
                "shift and CFG scale on its grid; `algorithm`: each algorithm's training shift and guidance; "
                "docs/harness.md).")
    by_task: dict[str, set[str]] = {}
    for run, protocol in protocols.items():
        by_task.setdefault((tasks or {}).get(run, ""), set()).add(protocol)
    if tasks is not None and "" not in by_task and all(len(p) == 1 for p in by_task.values()):
        shared: dict[str, list[str]] = {}
        for task, (protocol,) in sorted(by_task.items()):
            shared.setdefault(protocol, []).append(f"`{task}`")
        listed = "; ".join(f"{', '.join(names)}: `{protocol}`" for protocol, names in sorted(shared.items()))
        return (f"Evaluation protocol, one per task: {listed} (every run of a task under the same sampler; "
                "docs/harness.md).")
    listed = ", ".join(f"`{p}` ({n} runs)" for p, n in sorted(counts.items()))
    return (f"Evaluation protocols differ between runs: {listed}; eval rewards of different protocols come from "
            "different samplers and are not comparable (set train.eval_sampler alike for every cell).")


def run_machine(run_dir: str | Path) -> str | None:
    """The machine a finished run names in its done.json (``machine``, benchmark/run/machine.py): its CPU
    model, with its accelerator after `` + `` when it had one; None for a run that names none (unfinished, or made
    before runs recorded their machine)."""
    try:
        summary = json.loads((Path(run_dir) / "done.json").read_text())
    except (OSError, ValueError):
        return None
    machine = summary.get("machine") if isinstance(summary, dict) else None
    if not isinstance(machine, dict) or not machine.get("cpu"):
        return None
    return str(machine["cpu"]) + (f" + {machine['accelerator']}" if machine.get("accelerator") else "")


def machine_line(machines: Mapping[str, str | None]) -> str:
    """One line for a page: the machines its runs were made on (``machines``: run -> :func:`run_machine`), each with
    its run count, and how many runs name none; "" when no run names one (a page of runs made before runs recorded
    their machine reads as before)."""
    counts: dict[str, int] = {}
    unnamed = 0
    for machine in machines.values():
        if machine is None:
            unnamed += 1
        else:
            counts[machine] = counts.get(machine, 0) + 1
    if not counts:
        return ""
    listed = ", ".join(f"`{machine}` ({_runs(n)})" for machine, n in sorted(counts.items()))
    text = f"Machines (each run's done.json `machine`): {listed}"
    if unnamed:
        text += f"; {_runs(unnamed)} name{'s' if unnamed == 1 else ''} none (made before runs recorded their machine)"
    if len(counts) + bool(unnamed) > 1:
        text += ("; float results of the same code differ between CPUs, so a run repeats bit for bit only on its "
                 "own kind of machine")
    return text + "."


def _runs(count: int) -> str:
    return f"{count} run" + ("" if count == 1 else "s")


def tuned_recipe(config: Mapping) -> str | None:
    """The ``tuned:`` directory a run's recipe came from (its config.yaml's ``recipe`` note), or None: a run at its
    suite's own recipe, or one made before runs recorded their recipe."""
    note = config.get("recipe")
    tuned = note.get("tuned") if isinstance(note, Mapping) else None
    return str(tuned) if tuned else None


def check_done_matches_config(run_dir: Path) -> None:
    """A finished run is bound to its config as train's skip, eval and export bind it: when ``done.json`` carries the
    digest of the config that wrote it and the run's ``config.yaml`` loads here, the two must agree, else
    ``ConfigError`` (the run is skipped with that cause: its metrics belong to another config). A done.json without
    a digest (written before digests), or a config that does not load on this machine (e.g. prompt files elsewhere),
    is not checked."""
    try:
        summary = json.loads((run_dir / "done.json").read_text())
    except (OSError, ValueError):
        return
    digest = summary.get("config_digest") if isinstance(summary, dict) else None
    if not isinstance(digest, str):
        return
    from flowzoo.benchmark.run.checkpoints import config_digest
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.errors import FlowZooError

    try:
        config = load_config(run_dir / "config.yaml")
    except FlowZooError:
        return
    if config_digest(config) != digest:
        raise ConfigError(f"{run_dir / 'done.json'}: written by a run of another config than its config.yaml (edited "
                          "after the run?); its metrics are not this config's")


def cell_identity(config: Mapping) -> dict:
    """What a run computes apart from its seed (:func:`benchmark.run.checkpoints.run_identity` without ``seed``): runs
    of one (task, algorithm) cell must agree on it to be pooled as seeds of one experiment. ``train.steps`` is left
    to :func:`check_budgets`."""
    from flowzoo.benchmark.run.checkpoints import run_identity

    identity = run_identity(dict(config), set())
    identity.pop("seed", None)
    if isinstance(identity.get("train"), dict):  # budgets: check_budgets names them run by run
        identity["train"] = {k: v for k, v in identity["train"].items() if k != "steps"}
    return identity


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no detail"


def _config_int(config: Mapping, dotted_key: str, path: Path) -> int:
    value = _config_value(config, dotted_key, path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{path}: {dotted_key} is {value!r}, not an integer")
    return int(value)


#: text a missing value is never written as: the runner writes one as an empty field, so ``nan`` in a file is a value
#: that was not a number (or an edit), never "not evaluated"
NAN_TEXTS = frozenset({"nan", "NaN", "NAN", "-nan", "+nan"})


#: the most bytes a run's metrics.csv may hold: a run writes a few hundred bytes a step, so 1 GiB is millions of steps;
#: a larger file is damage or something else, and reading it whole could take the machine's memory
MAX_METRICS_BYTES = 1 << 30


def read_metrics(path: Path) -> pd.DataFrame:
    """A run's metrics.csv, validated: ``RunError`` naming the file and what is wrong (a run's file, not a config) when
    it is empty, binary or not CSV; when its last line is cut mid-row (no line end: an interrupted write or a full
    disk; a value cut short would read as another number); when a row has another number of fields than the header;
    when a required column is missing or holds text; when a value is written ``nan`` (the runner writes a missing
    value as an empty field: ``nan`` is a result that was not a number, and dropping it would report an earlier
    evaluation as the last); or infinite; when it holds a header and no rows; when it is over ``MAX_METRICS_BYTES``
    (checked before reading)."""
    try:
        size = path.stat().st_size
        if size > MAX_METRICS_BYTES:
            raise RunError(f"{path}: {size / (1 << 30):.1f} GiB, over the {MAX_METRICS_BYTES >> 30} GiB a run's "
                           "metrics may hold (a run writes a few hundred bytes a step); not read; move the run out")
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise RunError(f"{path}: unreadable ({type(error).__name__}: {_first_line(error)})") from None
    if text and not text.endswith("\n"):
        raise RunError(f"{path}: its last line is cut mid-row (no line end: an interrupted write or a full disk); "
                       "resume the run to rewrite the file, or move the run out")
    _check_fields(path, text)
    try:
        metrics = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])
    except (pd.errors.EmptyDataError, pd.errors.ParserError, ValueError) as error:
        raise RunError(f"{path}: unreadable ({type(error).__name__}: {_first_line(error)})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in metrics.columns]
    if missing:
        raise RunError(f"{path}: missing columns {missing}; required: {list(REQUIRED_COLUMNS)}")
    if not len(metrics):  # the runner writes the file with its first row (the step-0 evaluation): never bare
        raise RunError(f"{path}: a header and no rows (a cut or emptied file); resume the run to rewrite it, or move "
                       "the run out")
    for column in metrics.columns[[not pd.api.types.is_numeric_dtype(t) for t in metrics.dtypes]]:
        nan = metrics[column].isin(NAN_TEXTS)
        if nan.any():
            at = metrics.loc[nan, "step"].iloc[0]
            raise RunError(f"{path}: column {column!r} is 'nan' at step {at} ({int(nan.sum())} rows); a value that "
                           "is not a number is no result (a missing one is an empty field)")
    for column in REQUIRED_COLUMNS:
        values = pd.to_numeric(metrics[column], errors="coerce")
        if (values.isna() & metrics[column].notna()).any():
            raise RunError(f"{path}: column {column!r} holds values that are not numbers")
        metrics[column] = values
    if metrics["step"].isna().any():
        raise RunError(f"{path}: rows without a step")
    infinite = [c for c in REQUIRED_COLUMNS if np.isinf(metrics[c].to_numpy(float)).any()]
    if infinite:
        raise RunError(f"{path}: infinite values in {infinite}")
    return metrics


def _check_fields(path: Path, text: str) -> None:
    """Every row has as many fields as the header (a short row would read its missing values as not evaluated)."""
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    for line, row in enumerate(rows, start=2):
        if row and header is not None and len(row) != len(header):
            raise RunError(f"{path}: line {line} has {len(row)} fields, the header {len(header)} (a damaged row)")


@dataclass(frozen=True)
class SkippedRun:
    """A run directory the report could not use, and why (one line)."""

    run: str
    cause: str


def recipe_text(runs, recipes: dict) -> str:
    """Where a cell's ``runs`` took their recipe (``recipes``: run -> :func:`tuned_recipe`): ``tuned: `DIR``` (with
    how many of its runs, when not all), else —."""
    sources = [recipes.get(run) for run in runs]
    parts = []
    for directory in sorted({s for s in sources if s}):
        count = sources.count(directory)
        parts.append(f"tuned: `{directory}`" + ("" if count == len(sources) else f" ({count} of {len(sources)} runs)"))
    return "; ".join(parts) or "—"


def load_runs(runs_dir: str | Path, skipped: list[SkippedRun] | None = None,
              recipes: dict[str, str | None] | None = None, protocols: dict[str, str] | None = None) -> pd.DataFrame:
    """All runs under ``runs_dir`` as one tidy frame: one row per (run, step); optional columns are NaN where absent.

    A run whose config.yaml or metrics.csv cannot be used is left out with a warning naming the file; when
    ``skipped`` is a list, a :class:`SkippedRun` is appended to it for each. ``ConfigError`` when no run is usable.
    When ``recipes`` is a dict, it gets each loaded run's :func:`tuned_recipe` under its ``run`` name; when
    ``protocols`` is one, its :func:`evaluation_protocol`.
    """
    run_dirs = find_run_dirs(runs_dir)
    half = half_present_runs(runs_dir)
    if not run_dirs:
        also = f" ({len(half)} hold only one of them; first: {half[0].cause})" if half else ""
        raise ConfigError(
            f"no runs found in {str(runs_dir)!r}: expected directories holding config.yaml and metrics.csv{also}"
        )
    frames, left_out = [], list(half)
    for skipped_run in half:
        LOG.warning("skipped run %s", skipped_run.cause)
    for run_dir in run_dirs:
        try:
            frames.append(load_run(run_dir, runs_dir))
            if recipes is not None:
                recipes[run_dir.relative_to(runs_dir).as_posix()] = frames[-1].attrs["tuned"]
            if protocols is not None:
                protocols[run_dir.relative_to(runs_dir).as_posix()] = frames[-1].attrs["eval_protocol"]
        except (ConfigError, RunError) as error:  # the run's config or its metrics file
            left_out.append(SkippedRun(run_dir.relative_to(runs_dir).as_posix(), str(error)))
            LOG.warning("skipped run %s", error)
    if skipped is not None:
        skipped.extend(left_out)
    if not frames:
        raise ConfigError(f"no readable runs in {str(runs_dir)!r}: all {len(left_out)} were skipped "
                          f"(first: {left_out[0].cause})")
    check_one_experiment_per_cell(frames)
    frames = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(frames, ignore_index=True, sort=False)


def check_one_experiment_per_cell(frames: list[pd.DataFrame]) -> None:
    """Refuse to pool runs that are not seeds of one experiment: two runs of one (task, algorithm, seed) (a copied run
    directory would count one seed twice), or runs of one (task, algorithm) whose configs differ in anything but the
    seed. ``ConfigError`` naming the runs and, for differing configs, the keys."""
    by_seed: dict[tuple, str] = {}
    by_cell: dict[tuple, tuple[str, dict]] = {}
    by_suite: dict[tuple, tuple[str, str]] = {}
    for frame in frames:
        if not len(frame):
            continue
        first = frame.iloc[0]
        run, cell = str(first["run"]), (str(first["task"]), str(first["algorithm"]))
        suite = suite_folder(run, *cell)
        if cell in by_suite and suite is not None and by_suite[cell][1] != suite:
            other, theirs = by_suite[cell]
            raise ConfigError(f"runs {other} and {run} of task {cell[0]!r}, algorithm {cell[1]!r} are runs of two "
                              f"suites ({theirs}, {suite}): a report pools the seeds of one suite's cell; give one "
                              "suite's folder (RUNS/<suite>)")
        if suite is not None:
            by_suite.setdefault(cell, (run, suite))
        seed_key = (*cell, int(first["seed"]))
        if seed_key in by_seed:
            raise ConfigError(f"runs {by_seed[seed_key]} and {run} are both task {cell[0]!r}, algorithm {cell[1]!r}, "
                              f"seed {seed_key[2]}: a report counts each run once; move one out of the runs directory")
        by_seed[seed_key] = run
        identity = frame.attrs.get("identity")
        if identity is None:
            continue
        if cell in by_cell and by_cell[cell][1] != identity:
            other, keys = by_cell[cell][0], differing_keys(by_cell[cell][1], identity)
            raise ConfigError(f"runs {other} and {run} of task {cell[0]!r}, algorithm {cell[1]!r} differ in "
                              f"{', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}: a report pools only seeds of "
                              "one config; move the others out of the runs directory")
        by_cell.setdefault(cell, (run, identity))


def suite_folder(run: str, task: str, algorithm: str) -> str | None:
    """The suite folder of a run at ``<suite>/<task>/<algorithm>/s<seed>`` (the folder ``flowzoo bench`` places it
    in, named by ``run``, its path under the runs directory), or None for a run outside that layout."""
    parts = run.split("/")
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == task and parts[i + 1] == algorithm:
            return "/".join(parts[:i])
    return None


def check_budgets(runs: pd.DataFrame) -> None:
    """Runs of one (task, algorithm) must share ``train.steps``: their costs and final rewards would otherwise be
    averaged over different budgets. ``ConfigError`` naming the cell and the runs of each budget."""
    cells = runs.groupby(["task", "algorithm"], sort=True)
    for (task, algorithm), group in cells:
        budgets = group.groupby("train_steps", sort=True)["run"].unique()
        if len(budgets) > 1:
            listed = "; ".join(f"train.steps {steps}: {', '.join(sorted(r))}" for steps, r in budgets.items())
            raise ConfigError(
                f"task {task!r}, algorithm {algorithm!r} mixes run budgets ({listed}); a report compares runs of one "
                "budget: move the others out of the runs directory"
            )


def run_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: the run keys, ``last_step`` (largest logged step) and ``n_evals``."""
    grouped = runs.groupby("run", sort=True)
    summary = grouped[list(RUN_KEYS[1:])].first()
    summary["last_step"] = grouped["step"].max()
    summary["n_evals"] = grouped["eval_reward"].count()
    return summary.reset_index()
