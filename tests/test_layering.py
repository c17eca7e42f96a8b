"""Dependencies point one way (README, Layout): ``benchmark -> algorithms -> models, rewards -> flowzoo``, and inside
``benchmark`` the command line over ``analysis`` and ``perf`` over ``experiments``; no module imports another that
imports it back, function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algorithms", "models", "rewards", "benchmark", "flowzoo")
#: the modules of `flowzoo tune` (tune.py and the parts it was split into), above the suite loader's design reader
TUNING_ROOM = tuple(f"flowzoo.benchmark.tuning.{m}" for m in ("tune", "cells", "objective", "budget", "storage",
                                                               "studies", "trial_worker", "local_workers", "jobs"))
#: layer -> the layers it must never import (module-name prefixes)
FORBIDDEN = {
    "flowzoo": ("flowzoo.algorithms", "flowzoo.models", "flowzoo.rewards", "flowzoo.benchmark"),
    "flowzoo.models": ("flowzoo.algorithms", "flowzoo.benchmark"),
    "flowzoo.rewards": ("flowzoo.algorithms", "flowzoo.benchmark"),
    "flowzoo.algorithms": ("flowzoo.benchmark",),
    "flowzoo.benchmark": (),  # the command line, the catalog: the top floor
    "flowzoo.__main__": (),  # python -m flowzoo: the command line's entry point
    # the suite loader reads its tuning: section with the tuning room's design reader (which, with the pruner names
    # it checks, imports nothing of experiments); the rest of the room (trials, report) sits above experiments
    "flowzoo.benchmark.experiments": ("flowzoo.benchmark.analysis", "flowzoo.benchmark.perf", "flowzoo.benchmark.cli",
                                      "flowzoo.benchmark.catalog", *TUNING_ROOM, "flowzoo.benchmark.tuning.report"),
    "flowzoo.benchmark.analysis": ("flowzoo.benchmark.perf", "flowzoo.benchmark.cli", "flowzoo.benchmark.catalog",
                                   "flowzoo.benchmark.tuning"),
    "flowzoo.benchmark.tuning.design": ("flowzoo.benchmark.experiments", "flowzoo.benchmark.analysis", *TUNING_ROOM,
                                        "flowzoo.benchmark.tuning.report"),
    "flowzoo.benchmark.tuning.pruners": ("flowzoo.benchmark.experiments", "flowzoo.benchmark.analysis", *TUNING_ROOM,
                                         "flowzoo.benchmark.tuning.design"),
    "flowzoo.benchmark.perf": ("flowzoo.benchmark.analysis", "flowzoo.benchmark.cli", "flowzoo.benchmark.catalog"),
}


def module_name(path: Path) -> str:
    """The import name of a source file: the top-level folders are subpackages of flowzoo (pyproject's package-dir)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "flowzoo" else ("flowzoo", *parts))


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (``from a.b import c`` gives ``a.b`` and, when
    ``a.b.c`` is a module, ``a.b.c``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts]
    modules = {module_name(p): p for p in files}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def layer(name: str) -> str | None:
    return max((key for key in FORBIDDEN if name == key or name.startswith(key + ".")), key=len, default=None)


def test_no_layer_imports_one_above_it():
    bad = []
    for name, deps in graph().items():
        key = layer(name)
        for dep in deps:
            if key and any(dep == f or dep.startswith(f + ".") for f in FORBIDDEN[key]):
                bad.append(f"{name} imports {dep}")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles_between_modules():
    edges = graph()
    # a package's __init__ importing its own modules (the registries) is how they register: not a cycle
    edges = {name: {d for d in deps if not d.startswith(name + ".")} for name, deps in edges.items()}
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]) if dep in path else f"{node} -> {dep}")
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)


def test_the_checks_catch_a_layer_violation_and_a_cycle(monkeypatch):
    import tests.test_layering as this

    fake = {"flowzoo.benchmark.experiments.a": {"flowzoo.benchmark.analysis.b"}, "flowzoo.benchmark.analysis.b": {"flowzoo.benchmark.experiments.a"}}

    monkeypatch.setattr(this, "graph", lambda: fake)
    try:
        this.test_no_layer_imports_one_above_it()
    except AssertionError as error:
        assert "flowzoo.benchmark.experiments.a imports flowzoo.benchmark.analysis.b" in str(error)
    else:
        raise AssertionError("the layer check missed experiments -> analysis")
    try:
        this.test_no_import_cycles_between_modules()
    except AssertionError as error:
        assert "flowzoo.benchmark.analysis.b -> flowzoo.benchmark.experiments.a -> flowzoo.benchmark.analysis.b" in str(error)
    else:
        raise AssertionError("the cycle check missed a two-module cycle")
