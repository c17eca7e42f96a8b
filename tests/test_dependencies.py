"""pyproject.toml declares exactly the third-party packages the code imports."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algorithms", "models", "rewards", "benchmark", "flowzoo")
#: declared for what they do without an import: the pytest plugins behind the ``benchmark`` fixture and ``-n``
PLUGINS = {"pytest-benchmark", "pytest-xdist"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported(folders, optional: set[str] = frozenset()) -> set[str]:
    """Distribution names of the third-party top-level modules imported under ``folders``. A module of an optional
    extra (``optional``: its distribution names) counts when it is not installed here (the extra's tests skip)."""
    local = set(PACKAGES) | {"tests"}
    dists = {k: [d.lower().replace("_", "-") for d in v] for k, v in packages_distributions().items()}
    found = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    tops = [alias.name.split(".")[0] for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    tops = [node.module.split(".")[0]]
                else:
                    continue
                for top in tops:
                    if top not in local and top not in sys.stdlib_module_names:
                        if top not in dists and _name(top) in optional:
                            found.add(_name(top))
                            continue
                        assert top in dists, f"{path.relative_to(ROOT)} imports {top!r}, which no installed package provides"
                        # a module several distributions provide (mlflow, mlflow-skinny): the declared one
                        declared = [d for d in dists[top] if d in optional]
                        found.update(declared[:1] or dists[top][:1])
    return found


def test_every_import_is_declared_and_every_dependency_imported():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    test_extra = {_name(r) for r in project["optional-dependencies"]["test"]}
    extras = {name: {_name(r) for r in requirements}
              for name, requirements in project["optional-dependencies"].items() if name != "test"}
    optional = set().union(*extras.values())
    code = _imported(PACKAGES, optional)
    assert code - runtime - optional == set(), "imported but not in [project] dependencies or an optional extra"
    assert runtime - code == set(), "declared but imported nowhere"
    tests = _imported(["tests"], optional)
    assert tests - runtime - test_extra - optional == set(), "imported by the tests but not declared"
    assert test_extra - tests - PLUGINS == set(), "test extra imported nowhere"
    for name, packages in extras.items():
        assert packages - code - tests == set(), f"optional extra {name!r} declares packages imported nowhere"
