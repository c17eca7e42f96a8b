"""Per-algorithm recipes: ``benchmark/hyperparams/<algorithm>.yaml``, each value with its source.

A recipe file maps a *scope* to algorithm keys: ``default`` (every run), a model name (``sd3``, ``wan``, ``toy2d``,
``tiny``) or a task name (``sd3_pickscore``); the most specific scope wins (task > model > default). Every value is
written one per line with its source as a trailing comment (the released file and line, or ``ours: why``)::

    sd3:
      kl_beta: 0.04   # yifan123/flow_grpo config/grpo.py:106 (general_ocr_sd3: train.beta)

An algorithm reads the recipe files of its base classes, then its own (MixGRPO-Flash: mix_grpo.yaml, then
mix_grpo_flash.yaml); a file may also start from another algorithm's recipe with a top-level
``inherits: <algorithm>`` (op_grpo.yaml: ``inherits: flow_grpo``). A later file overrides an earlier one. A named
preset (``register_preset``, e.g. an ablation) re-asserts its own keys over its bases' recipe files, so
``op_grpo_no_truncation`` keeps ``t_off: null`` wherever op_grpo.yaml sets ``t_off``.

Where a recipe sits among the other layers of a suite run is :func:`benchmark.experiments.suite.expand`'s business (docs/recipes.md).
``recipe_table()`` renders docs/recipes.md; ``flowzoo recipes --out docs/recipes.md`` writes it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import algorithms
import models
from benchmark.experiments.config import read_yaml
from flowzoo.errors import ConfigError

RECIPES_DIR = Path(__file__).resolve().parents[1] / "hyperparams"
INHERITS = "inherits"
#: the file's search space for ``flowzoo tune`` (benchmark/experiments/search_space.py), not a recipe scope
SEARCH_SPACE = "search_space"

_SCOPE_LINE = re.compile(r"^([A-Za-z0-9_.\-]+):\s*(\{\s*\})?\s*(#.*)?$")
_KNOB_LINE = re.compile(r"^  ([A-Za-z0-9_]+):(.*?)(?:\s+#\s*(.*))?$")


@dataclass(frozen=True)
class RecipeValue:
    """One line of a recipe file."""

    file: str  # the file's algorithm name (its stem)
    scope: str  # default, a model name or a task name
    knob: str
    value: Any
    source: str



def _chain(algorithm: str) -> list[type]:
    """The algorithm's classes from the most basic to itself (those with a registry name)."""
    cls = algorithms.get(algorithm)
    return [c for c in reversed(cls.__mro__) if isinstance(getattr(c, "name", None), str) and c.name != "base"]


def algorithm_classes(algorithm: str) -> list[type]:
    """The algorithm's registered classes, base first (public for search_space.py)."""
    return _chain(algorithm)


def own_preset(cls: type) -> dict[str, Any]:
    """The preset keys ``cls`` adds or changes relative to its parent class (public for search_space.py)."""
    return _own_preset(cls)


def _own_preset(cls: type) -> dict[str, Any]:
    """The preset keys ``cls`` adds or changes relative to its parent class."""
    if "preset" not in vars(cls):
        return {}
    parent = getattr(cls.__mro__[1], "preset", {})
    return {k: v for k, v in cls.preset.items() if k not in parent or parent[k] != v}


def _table(path: Path) -> tuple[str | None, dict[str, dict]]:
    """A recipe file as (the algorithm it inherits, {scope: algorithm keys})."""
    table = read_yaml(path)
    table.pop(SEARCH_SPACE, None)
    base = table.pop(INHERITS, None)
    if base is not None and (not isinstance(base, str) or base not in algorithms.names()):
        raise ConfigError(f"{path.name}: inherits {base!r} is not an algorithm; known: {', '.join(algorithms.names())}")
    for scope, keys in table.items():
        if not isinstance(keys, dict) and keys is not None:
            raise ConfigError(f"{path.name}: scope {scope!r} must be a mapping of algorithm keys, got {keys!r}")
    return base, {scope: dict(keys or {}) for scope, keys in table.items()}


def _files(name: str, seen: tuple[str, ...] = ()) -> list[Path]:
    """``<name>.yaml`` preceded by the files it inherits, base first."""
    path = RECIPES_DIR / f"{name}.yaml"
    if not path.is_file():
        return []
    if name in seen:
        raise ConfigError(f"{path.name}: `inherits` goes round in a circle: {' -> '.join((*seen, name))}")
    base, _ = _table(path)
    return [*(_files(base, (*seen, name)) if base else []), path]


def recipe_files(algorithm: str) -> list[Path]:
    """The recipe files the algorithm reads, base first."""
    return list(dict.fromkeys(p for cls in _chain(algorithm) for p in _files(cls.name)))


def recipe(algorithm: str, task: str, model: str) -> dict[str, Any]:
    """The algorithm's recipe keys for a task on a model: file by file (base first), default < model < task."""
    merged: dict[str, Any] = {}
    done: set[Path] = set()
    for cls in _chain(algorithm):
        for key, value in _own_preset(cls).items():
            if key in merged:  # a base file set it: the preset's identity wins over its bases' recipes
                merged[key] = value
        for path in _files(cls.name):
            if path in done:
                continue
            done.add(path)
            scopes = _table(path)[1]
            for scope in ("default", model, task):
                merged.update(scopes.get(scope, {}))
    return merged


def read_recipe_file(path: Path) -> list[RecipeValue]:
    """Every value of a recipe file with its source; fails on a value without a source or a knob the algorithm lacks."""
    scopes = _table(path)[1]
    name = path.stem
    config_fields = {f.name for f in dataclasses.fields(algorithms.get(name).Config)}
    rows: list[RecipeValue] = []
    scope = None
    in_space = False  # inside the search_space section (read by search_space.py)
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#") or line.startswith(f"{INHERITS}:"):
            continue
        if not line.startswith(" "):
            in_space = line.startswith(f"{SEARCH_SPACE}:")
        if in_space:
            continue
        top = _SCOPE_LINE.match(line)
        if top:
            scope = top.group(1)
            continue
        knob = _KNOB_LINE.match(line)
        if not knob or scope is None:
            raise ConfigError(f"{path.name}:{number}: expected `scope:` or `  knob: value  # source`, got {line!r}")
        key, source = knob.group(1), (knob.group(3) or "").strip()
        if not source:
            raise ConfigError(f"{path.name}:{number}: {scope}.{key} has no source; add `# <released file:line>` or "
                              f"`# ours: <why>`")
        if key not in config_fields:
            raise ConfigError(f"{path.name}:{number}: unknown {name} knob {key!r}; valid: {', '.join(sorted(config_fields))}")
        rows.append(RecipeValue(name, scope, key, scopes[scope][key], source))
    counted = {(r.scope, r.knob) for r in rows}
    missing = [f"{s}.{k}" for s, keys in scopes.items() for k in keys if (s, k) not in counted]
    if missing:
        raise ConfigError(f"{path.name}: write one knob per line with its source; not read that way: {', '.join(missing)}")
    return rows


def _header(path: Path) -> str:
    """The comment block at the top of a recipe file, as one paragraph."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def _scope_label(scope: str) -> str:
    if scope == "default":
        return "every run"
    return f"model {scope}" if scope in models.names() else f"task {scope}"


def _cell(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("...").strip().replace("|", "/")


#: the index of the released files the recipes cite (tests/test_recipe_citations.py checks every citation against it)
RELEASED_FILES = RECIPES_DIR.parent / "released_files.yaml"


def _released_files() -> list[str]:
    """The revisions the citations point into: one row per released file read."""
    files = yaml.safe_load(RELEASED_FILES.read_text())["files"]
    lines = ["", "Released files the sources cite, at the revision each was read (`benchmark/released_files.yaml`; "
             "`tests/test_recipe_citations.py` checks every `file:line` above against it):", "",
             "| repository | file | commit | lines |", "|---|---|---|---|"]
    for f in files:
        count = "not counted (cited without lines)" if f["lines"] is None else str(f["lines"])
        if f.get("partial"):
            count += f" (read: {f['partial']})"
        lines.append(f"| {f['repo']} | `{f['path']}` | {f['commit'][:7]} | {count} |")
    return lines


def recipe_table() -> str:
    """docs/recipes.md: every recipe value and preset key, by algorithm, with its source."""
    files = sorted(RECIPES_DIR.glob("*.yaml"))
    lines = [
        "# Recipes",
        "",
        "Generated by `flowzoo recipes --out docs/recipes.md` from `benchmark/hyperparams/*.yaml` and the registered",
        "presets; `tests/test_recipes.py` fails when this file is stale. Edit the YAML files, not this one.",
        "",
        "Precedence of a suite run's algorithm keys, lowest first: the algorithm class's defaults (with its preset) <",
        "the suite's shared `algorithm:` block (`defaults.algorithm`, then `tasks.<task>.algorithm`) < the algorithm's",
        "recipe below (default < model < task; a later file over an earlier one; a preset's own keys over its bases'",
        "files) < the suite's per-algorithm block (`defaults.per_algorithm.<algorithm>`, then",
        "`tasks.<task>.per_algorithm.<algorithm>`) < `key=value` on the command line.",
        "",
        "Files each algorithm with a recipe file or a preset of its own reads, in order (any other algorithm reads",
        "those of the registered class it subclasses, or none: so a new algorithm without a file leaves this page",
        "as it is):",
        "",
    ]
    for name in algorithms.names():
        cls = algorithms.get(name)
        if not _files(cls.name) and "preset" not in vars(cls):
            continue
        chain = [p.name for p in recipe_files(name)]
        lines.append(f"- `{name}`: {', '.join(chain) or 'none (class defaults)'}")
    lines += ["", "Sources: each file's header names the released code and the short file names its rows use.", ""]
    lines += [f"- `{path.name}`: {_header(path)}" for path in files]
    lines += _released_files()
    lines += ["", "| algorithm | applies to | knob | value | source |", "|---|---|---|---|---|"]
    for path in files:
        for row in read_recipe_file(path):
            lines.append(f"| {row.file} | {_scope_label(row.scope)} | `{row.knob}` | {_cell(row.value)} | "
                         f"{row.source.replace('|', '/')} |")
    for name in algorithms.names():
        cls = algorithms.get(name)
        doc = (cls.__doc__ or "").strip().splitlines()[0] if "preset" in vars(cls) else ""
        for key, value in sorted(_own_preset(cls).items()):
            lines.append(f"| {name} | preset | `{key}` | {_cell(value)} | {doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
