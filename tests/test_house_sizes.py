"""The house's size rules (docs/architecture.md): no module over 600 lines and no function over 80 lines in the
project's code (tests excepted), so a reader finds one thing per file and one step per function."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algorithms", "models", "rewards", "benchmark", "flowzoo")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def oversized(path: Path) -> list[str]:
    """What of ``path`` breaks a size rule, one line each."""
    text = path.read_text()
    name = path.relative_to(ROOT).as_posix()
    found = []
    lines = text.count("\n")
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_no_module_or_function_over_its_size():
    found = [line for path in sources() for line in oversized(path)]
    assert not found, "split these into pieces named for what they hold:\n" + "\n".join(found)


def test_the_rule_sees_a_long_function_and_a_long_module(tmp_path, monkeypatch):
    import tests.test_house_sizes as this

    monkeypatch.setattr(this, "ROOT", tmp_path)
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long = tmp_path / "long.py"
    long.write_text(f"def f():\n{body}\n" + "\n" * MAX_MODULE_LINES)
    assert oversized(long) == [f"long.py: {MAX_FUNCTION_LINES + 2 + MAX_MODULE_LINES - 1} lines (at most "
                               f"{MAX_MODULE_LINES})", f"long.py:1 f: {MAX_FUNCTION_LINES + 1} lines (at most "
                               f"{MAX_FUNCTION_LINES})"]
