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
