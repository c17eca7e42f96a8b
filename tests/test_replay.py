"""OP-GRPO replay buffer rules on hand-made rewards (algorithms/engine/replay.py)."""

from __future__ import annotations

import io

import pytest
import torch

from flowzoo.algorithms.engine.replay import ReplayBuffer, ReplayEntry
from flowzoo.algorithms.engine.trajectory import StepPlan


def entry(prompt: str, reward: float, tag: float = 0.0, steps: int = 4) -> ReplayEntry:
    return ReplayEntry(
        prompt=prompt,
        metadata={"tag": tag},
        latents=torch.full((steps + 1, 2), tag),
        log_probs=torch.full((steps,), tag),
        reward=reward,
        version=0,
        plan=StepPlan(torch.linspace(1, 0, steps + 1), torch.ones(steps, dtype=torch.bool),
                      torch.zeros(1, steps, dtype=torch.bool)),
    )


def tags(buf: ReplayBuffer) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for e in buf.entries:
        out.setdefault(e.prompt, []).append(e.metadata["tag"])
    return out


def test_insert_until_full_then_replace_weakest_only_if_better():
    buf = ReplayBuffer(capacity=3, decay=1.0)
    assert [buf.offer(entry(p, r)) for p, r in [("a", 0.5), ("b", 0.2), ("c", 0.9)]] == ["inserted"] * 3
    assert buf.offer(entry("d", 0.1)) == "rejected"  # below the weakest (b: 0.2)
    assert buf.offer(entry("d", 0.2)) == "rejected"  # ties never evict
    assert buf.offer(entry("d", 0.3, tag=1)) == "replaced"  # evicts b, the weakest
    assert sorted(tags(buf)) == ["a", "c", "d"]
    assert len(buf) == 3 and buf.counts == {"inserted": 3, "replaced": 1, "rejected": 2}


def test_uniqueness_compares_with_its_own_prompt_entry_only():
    buf = ReplayBuffer(capacity=3, decay=1.0)
    for p, r in [("a", 0.8), ("b", 0.1), ("c", 0.5)]:
        buf.offer(entry(p, r, tag=0))
    # a worse trajectory of "a" does not evict the weaker entries of other prompts
    assert buf.offer(entry("a", 0.6, tag=1)) == "rejected"
    assert tags(buf) == {"a": [0], "b": [0], "c": [0]}
    # a better one replaces a's entry in place, never adding a second entry for "a"
    assert buf.offer(entry("a", 0.9, tag=2)) == "replaced"
    assert tags(buf) == {"a": [2], "b": [0], "c": [0]}
    # while there is room, a repeated prompt still competes with its own entry
    small = ReplayBuffer(capacity=10, decay=1.0)
    small.offer(entry("a", 0.5))
    assert small.offer(entry("a", 0.4)) == "rejected" and len(small) == 1


def test_without_uniqueness_a_prompt_can_hold_several_entries():
    buf = ReplayBuffer(capacity=3, decay=1.0, unique=False)
    for r, tag in [(0.5, 0), (0.7, 1), (0.6, 2)]:
        assert buf.offer(entry("a", r, tag=tag)) == "inserted"
    assert tags(buf) == {"a": [0, 1, 2]}
    assert [e.metadata["tag"] for e in buf.lookup("a", 2)] == [1, 2]  # best first
    assert buf.offer(entry("b", 0.55, tag=3)) == "replaced"  # evicts the weakest (0.5), same prompt or not
    assert tags(buf) == {"b": [3], "a": [1, 2]}
    assert buf.lookup("zzz", 1) == []


def test_decay_is_multiplicative_and_lowers_negative_scores_too():
    buf = ReplayBuffer(capacity=2, decay=0.5)
    buf.offer(entry("pos", 0.8))
    buf.offer(entry("neg", -0.8))
    for _ in range(3):
        buf.step()
    by_prompt = {e.prompt: e for e in buf.entries}
    assert buf.score(by_prompt["pos"]) == pytest.approx(0.8 * 0.5**3)
    assert buf.score(by_prompt["neg"]) == pytest.approx(-0.8 / 0.5**3)
    assert by_prompt["pos"].reward == 0.8  # the stored reward itself is kept
    assert buf.mean_age() == 3


def test_decay_lets_a_weaker_newcomer_replace_an_old_entry():
    buf = ReplayBuffer(capacity=1, decay=0.9)
    buf.offer(entry("a", 1.0, tag=0))
    newcomer = 0.75
    results = []
    for _ in range(4):  # decayed: 0.9, 0.81, 0.729 -> replaced on the third step
        buf.step()
        results.append(buf.offer(entry("a", newcomer, tag=1)))
    assert results[:3] == ["rejected", "rejected", "replaced"]
    assert results[3] == "replaced"  # the replacement restarted at age 0; one step later 0.675 < 0.75
    assert tags(buf) == {"a": [1]}
    # decay = 1.0: never replaced by anything lower
    frozen = ReplayBuffer(capacity=1, decay=1.0)
    frozen.offer(entry("a", 1.0))
    for _ in range(100):
        frozen.step()
    assert frozen.offer(entry("a", 0.99)) == "rejected"


def test_decayed_weakest_is_chosen_by_decayed_score_not_reward():
    buf = ReplayBuffer(capacity=2, decay=0.5)
    buf.offer(entry("old", 1.0))
    buf.step()
    buf.step()  # old: 0.25
    buf.offer(entry("new", 0.4))  # 0.4 > 0.25: "old" is now the weakest despite its higher reward
    assert buf.offer(entry("x", 0.3)) == "replaced"
    assert sorted(tags(buf)) == ["new", "x"]


def test_non_finite_reward_is_rejected():
    buf = ReplayBuffer(capacity=2)
    assert buf.offer(entry("a", float("nan"))) == "rejected"
    assert len(buf) == 0


def test_nbytes_counts_tensors():
    buf = ReplayBuffer(capacity=4)
    buf.offer(entry("a", 1.0, steps=4))
    # latents 5x2 float32 + log_probs 4 float32 + sigmas 5 float32 + sde 4 bool
    assert buf.nbytes() == 10 * 4 + 4 * 4 + 5 * 4 + 4


def test_state_dict_round_trip_continues_identically():
    buf = ReplayBuffer(capacity=3, decay=0.8)
    for i, (p, r) in enumerate([("a", 0.5), ("b", 0.9), ("c", 0.1), ("a", 0.7)]):
        buf.offer(entry(p, r, tag=i))
        buf.step()
    blob = io.BytesIO()
    torch.save(buf.state_dict(), blob)
    blob.seek(0)
    other = ReplayBuffer(capacity=3, decay=0.8)
    other.load_state_dict(torch.load(blob, weights_only=False))
    assert [(e.prompt, e.reward, e.age, e.serial) for e in other.entries] == [
        (e.prompt, e.reward, e.age, e.serial) for e in buf.entries
    ]
    assert all(torch.equal(x.latents, y.latents) for x, y in zip(buf.entries, other.entries))
    assert other.counts == buf.counts
    for p, r in [("d", 0.3), ("b", 0.6), ("e", 0.05)]:
        assert buf.offer(entry(p, r)) == other.offer(entry(p, r))
        buf.step()
        other.step()
    assert [(e.prompt, e.reward, e.age) for e in other.entries] == [(e.prompt, e.reward, e.age) for e in buf.entries]
    # the state is a copy: mutating the source does not touch a loaded buffer
    state = buf.state_dict()
    buf.entries[0].latents.add_(1)
    assert not torch.equal(state["entries"][0]["latents"], buf.entries[0].latents)


def test_invalid_settings():
    with pytest.raises(ValueError):
        ReplayBuffer(capacity=0)
    with pytest.raises(ValueError):
        ReplayBuffer(capacity=1, decay=0.0)
    with pytest.raises(ValueError):
        ReplayBuffer(capacity=1, decay=1.5)


def test_entries_of_checkpoints_written_before_entries_held_their_plan_load_on_the_same_grid():
    buf = ReplayBuffer(4)
    buf.offer(entry("a", 1.0, steps=4))
    state = buf.state_dict()
    old = dict(state, entries=[])
    for e in state["entries"]:  # the former layout: the grid's fields on the entry itself
        e = dict(e)
        plan = e.pop("plan")
        old["entries"].append({**e, "sigmas": plan["sigmas"], "sde": plan["sde"], "kind": plan["kind"],
                               "noise_level": plan["noise_level"]})
    again, current = ReplayBuffer(4), ReplayBuffer(4)
    again.load_state_dict(old)
    current.load_state_dict(state)
    assert again.entries[0].plan.same_grid(current.entries[0].plan)
    assert again.entries[0].nbytes() == current.entries[0].nbytes() == buf.entries[0].nbytes()
    other = entry("b", 1.0, steps=4).plan
    other.noise_level = 0.3
    assert not again.entries[0].plan.same_grid(other)  # another noise level is another grid
