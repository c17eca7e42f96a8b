"""Results as a dataset: every run's configuration and per-step metrics as Parquet shards with a dataset card.

    flowzoo export-results RUNS_OR_REPORT --out DIR

``RUNS_OR_REPORT`` is a runs directory (``runs/op-grpo-study``) or a study page that kept its runs' metrics
(``reports/example-op-grpo-study``, its ``run-metrics/``). ``DIR`` gets ``data/train-NNNNN-of-MMMMM.parquet`` (one row
per run and logged step: ``run``, ``suite``, ``task``, ``algorithm``, ``seed``, ``seed_set``, every metrics.csv column,
and every key of the run's config.yaml as a ``config.<dotted.key>`` column) and ``README.md``, a dataset card naming
the suites, seed sets, runs, code version and package versions. Anyone loads it with::

    import datasets
    table = datasets.load_dataset("parquet", data_dir=DIR, split="train").to_pandas()

A config value that is a list or a mapping, or whose type differs between runs, is stored as its JSON text. The
folder is written all or nothing (a failed export leaves ``DIR`` as it was). ``DIR`` may not be the source, its runs
or a folder above them, nor a folder whose README.md is no dataset card (e.g. a study page) or that holds a Parquet
file no export wrote (``load_dataset`` would read it too): refused before anything is written (:func:`check_out`).
Exporting again into an earlier export's folder replaces its shards: ``data/`` holds this export's only, and the
card's shard and row counts are read from the files written.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd

from flowzoo.benchmark.analysis.runs import find_run_dirs, read_metrics
from flowzoo.benchmark.config.schema import read_stored_config
from flowzoo.errors import ConfigError, FlowZooError
from flowzoo.io import staged_directory

ROWS_PER_SHARD = 100_000
RUN_METRICS = "run-metrics"  # the folder a study page keeps its runs' config.yaml and metrics.csv in
PACKAGES = ("flowzoo", "torch", "diffusers", "transformers", "datasets", "pandas", "numpy", "pyarrow")
KEY_COLUMNS = ("run", "suite", "task", "algorithm", "seed", "seed_set")
CARD_TITLE = "# FlowZoo results:"  # the dataset card's title line: a README.md without it is no earlier export's
SHARD = re.compile(r"train-\d{5}-of-\d{5}\.parquet")  # the name of a shard this module writes
OUTSIDE = "outside the suite's seed sets"  # the card's name for seed_set "" (a seed no set of its suite holds)


def runs_root(source: str | Path) -> Path:
    """The runs directory of ``source``: itself, or a study page's ``run-metrics/``."""
    source = Path(source)
    if (source / RUN_METRICS).is_dir():
        return source / RUN_METRICS
    if not source.is_dir():
        raise ConfigError(f"{str(source)!r} is not a directory of runs or a study page with {RUN_METRICS}/")
    return source


def flatten(mapping: dict, prefix: str = "config") -> dict:
    """``{a: {b: 1}}`` as ``{"config.a.b": 1}``; lists and empty mappings as their JSON text."""
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name))
        elif isinstance(value, (list, tuple, dict)):
            flat[name] = json.dumps(value, sort_keys=True, default=str)
        else:
            flat[name] = value
    return flat


def _seed_sets(suite_name: str) -> dict[int, str]:
    """{seed: set name} of a suite the package knows; empty when it knows none by that name."""
    from flowzoo.benchmark.run.suite import load_suite, suite_names

    if suite_name not in suite_names():
        return {}
    return {seed: name for name, seeds in load_suite(suite_name).seed_sets.items() for seed in seeds}


def suite_of(run_dir: Path, config: dict) -> str:
    """The suite a run belongs to, read from where bench put it (``RUNS/<suite>/<task>/<algorithm>/s<seed>``,
    suite.run_dir_of): the folder above its task's, whether the export's source is the runs directory, a suite's
    folder in it or a study page's run-metrics/; "" for a run outside that layout."""
    path = Path(run_dir).resolve()
    if (path.name == f"s{int(config.get('seed', 0))}" and len(path.parents) > 3
            and path.parents[1].name == str(config.get("task", ""))):
        return path.parents[2].name
    return ""


def run_rows(run_dir: Path, root: Path, seed_sets: dict) -> pd.DataFrame:
    """One run as rows: its key columns, its metrics and its flattened config on every step."""
    config = read_stored_config(run_dir / "config.yaml")
    metrics = read_metrics(run_dir / "metrics.csv")
    metrics = metrics.drop_duplicates("step", keep="last").sort_values("step", kind="stable").reset_index(drop=True)
    relative = run_dir.relative_to(root).as_posix()
    suite = suite_of(run_dir, config)
    algorithm = config.get("algorithm", {})
    seed = int(config.get("seed", 0))
    keys = {"run": relative, "suite": suite, "task": str(config.get("task", "")),
            "algorithm": str(algorithm.get("name", "") if isinstance(algorithm, dict) else algorithm), "seed": seed,
            "seed_set": seed_sets.get(suite, {}).get(seed, "")}
    flat = flatten({k: v for k, v in config.items() if k != "run_dir"})
    frame = pd.concat([pd.DataFrame({k: [v] * len(metrics) for k, v in keys.items()}), metrics,
                       pd.DataFrame({k: [v] * len(metrics) for k, v in flat.items()})], axis=1)
    return frame


def _uniform(column: pd.Series) -> pd.Series:
    """A config column with one Python type (ints and floats count as numbers): else every value as JSON text."""
    kinds = {("number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__)
             for v in column if v is not None and not (isinstance(v, float) and math.isnan(v))}
    if len(kinds) <= 1:
        return column
    return column.map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v))
                      else json.dumps(v, sort_keys=True, default=str))


def results_frame(source: str | Path) -> pd.DataFrame:
    """Every run under ``source`` as one frame (module docstring's columns)."""
    root = runs_root(source)
    run_dirs = find_run_dirs(root)
    if not run_dirs:
        raise ConfigError(f"no runs under {str(root)!r}: expected directories holding config.yaml and metrics.csv")
    suites = {suite_of(d, read_stored_config(d / "config.yaml")) for d in run_dirs}
    seed_sets = {suite: _seed_sets(suite) for suite in suites if suite}
    frame = pd.concat([run_rows(d, root, seed_sets) for d in run_dirs], ignore_index=True, sort=False)
    for name in [c for c in frame.columns if c.startswith("config.")]:
        frame[name] = _uniform(frame[name].astype(object))
    metrics = [c for c in frame.columns if c not in KEY_COLUMNS and not c.startswith("config.")]
    return frame[[*KEY_COLUMNS, *metrics, *sorted(c for c in frame.columns if c.startswith("config."))]]


def _code_version() -> str:
    from flowzoo import __version__

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"flowzoo {__version__}" + (f" (git {commit})" if commit else "")


def _package_versions() -> list[str]:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return found


def dataset_card(frame: pd.DataFrame, source: str | Path, shards: int, rows: int) -> str:
    """README.md of the dataset: what it holds and how to load it (``shards`` and ``rows``: what its data/ holds)."""
    runs = frame.drop_duplicates("run")
    suites = sorted(s for s in runs["suite"].unique() if s)
    sets = runs.groupby("seed_set")["seed"].agg(lambda s: sorted(set(int(x) for x in s))).to_dict()
    metrics = [c for c in frame.columns if c not in KEY_COLUMNS and not c.startswith("config.")]
    cells = runs.groupby(["task", "algorithm"]).size()
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        "    path: data/train-*.parquet",
        "---",
        f"{CARD_TITLE} {', '.join(suites) or Path(source).name}",
        "",
        f"Every run's configuration and per-step metrics, exported by `flowzoo export-results {source}` with "
        f"{_code_version()}: {len(runs)} runs, {rows} rows (one per run and logged step), {shards} Parquet "
        f"shard(s) under `data/`.",
        "",
        "```python",
        "import datasets",
        'table = datasets.load_dataset("parquet", data_dir="<this folder>", split="train").to_pandas()',
        "```",
        "",
        "- Suites: " + (", ".join(f"`{s}`" for s in suites) or "none named (runs outside a suite's folders)"),
        "- Seed sets: " + "; ".join(f"{name or OUTSIDE}: {seeds}" for name, seeds in sets.items()),
        "- Cells (task / algorithm: runs): " + "; ".join(f"{t} / {a}: {n}" for (t, a), n in cells.items()),
        f"- Columns: the keys `{', '.join(KEY_COLUMNS)}`; the metrics `{', '.join(metrics)}`; and every key of a run's "
        f"config.yaml as `config.<key>` ({sum(c.startswith('config.') for c in frame.columns)} columns; a list, a "
        f"mapping or a key whose type differs between runs as JSON text). `eval_reward` is set on evaluation steps "
        f"only. The metrics are described in docs/harness.md of the FlowZoo repository.",
        "- Packages: " + ", ".join(_package_versions()),
    ]
    return "\n".join(lines) + "\n"


def check_out(source: str | Path, out: str | Path) -> None:
    """A one-line ConfigError, before anything is written, for an ``out`` whose README.md and data/ would replace
    what is not an earlier export's: the source itself (a study page's README.md), its runs, a folder above them, or
    a folder whose README.md is no dataset card (another page's)."""
    target = Path(out).resolve()
    for read, what in ((Path(source).resolve(), str(source)), (runs_root(source).resolve(), "its runs")):
        if target == read or target in read.parents:
            where = f"is {what}" if target == read else f"holds {what}"
            raise ConfigError(f"--out {out} {where}: the dataset's README.md and data/ would replace the source's "
                              f"files or go among its runs; give a folder outside {source} (e.g. {source}/dataset)")
    foreign = [p for p in target.rglob("*.parquet") if not (p.parent == target / "data" and SHARD.fullmatch(p.name))]
    if foreign:
        raise ConfigError(f"--out {out} holds {foreign[0]}, no shard of an earlier export: load_dataset would read it "
                          f"with the dataset's; give a new folder or an earlier export's")
    readme = target / "README.md"
    if readme.is_file() and CARD_TITLE not in readme.read_text(errors="replace").split("\n---\n", 1)[-1][:200]:
        raise ConfigError(f"--out {out}: its README.md is no dataset card (written by something else; export-results "
                          f"would replace it); give a new folder or an earlier export's")


def export_results(source: str | Path, out: str | Path, rows_per_shard: int = ROWS_PER_SHARD) -> Path:
    """Write the dataset (module docstring) into ``out``; returns it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_out(source, out)
    frame = results_frame(source)
    shards = max(1, math.ceil(len(frame) / rows_per_shard))
    with staged_directory(out) as stage:
        (stage / "data").mkdir()
        for index in range(shards):
            part = frame.iloc[index * rows_per_shard:(index + 1) * rows_per_shard]
            table = pa.Table.from_pandas(part, preserve_index=False)
            pq.write_table(table, stage / "data" / f"train-{index:05d}-of-{shards:05d}.parquet", compression="zstd",
                           compression_level=9)
        written = sorted(p.name for p in (stage / "data").iterdir())
        rows = sum(pq.read_metadata(stage / "data" / name).num_rows for name in written)
        if rows != len(frame):
            raise FlowZooError(f"export-results: the shards written hold {rows} rows, not the {len(frame)} read")
        (stage / "README.md").write_text(dataset_card(frame, source, len(written), rows))
    for stale in sorted((Path(out) / "data").glob("*.parquet")):  # an earlier export's shards: not this dataset's
        if stale.name not in written:
            stale.unlink()
    return Path(out)
