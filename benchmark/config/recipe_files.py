"""Reading ``benchmark/recipes``: the one reader of an algorithm's recipe file and of a prompt sampler's file.

``benchmark/recipes/<algorithm>.yaml`` holds the algorithm's recipe (:mod:`benchmark.config.recipes`) and
its search space for ``flowzoo tune`` (:mod:`benchmark.config.search_space`);
``benchmark/recipes/samplers/<sampler>.yaml`` holds a prompt sampler's search space. The recipe maps a *scope*
to algorithm keys: ``default`` (every run), a model name (``sd3``, ``wan``, ``toy2d``, ``tiny``) or a task name
(``sd3_pickscore``); the ``search_space:`` section maps the same scopes to knobs. Every value is written one per
line with its source as a trailing comment (the released file and line, or ``ours: why``)::

    inherits: flow_grpo   # optional: start from another algorithm's recipe files
    sd3:
      kl_beta: 0.04   # yifan123/flow_grpo config/grpo.py:106 (general_ocr_sd3: train.beta)
    search_space:
      default:
        lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}  # ours: two decades around the released 3e-4

:func:`read_recipe_file` reads a file once: its YAML (the shape checked: ``inherits`` names an algorithm, each
scope is a mapping), its header comment, and the source comment of every line of both sections in one pass.
:func:`recipe_values` and :func:`space_values` pair each value with its source, refusing a value without one, a
line that is not ``knob: value  # source`` and (in a recipe) a knob the algorithm lacks.

An algorithm reads the files of its registered classes, base first, each preceded by the files it ``inherits``
(MixGRPO-Flash: mix_grpo.yaml, then mix_grpo_flash.yaml; OP-GRPO: flow_grpo.yaml, then op_grpo.yaml), each file
once (:func:`read_class_files`). A named preset's own keys (:func:`own_preset`, e.g. an ablation's) win over its
bases' files, and are never tuned (:func:`preset_keys`). :func:`merge_scopes` merges a chain's scopes, file by file,
default < model < task, for the recipe and the search space alike.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from flowzoo import algorithms
from flowzoo.benchmark.config.schema import read_yaml
from flowzoo.errors import ConfigError

RECIPES_DIR = Path(__file__).absolute().parents[1] / "recipes"  # not resolved: a linked copy of the tree is its own
SAMPLERS_DIR = RECIPES_DIR / "samplers"
INHERITS = "inherits"
#: the file's search space for ``flowzoo tune``, not a recipe scope
SEARCH_SPACE = "search_space"

# `scope:` (a recipe scope at the top level, a search-space scope indented once), `default: {}` included
_SCOPE_LINE = re.compile(r"^(?P<indent> *)(?P<scope>[A-Za-z0-9_.@\-]+):\s*(?:\{\s*\})?\s*(?:#.*)?$")
# `knob: value  # source` (a recipe knob indented once, a search-space knob twice)
_KNOB_LINE = re.compile(r"^(?P<indent> *)(?P<knob>[A-Za-z0-9_]+):(?P<value>.*?)(?:\s+#\s*(?P<source>.*))?$")
_RECIPE_KNOB_INDENT, _SPACE_SCOPE_INDENT, _SPACE_KNOB_INDENT = "  ", "  ", "    "


@dataclass(frozen=True)
class SourcedValue:
    """One value of a recipe file (a recipe key's value, or a search-space knob's spec) with its source."""

    file: str  # the file's stem: the algorithm's (or sampler's) name
    scope: str  # default, a model name or a task name
    knob: str
    value: Any
    source: str


@dataclass(frozen=True)
class RecipeLine:
    """A line of a recipe scope as written: the knob it sets, or None where it is not ``  knob: value  # source``."""

    number: int
    text: str
    scope: str | None  # None: before any scope
    knob: str | None
    source: str  # "" when the line names none


@dataclass(frozen=True)
class RecipeFile:
    """A recipe file, read once."""

    path: Path
    inherits: str | None  # the algorithm whose recipe files this one starts from
    recipe: dict[str, dict[str, Any]]  # {scope: {algorithm key: value}}
    space: dict[str, dict[str, Any]]  # the search_space section: {scope: {knob: spec}}
    recipe_lines: tuple[RecipeLine, ...]  # every line of the recipe scopes, in order
    space_sources: dict[tuple[str, str], str]  # {(scope, knob): the source on its line}
    header: str  # the comment block at the top, as one paragraph


# ---------------------------------------------------------------------------------------------------- one file

def read_recipe_file(path: Path) -> RecipeFile:
    """``path`` read once: its YAML, its header and every line's source comment."""
    table = read_yaml(path)
    space = _space_section(path, table.pop(SEARCH_SPACE, None))
    inherits = _inherited_algorithm(path, table.pop(INHERITS, None))
    recipe = _recipe_scopes(path, table)
    lines = path.read_text().splitlines()
    comments = _SourceComments()
    for number, text in enumerate(lines, 1):
        comments.read(number, text)
    return RecipeFile(path, inherits, recipe, space, tuple(comments.recipe_lines), comments.space_sources,
                           _header(lines))


def _inherited_algorithm(path: Path, base: Any) -> str | None:
    if base is not None and (not isinstance(base, str) or base not in algorithms.names()):
        raise ConfigError(f"{path.name}: inherits {base!r} is not an algorithm; known: {', '.join(algorithms.names())}")
    return base


def _recipe_scopes(path: Path, table: dict) -> dict[str, dict[str, Any]]:
    for scope, keys in table.items():
        if not isinstance(keys, dict) and keys is not None:
            raise ConfigError(f"{path.name}: scope {scope!r} must be a mapping of algorithm keys, got {keys!r}")
    return {scope: dict(keys or {}) for scope, keys in table.items()}


def _space_section(path: Path, section: Any) -> dict[str, dict[str, Any]]:
    if section is None:
        return {}
    if not isinstance(section, dict) or not all(isinstance(knobs, dict) for knobs in section.values()):
        raise ConfigError(f"{path.name}: {SEARCH_SPACE} must map scopes (default, a model, a task) to knobs")
    return section


def _header(lines: list[str]) -> str:
    """The comment block at the top of a file, as one paragraph."""
    return " ".join(line.lstrip("#").strip() for line in itertools.takewhile(lambda line: line.startswith("#"), lines))


def _indented(pattern: re.Pattern, text: str, indent: str) -> re.Match | None:
    """``pattern``'s match of ``text`` when the line is indented exactly ``indent``."""
    match = pattern.match(text)
    return match if match and match["indent"] == indent else None


class _SourceComments:
    """The one pass over a file's lines: each recipe line as written, and each search-space knob's source."""

    def __init__(self) -> None:
        self.recipe_lines: list[RecipeLine] = []
        self.space_sources: dict[tuple[str, str], str] = {}
        self._in_space = False
        self._scope: str | None = None

    def read(self, number: int, text: str) -> None:
        if not text.strip() or text.lstrip().startswith("#"):
            return
        if not text.startswith(" "):
            self._top_level(number, text)
        elif self._in_space:
            self._space_line(text)
        else:
            knob = _indented(_KNOB_LINE, text, _RECIPE_KNOB_INDENT)
            self._recipe_line(number, text, knob and knob["knob"], knob and knob["source"])

    def _top_level(self, number: int, text: str) -> None:
        self._in_space, self._scope = text.startswith(f"{SEARCH_SPACE}:"), None
        if self._in_space or text.startswith(f"{INHERITS}:"):
            return
        scope = _indented(_SCOPE_LINE, text, "")
        if scope:
            self._scope = scope["scope"]
        else:
            self._recipe_line(number, text, None, None)

    def _recipe_line(self, number: int, text: str, knob: str | None, source: str | None) -> None:
        self.recipe_lines.append(RecipeLine(number, text, self._scope, knob, (source or "").strip()))

    def _space_line(self, text: str) -> None:
        if scope := _indented(_SCOPE_LINE, text, _SPACE_SCOPE_INDENT):
            self._scope = scope["scope"]
        elif (knob := _indented(_KNOB_LINE, text, _SPACE_KNOB_INDENT)) and self._scope is not None:
            self.space_sources[(self._scope, knob["knob"])] = (knob["source"] or "").strip()


# ------------------------------------------------------------------------------------------ values with sources

def recipe_values(file: RecipeFile) -> list[SourcedValue]:
    """Every recipe value of an algorithm's file with its source; fails on a value without a source, a line that is
    not ``  knob: value  # source`` or a knob the algorithm lacks."""
    name = file.path.stem
    config_fields = {f.name for f in dataclasses.fields(algorithms.get(name).Config)}
    values = [_recipe_value(file, line, config_fields) for line in file.recipe_lines]
    read = {(value.scope, value.knob) for value in values}
    unread = [f"{scope}.{key}" for scope, keys in file.recipe.items() for key in keys if (scope, key) not in read]
    if unread:
        raise ConfigError(f"{file.path.name}: write one knob per line with its source; not read that way: "
                          f"{', '.join(unread)}")
    return values


def _recipe_value(file: RecipeFile, line: RecipeLine, config_fields: set[str]) -> SourcedValue:
    where, name = f"{file.path.name}:{line.number}", file.path.stem
    if line.knob is None or line.scope is None:
        raise ConfigError(f"{where}: expected `scope:` or `  knob: value  # source`, got {line.text!r}")
    if not line.source:
        raise ConfigError(f"{where}: {line.scope}.{line.knob} has no source; add `# <released file:line>` or "
                          f"`# ours: <why>`")
    if line.knob not in config_fields:
        raise ConfigError(f"{where}: unknown {name} knob {line.knob!r}; valid: {', '.join(sorted(config_fields))}")
    return SourcedValue(name, line.scope, line.knob, file.recipe[line.scope][line.knob], line.source)


def space_values(file: RecipeFile) -> list[SourcedValue]:
    """Every knob of the file's search space (its spec as written) with its source; fails on a knob without one."""
    return [SourcedValue(file.path.stem, scope, knob, spec, _space_source(file, scope, knob))
            for scope, knobs in file.space.items() for knob, spec in knobs.items()]


def _space_source(file: RecipeFile, scope: str, knob: str) -> str:
    source = file.space_sources.get((scope, knob))
    if not source:
        raise ConfigError(f"{file.path.name}: {SEARCH_SPACE}.{scope}.{knob} has no source; write the knob on one "
                          f"line ending in `# <released file:line>` or `# ours: <why>`")
    return source


# ------------------------------------------------------------------------------------------ an algorithm's files

def recipe_path(name: str) -> Path:
    """The recipe file of the algorithm registered as ``name`` (which may not exist)."""
    return RECIPES_DIR / f"{name}.yaml"


def sampler_path(sampler: str) -> Path:
    """The prompt sampler's file (which may not exist)."""
    return SAMPLERS_DIR / f"{sampler}.yaml"


def default_space_path() -> Path:
    """The default search space: read for an algorithm none of whose files declares a ``search_space:`` section."""
    return RECIPES_DIR / "defaults" / "search_space.yaml"


def algorithm_classes(algorithm: str) -> list[type]:
    """The algorithm's classes with a registry name, from the most basic to itself."""
    cls = algorithms.get(algorithm)
    return [c for c in reversed(cls.__mro__) if isinstance(getattr(c, "name", None), str) and c.name != "base"]


def own_preset(cls: type) -> dict[str, Any]:
    """The preset keys ``cls`` adds or changes relative to its parent class."""
    if "preset" not in vars(cls):
        return {}
    parent = getattr(cls.__mro__[1], "preset", {})
    return {k: v for k, v in cls.preset.items() if k not in parent or parent[k] != v}


def preset_keys(algorithm: str) -> set[str]:
    """Keys the algorithm's presets fix (relative to the classes they are presets of): its identity, never tuned."""
    return {key for cls in algorithm_classes(algorithm) for key in own_preset(cls)}


def read_file_chain(name: str, seen: tuple[str, ...] = ()) -> list[RecipeFile]:
    """``<name>.yaml`` preceded by the files it inherits, base first; none when there is no such file."""
    path = recipe_path(name)
    if not path.is_file():
        return []
    if name in seen:
        raise ConfigError(f"{path.name}: `inherits` goes round in a circle: {' -> '.join((*seen, name))}")
    file = read_recipe_file(path)
    return [*(read_file_chain(file.inherits, (*seen, name)) if file.inherits else []), file]


def read_class_files(algorithm: str) -> list[tuple[type, list[RecipeFile]]]:
    """Each of the algorithm's registered classes (base first) with the files it reads that no earlier class read."""
    read: set[Path] = set()
    by_class = []
    for cls in algorithm_classes(algorithm):
        files = [file for file in read_file_chain(cls.name) if file.path not in read]
        read.update(file.path for file in files)
        by_class.append((cls, files))
    return by_class


def read_algorithm_files(algorithm: str) -> list[RecipeFile]:
    """The files the algorithm reads, base first, each once."""
    return [file for _, files in read_class_files(algorithm) for file in files]


def algorithm_paths(algorithm: str) -> list[Path]:
    """The paths of the files the algorithm reads, base first."""
    return [file.path for file in read_algorithm_files(algorithm)]


def merge_scopes(tables: Iterable[dict[str, dict]], model: str | None, task: str | None) -> dict[str, Any]:
    """One mapping from files' ``{scope: {key: value}}`` tables: file by file (base first), default < model < task
    in each (no model or task: that scope is left out)."""
    merged: dict[str, Any] = {}
    for scopes in tables:
        for scope in ("default", model, task):
            if scope:
                merged.update(scopes.get(scope, {}))
    return merged
