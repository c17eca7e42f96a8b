"""Suites: grids of algorithm x task x seed, run in parallel worker processes, finished runs skipped.

A suite YAML (``benchmark/suites/*.yaml``) holds ``name``, ``seeds``, ``algorithms``, ``defaults`` (config keys for
every run) and ``tasks`` (task name -> config keys: model, reward, prompts, train, ...; plus optionally
``algorithms`` and ``seeds`` to run a subset of the suite's algorithms or other seeds on that task).

A run's algorithm keys are layered by :mod:`benchmark.config.resolve`, the one resolver every command uses:
the class defaults (with its preset) < the suite's shared ``algorithm`` block (``defaults.algorithm``, then
``tasks.<task>.algorithm``) < the algorithm's released recipe (``benchmark/recipes/<algorithm>.yaml``) < the
suite's per-algorithm block (``defaults.per_algorithm.<algorithm>``, then ``tasks.<task>.per_algorithm.<algorithm>``)
< the tuned layer < ``key=value`` overrides from the command line. :func:`cell_keys` gives a cell's layers.

A run's ``train`` keys: the suite's ``train`` block (defaults, then the task's), then the algorithm's entry of
``per_algorithm_train: {<algorithm>: {...}}`` (defaults, then the task's), e.g. each algorithm's released prompts per
step in the paper suites; then the command line.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from flowzoo import algorithms
from flowzoo.benchmark.config.schema import ExperimentConfig, read_yaml
from flowzoo.benchmark.run.loading import build_config
from flowzoo.benchmark.config.inert import check_trains_something
from flowzoo.benchmark.run.memory import fit_run
from flowzoo.benchmark.run.executors import Resources, resolve_resources
from flowzoo.benchmark.config.resolve import Layers, Resolved, resolve
from flowzoo.benchmark.run.runner import holds_other_config, is_finished, run_quietly
from flowzoo.benchmark.config.tuning_design import read_design
from flowzoo.benchmark.config.tuned import TunedValues, find_tuned, recipe_note
from flowzoo.errors import ConfigError
from flowzoo.labels import check_label
from flowzoo.schema import differing_keys, from_mapping

PACKAGE_DIR = Path(__file__).absolute().parents[1]  # benchmark/ (not resolved: a linked copy of the tree is its own)
SUITES_DIR = PACKAGE_DIR / "suites"


@dataclass
class Suite:
    name: str
    tasks: dict
    algorithms: list[str] = field(default_factory=lambda: ["flow_grpo"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    defaults: dict = field(default_factory=dict)
    description: str = ""
    #: the question a study of this suite answers, in one line: its page's title (``flowzoo study``)
    question: str = ""
    #: algorithms to run only on some tasks: {algorithm: [task, ...]}; others run everywhere
    only_tasks: dict = field(default_factory=dict)
    #: named, disjoint seed sets, e.g. {exploration: [0, ..., 9], replication: [100, ..., 109]}: a study designs on
    #: the first and states each verdict on every set (benchmark/study/verdicts.py); ``seeds`` is then their union
    seed_sets: dict = field(default_factory=dict)
    #: what each run's scheduler job asks for (benchmark/run/executors.py, Resources: gpus, processes, cpus, mem_gb,
    #: time_min); a task's own ``resources`` win; unused by the local executor
    resources: dict = field(default_factory=dict)
    #: the tuning design of ``flowzoo tune`` (benchmark/config/tuning_design.py), fixed before any trial
    tuning: dict | None = None
    #: a directory of tuned configurations, DIR/<task>/<algorithm>.yaml: each cell runs at its algorithm's tuned recipe
    tuned: str | None = None
    #: the claim set a study of this suite judges (``flowzoo study``; one registered in benchmark/study/claim_sets/):
    #: it belongs to the suite file, so a renamed copy of the suite keeps its claims; unused by the runs
    claims: str | None = None
    #: the GPUs (one training process each) the suite's recipes were released on: ``flowzoo memory`` estimates each
    #: cell's per-GPU memory at this count unless told otherwise (None: one GPU)
    released_gpus: int | None = None


def suite_names() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))


def load_suite(name_or_path: str) -> Suite:
    path = Path(name_or_path)
    if not path.suffix:
        path = SUITES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown suite {name_or_path!r}; known: {', '.join(suite_names())} (or a path to a YAML file)")
    data = read_yaml(path)
    suite = from_mapping(Suite, data, where=f"suite {path.name}")
    check_label(suite.name, "suite name")  # it names the runs' directory under --runs
    if not isinstance(suite.question, str) or not suite.question.strip().isprintable():
        raise ConfigError(f"suite {path.name}: question {suite.question!r} must be one line of text without newlines or "
                          f"control characters (it is the study page's title)")
    suite.question = suite.question.strip()  # a YAML block scalar's final newline
    if suite.seed_sets:
        union = check_seed_sets(suite.seed_sets, f"suite {path.name}")
        if "seeds" in data and sorted(suite.seeds) != sorted(union):
            raise ConfigError(f"suite {path.name}: seeds {suite.seeds} differ from the union of its seed_sets {union};"
                              " give one or the other")
        suite.seeds = union
    check_unique(suite.seeds, f"suite {path.name}: seeds")
    for task, task_cfg in suite.tasks.items():
        if isinstance(task_cfg, dict) and "seeds" in task_cfg:
            check_unique(task_cfg["seeds"], f"suite {path.name}: tasks.{task}.seeds")
    if suite.tuning is not None:  # tuning seeds disjoint from every seed the suite evaluates on
        read_design(suite.name, suite.tuning, evaluation_seeds(suite))
    for alg in suite.algorithms:
        algorithms.get(alg)
    for task in suite.tasks:
        task_resources(suite, task)  # a bad resource fails at load, before any run or job
    for alg, tasks in suite.only_tasks.items():
        unknown = set(tasks) - set(suite.tasks)
        if unknown:
            raise ConfigError(f"suite {suite.name}: only_tasks.{alg} names unknown tasks {sorted(unknown)}; tasks: {', '.join(suite.tasks)}")
    return suite


def evaluation_seeds(suite: Suite) -> list[int]:
    """Every seed the suite's runs use: its seeds (the union of its seed sets) and every task's own."""
    own = [s for cfg in suite.tasks.values() if isinstance(cfg, dict) for s in cfg.get("seeds", [])]
    return sorted(set(suite.seeds) | set(own))


def task_resources(suite: Suite, task: str, site: dict | None = None) -> Resources:
    """The resources of a run of ``task``: the defaults < ``site`` (a cluster file's) < the suite's < the task's."""
    own = (suite.tasks.get(task) or {}).get("resources")
    return resolve_resources([("cluster file: resources", site), (f"suite {suite.name}: resources", suite.resources),
                              (f"suite {suite.name}: tasks.{task}.resources", own)])


def check_unique(values, where: str) -> None:
    """A grid never holds one run twice: repeated seeds (or names) are refused, naming them."""
    seen, repeated = set(), []
    for value in values:
        if value in seen and value not in repeated:
            repeated.append(value)
        seen.add(value)
    if repeated:
        raise ConfigError(f"{where}: repeated {repeated}; each may appear once")


def check_seed_sets(seed_sets, where: str) -> list[int]:
    """Named seed sets must be non-empty lists of distinct integers, disjoint from each other; returns their union
    in order."""
    if not isinstance(seed_sets, dict):
        raise ConfigError(f"{where}: seed_sets must map names to lists of seeds, got {seed_sets!r}")
    union: list[int] = []
    for name, seeds in seed_sets.items():
        if (not isinstance(seeds, list) or not seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
            raise ConfigError(f"{where}: seed_sets.{name} must be a non-empty list of integers, got {seeds!r}")
        check_unique(seeds, f"{where}: seed_sets.{name}")
        shared = sorted(set(seeds) & set(union))
        if shared:
            raise ConfigError(f"{where}: seed_sets.{name} shares seeds {shared} with another set; sets are disjoint")
        union += seeds
    return union


def _deep_update(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of algorithm keys, got {value!r}")
    return value


@dataclass(frozen=True)
class CellKeys:
    """A suite cell's config before the resolver layers it (benchmark/config/resolve.py): the merged suite
    config without the algorithm blocks, its shared and own algorithm keys, and the own keys no tuning replaces."""

    data: dict  # defaults deep-updated by the task, ``train`` resolved, ``per_algorithm*`` consumed
    shared: dict  # ``defaults.algorithm`` then ``tasks.<task>.algorithm``: under the recipe
    own: dict  # ``defaults.per_algorithm.<alg>`` then ``tasks.<task>.per_algorithm.<alg>``: over the recipe
    pinned: dict  # ``tasks.<task>.per_algorithm.<alg>``: what makes a control what it is; never tuned

    @property
    def model(self) -> str:
        return (self.data.get("model") or {}).get("name", "toy2d")


def cell_keys(suite: Suite, task: str, alg: str) -> CellKeys:
    """The keys of cell (task, alg) of the suite, as every command that runs it starts from them."""
    task_cfg = {k: v for k, v in (suite.tasks[task] or {}).items() if k not in ("algorithms", "seeds", "resources")}
    data = _deep_update(copy.deepcopy(suite.defaults), copy.deepcopy(task_cfg))
    where = f"suite {suite.name}, task {task}"
    shared = _mapping(data.pop("algorithm", None), f"{where}: `algorithm`")
    per_algorithm = _mapping(data.pop("per_algorithm", None), f"{where}: `per_algorithm`")
    for name in per_algorithm:
        algorithms.get(name)  # a misspelt name fails with the list of known ones
    own = _mapping(per_algorithm.get(alg), f"{where}: `per_algorithm.{alg}`")
    if "name" in shared or "name" in own:
        raise ConfigError(f"{where}: the algorithm's name comes from the suite's `algorithms:` list, not from an "
                          f"`algorithm:` or `per_algorithm` block (found name: {shared.get('name', own.get('name'))!r})")
    data["train"] = train_keys(suite.name, task, alg, data)
    pinned = _mapping(((task_cfg.get("per_algorithm") or {}).get(alg)), f"{where}: `per_algorithm.{alg}`")
    return CellKeys(data, shared, own, dict(pinned))


def train_keys(suite_name: str, task: str, alg: str, data: dict) -> dict:
    """The run's train keys: the merged ``train`` block, then ``per_algorithm_train.<alg>`` (consumed from ``data``)."""
    where = f"suite {suite_name}, task {task}"
    per_algorithm = _mapping(data.pop("per_algorithm_train", None), f"{where}: `per_algorithm_train`")
    for name in per_algorithm:
        algorithms.get(name)  # a misspelt name fails with the list of known ones
    own = _mapping(per_algorithm.get(alg), f"{where}: `per_algorithm_train.{alg}`")
    return {**_mapping(data.get("train"), f"{where}: `train`"), **own}


def _grid(suite: Suite):
    """(task, the task's config keys without ``algorithms``/``seeds``/``resources``, algorithm, seed) of every run."""
    for task, task_cfg in suite.tasks.items():
        task_cfg = dict(task_cfg or {})
        # a task may run a subset of the suite's algorithms and its own seeds (e.g. an expensive tier)
        task_algorithms = task_cfg.pop("algorithms", suite.algorithms)
        task_seeds = task_cfg.pop("seeds", suite.seeds)
        task_cfg.pop("resources", None)  # what a run's job asks a scheduler for (benchmark/run/executors.py)
        unknown = set(task_algorithms) - set(suite.algorithms)
        if unknown:
            raise ConfigError(f"suite {suite.name}: task {task!r} names algorithms {sorted(unknown)} that the suite "
                              f"does not run; suite algorithms: {', '.join(suite.algorithms)}")
        for alg in task_algorithms:
            if alg in suite.only_tasks and task not in suite.only_tasks[alg]:
                continue
            for seed in task_seeds:
                yield task, task_cfg, alg, seed


def first_seed_only(suite: Suite) -> Suite:
    """A copy of the suite that runs each task's first seed only (one run per cell): expanding it validates one
    config per cell instead of one per run (the OP-GRPO study: 46 instead of 460)."""
    tasks = {task: ({**cfg, "seeds": list(cfg["seeds"])[:1]} if isinstance(cfg, dict) and "seeds" in cfg else cfg)
             for task, cfg in suite.tasks.items()}
    return dataclasses.replace(suite, seeds=list(suite.seeds)[:1], tasks=tasks, seed_sets={})


def run_dir_of(suite: Suite, runs_dir: Path, task: str, alg: str, seed: int) -> Path:
    """Where bench puts a run: ``RUNS/<suite>/<task>/<algorithm>/s<seed>``."""
    return Path(runs_dir) / suite.name / task / alg / f"s{seed}"


def grid_run_dirs(suite: Suite, runs_dir: Path) -> list[Path]:
    """The run directories of the suite's grid (as selected), without building the configs."""
    return [run_dir_of(suite, runs_dir, task, alg, seed) for task, _, alg, seed in _grid(suite)]


def expand(suite: Suite, runs_dir: Path, overrides: list[str] = (), tuned=None) -> list[ExperimentConfig]:
    """Every run of the suite as a validated config (fails before any work if one is bad).

    ``tuned``: (task, algorithm) -> :class:`TunedValues` or None, the cell's tuned layer (``flowzoo tune`` passes a
    trial's values); default: the suite's ``tuned:`` directory, if it names one."""
    return [config for config, _ in expand_resolved(suite, runs_dir, overrides, tuned)]


def expand_resolved(suite: Suite, runs_dir: Path, overrides: list[str] = (),
                    tuned=None) -> list[tuple[ExperimentConfig, Resolved]]:
    """:func:`expand`, each config with where its algorithm keys came from."""
    noted = tuned is None and bool(suite.tuned)  # runs at the suite's tuned recipes record where it came from
    if noted:
        tuned = lambda task, alg: find_tuned(suite.tuned, task, alg, suite.name)  # noqa: E731
    placed = [o for o in overrides if o.partition("=")[0].strip() == "run_dir"]
    if placed:  # every run of the grid would share that one directory
        raise ConfigError(f"bench override {placed[0]!r}: bench places each run at RUNS/<suite>/<task>/<algorithm>/"
                          f"s<seed>; give another --runs directory instead of run_dir")
    configs, layered = [], 0
    for task, _, alg, seed in _grid(suite):
        keys = cell_keys(suite, task, alg)
        layer: TunedValues | None = tuned(task, alg) if tuned else None
        if layer is not None and seed in layer.seeds:
            raise ConfigError(f"seed {seed}: {layer.source} was chosen on tuning seeds {list(layer.seeds)}; a run at "
                              f"its recipe on one of them is evaluated on the seed that chose it: give other --seeds")
        data = {**keys.data, "task": task, "seed": seed, "run_dir": str(run_dir_of(suite, runs_dir, task, alg, seed))}
        resolved = resolve(data, alg, Layers(keys.shared, keys.own, keys.pinned, layer, tuple(overrides)))
        data = resolved.data
        if noted and layer is not None and "recipe" not in data:
            data["recipe"] = recipe_note(suite.tuned, layer, resolved.tuned_applied, data)
        layered += layer is not None
        configs.append((build_config(data), resolved))
    if noted and configs and not layered:  # asked for tuned recipes, and every run would silently be untuned
        raise ConfigError(f"tuned: {suite.tuned} holds no tuned configuration for any cell of this grid (it looks for "
                          f"{suite.tuned}/<task>/<algorithm>.yaml; `flowzoo tune SUITE --out DIR` writes them to "
                          f"DIR/tuned)")
    return configs


#: how a command names one cell of a suite instead of a config file (``flowzoo train``, ``eval``, ``grad-snr``)
CELL_REF = "SUITE:TASK/ALGORITHM"


def parse_cell_ref(text: str) -> tuple[str, str, str] | None:
    """(suite, task, algorithm) of ``SUITE:TASK/ALGORITHM`` (the suite a name or a YAML path), or None when ``text``
    is no such reference (an existing file or directory never is)."""
    if Path(text).exists() or ":" not in text:
        return None
    suite, _, cell = text.rpartition(":")
    task, slash, alg = cell.partition("/")
    if not suite or not slash or not task or not alg or "/" in alg:
        return None
    return suite, task, alg


def cell_run(ref: str, overrides: list[str] = (), runs_dir: str | Path = "runs") -> tuple[ExperimentConfig, Resolved]:
    """One run of a suite's cell, resolved exactly as ``flowzoo bench`` resolves it (its tuned recipe included),
    at the suite's first seed or ``seed=S``, in ``RUNS/<suite>/<task>/<algorithm>/s<seed>`` or ``run_dir=DIR``."""
    parsed = parse_cell_ref(ref)
    if parsed is None:
        raise ConfigError(f"{ref!r} is no cell reference; give {CELL_REF}, e.g. quick:toy2d_mode/op_grpo")
    suite_ref, task, alg = parsed
    suite = load_suite(suite_ref)
    if task not in suite.tasks:
        raise ConfigError(f"{ref}: suite {suite.name} has no task {task!r}; tasks: {', '.join(suite.tasks)}")
    if (task, alg) not in cells(suite):
        runs = [a for t, a in cells(suite) if t == task]
        raise ConfigError(f"{ref}: suite {suite.name} does not run {alg!r} on {task}; it runs: {', '.join(runs)}")
    keyed = {o.partition("=")[0].strip(): o.partition("=")[2].strip() for o in overrides}
    rest = [o for o in overrides if o.partition("=")[0].strip() not in ("seed", "run_dir")]
    one = select(suite, alg, keyed.get("seed"), task)
    if "seed" not in keyed:
        one = first_seed_only(one)
    ((config, resolved),) = expand_resolved(one, Path(runs_dir), rest)
    if keyed.get("run_dir"):
        config.run_dir = keyed["run_dir"]
    return config, resolved


def config_differences(run_dir: Path, config: ExperimentConfig) -> list[str]:
    """Dotted keys in which the run stored in ``run_dir`` (its config.yaml) differs from ``config`` as a run's
    identity (secrets, ``run_dir`` and the thread count aside); empty when config.yaml is no readable config."""
    from flowzoo.benchmark.config.schema import read_stored_config

    try:
        stored = read_stored_config(Path(run_dir) / "config.yaml")
    except ConfigError:
        return []
    return identity_differences(stored, config)


def identity_differences(stored: dict, config: ExperimentConfig) -> list[str]:
    """Dotted keys in which a stored config (config.yaml's mapping) differs from ``config`` as a run's identity."""
    from flowzoo.benchmark.run.checkpoints import run_identity
    from flowzoo.benchmark.config.schema import declared_secrets, resolved_dict

    secrets = declared_secrets(config)
    return differing_keys(run_identity(stored, secrets), run_identity(resolved_dict(config), secrets))


def describe_differences(run_dir: Path, config: ExperimentConfig) -> str:
    """``differs in train.steps, seed`` (at most 5 keys), or ``its config.yaml is not a readable config``."""
    keys = config_differences(run_dir, config)
    if not keys:
        return "its config.yaml is not a readable config of this run"
    return f"differs in {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"


def cells(suite: Suite) -> list[tuple[str, str]]:
    """(task, algorithm) pairs the suite runs: a task's own ``algorithms`` or the suite's, less ``only_tasks``."""
    return [(task, alg) for task, task_cfg in suite.tasks.items()
            for alg in (task_cfg or {}).get("algorithms", suite.algorithms)
            if task in suite.only_tasks.get(alg, [task])]


def _names(csv: str, option: str, valid, what: str) -> list[str]:
    wanted = [a.strip() for a in csv.split(",") if a.strip()]
    if not wanted:
        raise ConfigError(f"{option}: no {what} named in {csv!r}; valid: {', '.join(valid)}")
    check_unique(wanted, option)
    return wanted


def select(suite: Suite, algorithms_csv: str | None = None, seeds_csv: str | None = None,
           tasks_csv: str | None = None, seed_set: str | None = None) -> Suite:
    """The suite cut to some of its tasks, algorithms and/or seeds (command line ``--tasks t,t@variant
    --algorithms a,b --seeds 0,1 --seed-set replication``).

    ``--tasks`` keeps the named tasks (a control cell ``task@variant`` is a task of its own). A task that lists its
    own algorithms keeps those of the selection (a task left with none is dropped); a selection that leaves no run at
    all is an error. ``--seeds`` (or ``--seed-set NAME``, one of the suite's ``seed_sets``) replaces the suite's
    seeds and every task's own."""
    suite, original = copy.deepcopy(suite), suite
    if tasks_csv is not None:
        wanted = _names(tasks_csv, "--tasks", suite.tasks, "task")
        unknown = [t for t in wanted if t not in suite.tasks]
        if unknown:
            raise ConfigError(f"--tasks: suite {suite.name} has no task {', '.join(unknown)}; tasks: "
                              f"{', '.join(suite.tasks)}")
        suite.tasks = {t: suite.tasks[t] for t in wanted}
    if seed_set is not None:
        if seeds_csv:
            raise ConfigError("--seeds and --seed-set both given; choose one")
        if seed_set not in suite.seed_sets:
            known = ", ".join(suite.seed_sets) or "none (the suite defines no seed_sets)"
            raise ConfigError(f"--seed-set: suite {suite.name} has no seed set {seed_set!r}; sets: {known}")
        seeds_csv = ",".join(str(s) for s in suite.seed_sets[seed_set])
    if algorithms_csv:
        wanted = _names(algorithms_csv, "--algorithms", suite.algorithms, "algorithm")
        foreign = [name for name in wanted if name not in suite.algorithms]
        if foreign:  # a subset of the suite's algorithms: one it does not list has no recipe or cell in it
            raise ConfigError(f"--algorithms: suite {suite.name} does not run {', '.join(foreign)}; its algorithms: "
                              f"{', '.join(suite.algorithms)}")
        suite.algorithms = wanted
        for task, task_cfg in list(suite.tasks.items()):  # a task that lists its algorithms keeps the selected ones
            listed = (task_cfg or {}).get("algorithms")
            if listed is not None:
                if kept := [a for a in listed if a in wanted]:
                    task_cfg["algorithms"] = kept
                else:
                    del suite.tasks[task]
        if not cells(suite):
            runnable = sorted({alg for _, alg in cells(original)})
            raise ConfigError(f"--algorithms {algorithms_csv}: no task of suite {suite.name} runs "
                              f"{'it' if len(wanted) == 1 else 'them'}; its tasks run: {', '.join(runnable)}")
    if seeds_csv:
        try:
            suite.seeds = [int(s) for s in seeds_csv.split(",") if s.strip()]
        except ValueError:
            raise ConfigError(f"--seeds: expected comma-separated integers, got {seeds_csv!r}") from None
        if not suite.seeds:
            raise ConfigError(f"--seeds: no seed in {seeds_csv!r}; give comma-separated integers, e.g. 0,1,2")
        check_unique(suite.seeds, "--seeds")
        for task_cfg in suite.tasks.values():  # the command line's seeds replace a task's own too
            if task_cfg and "seeds" in task_cfg:
                task_cfg["seeds"] = list(suite.seeds)
    return suite


def run_suite(
    suite: Suite, runs_dir: Path, workers: int | None = None, overrides: list[str] = (),
    budget_minutes: float | None = None, executor=None,
) -> list[str]:
    """Run every unfinished run of the suite; returns the failures' messages.

    ``executor``: None runs them here in ``workers`` processes; a :class:`benchmark.run.executors.SubmititGrid` submits
    each as a scheduler job with its task's resources, at most ``workers`` at once (default: no limit on SLURM, the
    number of CPUs for submitit-local). With ``budget_minutes``, no run starts (no job is submitted) after the budget
    is spent; runs left out are listed (and the report says which runs it holds). Runs already started finish, so the
    budget can be overshot by one run's length.
    """
    configs = expand(suite, runs_dir, overrides)
    todo = [c for c in configs if not is_finished(c.resolved_run_dir(), c)]
    for config in todo:  # a run that could not change its evaluated model: refused before any run starts
        check_trains_something(config, config.algorithm_config())
        if executor is None:  # a run here that cannot fit this machine's GPU: refused before any run starts
            fit_run(config, 1)
    from flowzoo.benchmark.run.tracking import check_tracker_environment

    check_tracker_environment(sorted({t for c in todo for t in c.train.trackers}))  # each service probed once
    clashes = [c for c in todo if holds_other_config(c.resolved_run_dir(), c)]
    if clashes:  # refused before any run starts
        first = clashes[0].resolved_run_dir()
        raise ConfigError(f"{len(clashes)} of the suite's run directories hold runs of a different config (first: "
                          f"{first}, {describe_differences(first, clashes[0])}); bench places "
                          f"each run under --runs, so give another --runs DIR, or delete them to start over")
    deadline = time.monotonic() + 60 * budget_minutes if budget_minutes else math.inf
    failures: list[str] = []
    skipped: list[str] = []
    if executor is not None:
        resources = [task_resources(suite, c.task, executor.cluster.resources) for c in todo]
        for config, res in zip(todo, resources):
            config.train.threads = config.train.threads or res.threads  # the job's cores, shared by its processes
        executor.check(resources)  # before the first job
        print(f"suite {suite.name}: {len(configs)} runs, {len(configs) - len(todo)} finished, {len(todo)} to run "
              f"as {executor.kind} jobs into {runs_dir / suite.name} (job files and logs: {executor.folder})")
        workers = max(1, min(workers, len(todo) or 1)) if workers else None
    else:
        workers = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
        if workers > 1:
            for c in todo:
                c.train.threads = c.train.threads or 1
        print(f"suite {suite.name}: {len(configs)} runs, {len(configs) - len(todo)} finished, {len(todo)} to run "
              f"with {workers} worker(s) into {runs_dir / suite.name}")
    bar = tqdm(total=len(todo), desc=f"suite {suite.name}", unit="run")

    def record(run_dir: str, error: str | None) -> None:
        if error:
            failures.append(f"{run_dir}: {error}")
        bar.update(1)

    if executor is not None:
        skipped = executor.run(todo, resources, workers, deadline, record)
    elif workers == 1:
        for config in todo:
            if time.monotonic() > deadline:
                skipped.append(str(config.resolved_run_dir()))
                continue
            record(*run_quietly(config))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            pending = list(todo)
            running = {pool.submit(run_quietly, pending.pop(0)) for _ in range(min(workers, len(pending)))}
            while running:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    record(*future.result())
                    if pending and time.monotonic() <= deadline:
                        running.add(pool.submit(run_quietly, pending.pop(0)))
            skipped = [str(c.resolved_run_dir()) for c in pending]
    bar.close()
    if skipped:
        print(f"time budget of {budget_minutes} min spent: {len(skipped)} run(s) not started; rerun the same "
              f"command to add them:\n  " + "\n  ".join(skipped))
    return failures
