"""Dependencies point one way (docs/architecture.md): ``benchmark -> algorithms -> models, rewards -> flowzoo``;
inside ``algorithms`` the methods and prompt samplers over the engine; inside ``benchmark`` its rooms stand on floors
(``FLOORS``) and a room imports only rooms on lower floors; no module imports another that imports it back,
function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algorithms", "models", "rewards", "benchmark", "flowzoo")
#: layer -> the layers it must never import (module-name prefixes)
FORBIDDEN = {
    "flowzoo": ("flowzoo.algorithms", "flowzoo.models", "flowzoo.rewards", "flowzoo.benchmark"),
    "flowzoo.models": ("flowzoo.algorithms", "flowzoo.benchmark"),
    "flowzoo.rewards": ("flowzoo.algorithms", "flowzoo.benchmark"),
    "flowzoo.algorithms": ("flowzoo.benchmark",),
    # the engine names no method: the methods stand on it (it drives the prompt-sampler hook through that registry)
    "flowzoo.algorithms.engine": ("flowzoo.benchmark", "flowzoo.algorithms.methods"),
    "flowzoo.algorithms.prompt_samplers": ("flowzoo.benchmark", "flowzoo.algorithms.methods"),
    "flowzoo.benchmark": (),
    "flowzoo.__main__": (),  # python -m flowzoo: the command line's entry point
}
#: benchmark's rooms and their floors: a room imports only rooms on lower floors (two rooms of one floor know nothing
#: of each other); the package's own modules (cli.py, catalog.py) stand above every room
FLOORS = {
    "prompts": 1,  # a task's prompt sources
    "config": 2, "measures": 2,  # resolving a run's keys; what a run measures beside its reward
    "run": 3,  # building and running runs, suites, executors, the one-run commands
    "analysis": 4,  # statistics over run directories
    "render": 5, "perf": 5,  # pages, tables and figures; timing against the released loops
    "tuning": 6, "study": 6,  # flowzoo tune; studies, claims and their pages
}


def room(name: str) -> str | None:
    """The benchmark room of a module name, or None outside the rooms."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["flowzoo", "benchmark"] and parts[2] in FLOORS else None


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


def test_benchmark_rooms_import_only_lower_floors():
    bad = []
    for name, deps in graph().items():
        here = room(name)
        if name.startswith("flowzoo.benchmark.") and here is None and name.count(".") > 2:
            bad.append(f"{name} lies in no room of FLOORS")
        for dep in deps:
            there = room(dep)
            if here and there and there != here and FLOORS[there] >= FLOORS[here]:
                bad.append(f"{name} (floor {FLOORS[here]}) imports {dep} (floor {FLOORS[there]})")
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

    fake = {"flowzoo.benchmark.run.a": {"flowzoo.benchmark.study.b"}, "flowzoo.benchmark.study.b": {"flowzoo.benchmark.run.a"},
            "flowzoo.algorithms.engine.c": {"flowzoo.algorithms.methods.d"}, "flowzoo.algorithms.methods.d": set()}

    monkeypatch.setattr(this, "graph", lambda: fake)
    try:
        this.test_no_layer_imports_one_above_it()
    except AssertionError as error:
        assert "flowzoo.algorithms.engine.c imports flowzoo.algorithms.methods.d" in str(error)
    else:
        raise AssertionError("the layer check missed engine -> methods")
    try:
        this.test_benchmark_rooms_import_only_lower_floors()
    except AssertionError as error:
        assert "flowzoo.benchmark.run.a (floor 3) imports flowzoo.benchmark.study.b (floor 6)" in str(error)
    else:
        raise AssertionError("the floor check missed run -> study")
    try:
        this.test_no_import_cycles_between_modules()
    except AssertionError as error:
        assert "flowzoo.benchmark.run.a -> flowzoo.benchmark.study.b -> flowzoo.benchmark.run.a" in str(error)
    else:
        raise AssertionError("the cycle check missed a two-module cycle")
