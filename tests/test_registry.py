"""flowzoo/registry.py: a registered model or reward class gets its name from @register, stated once."""

from __future__ import annotations

import pytest

from flowzoo import models
from flowzoo import rewards
from flowzoo.registry import Registry


def test_every_registered_model_and_reward_is_named_by_its_registration():
    for registry in (models, rewards):
        for name in registry.names():
            cls = registry.get(name)
            assert cls.name == name
            assert "name" in vars(cls)  # set on the class itself by the decorator, not inherited


def test_a_class_declaring_another_name_is_refused():
    registry = Registry("widget")

    with pytest.raises(ValueError, match="widget class .*Bad is registered as 'good' but declares name 'bad'"):
        @registry.register_class("good")
        class Bad:
            name = "bad"

    @registry.register_class("plain")
    class Plain:
        """Declares no name: the decorator gives it one."""

    assert Plain.name == "plain" and registry.get("plain") is Plain


def test_every_registry_discovers_its_modules_by_one_helper():
    """algorithms, models, rewards, prompt samplers and claim sets each import every module of their folder through
    ``flowzoo.registry.discover``: none keeps a hand-written import list, so a new file needs no other edit."""
    import ast
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for init in ("algorithms", "models", "rewards", "algorithms/prompt_samplers", "benchmark/study/claim_sets"):
        path = root / init / "__init__.py"
        tree = ast.parse(path.read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and getattr(node.func, "id", None) == "discover"]
        assert len(calls) == 1, f"{path.relative_to(root)} does not call discover(__name__, __path__) once"
        own = f"flowzoo.{init.replace('/', '.')}"
        listed = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                  and node.module == own]  # `from flowzoo.rewards import toy`: a hand-written list
        assert not listed, f"{path.relative_to(root)} imports its own modules by hand"
    import flowzoo.rewards.base as base
    for name in rewards.names():  # a reward class lives in a module of the package, imported by the package
        assert rewards.get(name).__module__ in sys.modules and issubclass(rewards.get(name), base.Reward)


def test_discover_imports_a_new_module_of_a_package(tmp_path, monkeypatch):
    """A file dropped into a package's folder is imported (and so registers itself) with no other edit."""
    from flowzoo.registry import discover

    package = tmp_path / "zoo_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from flowzoo.registry import Registry, discover\n"
        "REGISTRY = Registry('animal')\n"
        "register = REGISTRY.register_class\n"
        "discover(__name__, __path__)\n")
    (package / "b_owl.py").write_text("from zoo_pkg import register\n@register('owl')\nclass Owl: pass\n")
    (package / "a_cat.py").write_text("from zoo_pkg import register\n@register('cat')\nclass Cat: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys

    try:
        zoo = importlib.import_module("zoo_pkg")
        assert zoo.REGISTRY.names() == ["cat", "owl"] and zoo.REGISTRY.get("owl").name == "owl"
        assert discover("zoo_pkg", zoo.__path__) == ["a_cat", "b_owl"]  # name order; importing twice is harmless
    finally:
        for name in [n for n in sys.modules if n == "zoo_pkg" or n.startswith("zoo_pkg.")]:
            sys.modules.pop(name)
