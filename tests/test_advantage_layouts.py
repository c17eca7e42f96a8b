"""Group-relative advantages on the layouts OP-GRPO produces, against values worked out by hand: groups that are not
contiguous (replayed rows sit at the end of the batch), groups of unequal size (a dropped replayed sample leaves
G - 1, a singleton is possible), and a near-constant group where eps dominates the std."""

from __future__ import annotations

import math

import pytest
import torch

from flowzoo.algorithms.engine.advantages import group_advantages

EPS = 1e-4
# interleaved and unequal: group 0 = {1, 2, 3} (mean 2), group 1 = {5, 7} (mean 6)
REWARDS = torch.tensor([1.0, 5.0, 2.0, 7.0, 3.0])
GROUPS = torch.tensor([0, 1, 0, 1, 0])


def test_interleaved_unequal_groups_population_std():
    s0, s1 = math.sqrt(2 / 3), 1.0  # population stds of {1, 2, 3} and {5, 7}
    a0, a1 = 1 / (s0 + EPS), 1 / (s1 + EPS)
    expected = torch.tensor([-a0, -a1, 0.0, a1, a0])
    torch.testing.assert_close(group_advantages(REWARDS, GROUPS, "group", eps=EPS, clip=100.0), expected)


def test_interleaved_unequal_groups_sample_std():
    s0, s1 = 1.0, math.sqrt(2)  # sample (n - 1) stds of {1, 2, 3} and {5, 7}
    a0, a1 = 1 / (s0 + 1e-8), 1 / (s1 + 1e-8)
    expected = torch.tensor([-a0, -a1, 0.0, a1, a0])
    got = group_advantages(REWARDS, GROUPS, "group", eps=1e-8, clip=100.0, unbiased=True)
    torch.testing.assert_close(got, expected)


def test_interleaved_groups_batch_std():
    std = math.sqrt(23.2 / 5)  # population std of all five rewards (mean 3.6; squared deviations sum to 23.2)
    expected = torch.tensor([-1.0, -1.0, 0.0, 1.0, 1.0]) / (std + EPS)  # deviations from the *group* means
    torch.testing.assert_close(group_advantages(REWARDS, GROUPS, "batch", eps=EPS, clip=100.0), expected)


def test_singleton_group_left_by_a_dropped_sample_gets_zero():
    rewards, groups = torch.tensor([0.3, 0.9, 0.4]), torch.tensor([5, 9, 5])
    for unbiased in (False, True):
        adv = group_advantages(rewards, groups, "group", eps=EPS, clip=100.0, unbiased=unbiased)
        assert adv[1].item() == 0.0
        std = 0.05 if not unbiased else 0.05 * math.sqrt(2)
        torch.testing.assert_close(adv[[0, 2]], torch.tensor([-0.05, 0.05]) / (std + EPS), rtol=1e-5, atol=1e-6)


def test_near_constant_group_is_damped_by_eps():
    d = 2.0**-22  # exactly representable offsets around 0.25
    rewards = torch.tensor([0.25, 0.25 + 4 * d, 0.25, 0.25])  # mean 0.25 + d
    deviations = torch.tensor([-d, 3 * d, -d, -d], dtype=torch.float64)
    std = math.sqrt(3) * d  # population std: sqrt((3 d^2 + 9 d^2) / 4)
    adv = group_advantages(rewards, torch.zeros(4, dtype=torch.long), "group", eps=EPS, clip=5.0)
    torch.testing.assert_close(adv.double(), deviations / (std + EPS), rtol=1e-5, atol=0.0)
    assert adv.abs().max() < 1e-2  # not blown up to O(1) by normalising a 4e-7 spread


def test_op_grpo_layout_with_a_dropped_replayed_sample():
    """Fresh G - 1 = 3 per group, then the replayed samples of groups 0 and 2 (group 1's was dropped): the advantages
    are those of each group's members wherever they sit, and permuting the rows permutes the advantages."""
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 2])
    rewards = torch.tensor([0.1, 0.4, 0.3, 0.9, 0.2, 0.7, 0.5, 0.5, 0.8, 0.6, 0.2])
    expected = torch.empty(len(rewards), dtype=torch.float64)
    for gid in range(3):
        members = (groups == gid).nonzero().flatten()
        r = rewards[members].double()
        mean = r.sum() / len(r)
        std = math.sqrt(float(((r - mean) ** 2).sum()) / len(r))
        expected[members] = (r - mean) / (std + EPS)
    adv = group_advantages(rewards, groups, "group", eps=EPS, clip=5.0)
    torch.testing.assert_close(adv.double(), expected, rtol=1e-5, atol=1e-6)
    # group 0 = {0.1, 0.4, 0.3, 0.6}: mean 0.35, population std sqrt(0.0325); its replayed row (0.6) by hand
    assert adv[9].item() == pytest.approx(0.25 / (math.sqrt(0.0325) + EPS), rel=1e-5)
    perm = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(group_advantages(rewards[perm], groups[perm], "group", eps=EPS, clip=5.0), adv[perm])
