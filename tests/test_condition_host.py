"""Condition.host: per-row values kept on the host follow the rows through index, repeat, cat and to (models/base.py)."""

from __future__ import annotations

import torch

from flowzoo.models.base import Condition


def _cond(lengths, start=0):
    n = len(lengths)
    return Condition({"e": torch.arange(start, start + n, dtype=torch.float32)[:, None]}, {"length": tuple(lengths)})


def test_host_values_follow_their_rows():
    cond = _cond([3, 7, 5])
    assert cond.index([2, 0]).host == {"length": (5, 3)}
    assert cond.index(torch.tensor([1])).host == {"length": (7,)}
    assert cond.index(slice(1, None)).host == {"length": (7, 5)}
    assert cond.index(torch.tensor([True, False, True])).host == {"length": (3, 5)}
    assert cond.repeat_interleave(2).host == {"length": (3, 3, 7, 7, 5, 5)}
    assert cond.to("cpu").host == cond.host and cond.to("cpu").host is not cond.host
    joined = Condition.cat([cond, _cond([1], start=3)])
    assert joined.host == {"length": (3, 7, 5, 1)} and joined.tensors["e"].flatten().tolist() == [0, 1, 2, 3]
    # every selection keeps each row's value beside its tensor row
    picked = joined.index([3, 1])
    assert picked.tensors["e"].flatten().tolist() == [3.0, 1.0] and picked.host == {"length": (1, 7)}


def test_a_value_not_every_part_has_is_dropped_and_none_is_the_default():
    joined = Condition.cat([_cond([3]), Condition({"e": torch.zeros(1, 1)})])
    assert joined.host == {}
    assert Condition({"e": torch.zeros(2, 1)}).index([1]).host == {}


def test_stack_builds_a_condition_from_per_prompt_rows():
    rows = [({"e": torch.tensor([1.0])}, {"length": 4}), ({"e": torch.tensor([2.0])}, {"length": 9})]
    cond = Condition.stack(rows)
    assert cond.tensors["e"].tolist() == [[1.0], [2.0]] and cond.host == {"length": (4, 9)}
    assert Condition.stack([({"e": torch.tensor([1.0])}, {})]).host == {}
