"""flowzoo/named_spec.py: the one parser of "a name or a mapping with a name" values, read by the algorithm block,
``train.prompt_sampler`` and ``train.gold``; each key refuses a bad value in its own one line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flowzoo.algorithms import prompt_samplers
from flowzoo.benchmark.measures import gold
from flowzoo.benchmark.run.loading import build_config
from flowzoo.benchmark.config.resolve import split_algorithm_block
from flowzoo.errors import ConfigError
from flowzoo.named_spec import named_spec, split_spec

ROOT = Path(__file__).resolve().parents[1]


def test_a_name_a_mapping_and_none():
    assert named_spec("dynamic", "never") == {"name": "dynamic"}
    given = {"name": "variance", "floor": 0.1}
    parsed = named_spec(given, "never")
    assert parsed == given and parsed is not given  # a copy: the caller may change it
    assert named_spec(None, "never") is None
    assert split_spec(parsed) == ("variance", {"floor": 0.1})
    for bad in ({"floor": 0.1}, ["dynamic"], 3, {"name": 3}):
        with pytest.raises(ConfigError, match="^the refusal$"):
            named_spec(bad, "the refusal")
    with pytest.raises(ConfigError, match="^the refusal$"):
        named_spec(None, "the refusal", optional=False)
    assert named_spec({"name": 3}, "never", string_name=False) == {"name": 3}  # left to the registry's lookup


def test_each_key_parses_through_it_and_refuses_in_its_own_words():
    assert prompt_samplers.spec_of("dynamic") == {"name": "dynamic"} and prompt_samplers.spec_of(None) is None
    with pytest.raises(ConfigError, match=r"^train.prompt_sampler: give a sampler name .*got \['x'\]; samplers: .*dynamic"):
        prompt_samplers.spec_of(["x"])
    assert gold.spec_of({"name": "toy_w2"}) == {"name": "toy_w2"}
    with pytest.raises(ConfigError, match=r"^train.gold: give a gold measure \(toy_w2\) or a reward name.*got 7$"):
        gold.spec_of(7)
    assert split_algorithm_block(None) == ("flow_grpo", {})
    assert split_algorithm_block({"name": "mix_grpo", "lr": 1e-4}) == ("mix_grpo", {"lr": 1e-4})
    with pytest.raises(ConfigError, match="^suite x: give a name, e.g. `algorithm: flow_grpo`"):
        split_algorithm_block({"lr": 1e-4}, "suite x")
    with pytest.raises(ConfigError, match="^algorithm: give a name, e.g. `algorithm: flow_grpo`"):
        build_config({"algorithm": None})
    with pytest.raises(ConfigError, match="unknown algorithm 3; known: .*flow_grpo"):  # the registry names the known
        build_config({"algorithm": {"name": 3}})


def test_no_other_module_parses_a_bare_name_into_a_mapping():
    """``{"name": value}`` built from a bare name is written once, in named_spec."""
    offenders = []
    for package in ("algorithms", "benchmark", "flowzoo", "models", "rewards"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.If) and isinstance(node.test, ast.Call)
                        and getattr(node.test.func, "id", None) == "isinstance"
                        and getattr(node.test.args[1], "id", None) == "str"
                        and any(isinstance(n, ast.Dict) and [getattr(k, "value", None) for k in n.keys] == ["name"]
                                for stmt in node.body for n in ast.walk(stmt))):
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == ["flowzoo/named_spec.py"], offenders
