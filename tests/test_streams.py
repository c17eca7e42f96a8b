"""Every stream key lives in flowzoo/streams.py, and no two purposes share a stream."""

import torch

from flowzoo.algorithms.engine.plans import iteration_generator
from flowzoo.algorithms.engine.rollout import sample_generators
from flowzoo import streams


def test_keys_of_each_stream_family_are_distinct():
    for family in (streams.ITERATION_PURPOSES, streams.SEQUENCE_TAGS, streams.SEED_OFFSETS):
        values = list(family.values())
        assert len(set(values)) == len(values), family


def test_purpose_keys_lie_above_every_group_offset():
    assert min(streams.ITERATION_PURPOSES.values()) >= streams.GROUP_OFFSET_LIMIT


def test_every_key_is_in_a_checked_family():
    keys = {name for name, value in vars(streams).items() if name.isupper() and isinstance(value, int)}
    checked = {*streams.ITERATION_PURPOSES, *streams.SEQUENCE_TAGS, *streams.SEED_OFFSETS}
    assert keys - {"GROUP_OFFSET_LIMIT", "GRAD_SNR_STEP_OFFSET"} == checked


def test_purposes_and_fresh_samples_draw_different_numbers():
    draws = [torch.rand(4, generator=iteration_generator(0, 3, key)) for key in streams.ITERATION_PURPOSES.values()]
    draws += [torch.rand(4, generator=g) for g in sample_generators(0, 3, 0, count=2)]  # group 0's first two samples
    for i in range(len(draws)):
        for j in range(i):
            assert not torch.equal(draws[i], draws[j])
