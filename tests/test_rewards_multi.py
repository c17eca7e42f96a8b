"""MultiReward and rewards.build: weighted sums, logged components, clear errors."""

import pytest
import torch

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.rewards.base import Reward, RewardOutput


class Constant(Reward):
    name = "constant"
    accepts = ("points",)

    def __init__(self, value):
        self.value = value

    def score(self, samples, prompts, metadata):
        return RewardOutput(torch.full((samples.shape[0],), float(self.value)), {"half": torch.full((samples.shape[0],), self.value / 2)})


def test_weighted_sum_and_components():
    multi = rewards.MultiReward({"a": Constant(2.0), "b": Constant(-1.0)}, {"a": 0.5, "b": 3.0})
    out = multi(torch.zeros(3, 2), ["p"] * 3)
    torch.testing.assert_close(out.score, torch.full((3,), 0.5 * 2.0 + 3.0 * -1.0))
    assert set(out.components) == {"a", "b", "a/half", "b/half"}
    torch.testing.assert_close(out.components["b"], torch.full((3,), -1.0))
    torch.testing.assert_close(out.components["a/half"], torch.full((3,), 1.0))


def test_build_from_config_spec(toy_prompts):
    prompts, meta = toy_prompts
    x = torch.tensor([m["mode_target"] for m in meta])  # exactly on each class's target mode
    single = rewards.build("toy_mode")
    torch.testing.assert_close(single(x, prompts, meta).score, torch.ones(len(prompts)))
    combo = rewards.build({"toy_mode": 1.0, "toy_target": 2.0}, {"toy_mode": {"scale": 0.25}})
    out = combo(x, prompts, meta)
    torch.testing.assert_close(out.score, out.components["toy_mode"] + 2.0 * out.components["toy_target"])
    assert combo.rewards["toy_mode"].scale == 0.25


@pytest.mark.parametrize(
    "spec,args,match",
    [
        ("toy_mood", None, "unknown reward 'toy_mood'; known: "),
        ({"toy_mode": "high"}, None, "reward weight of 'toy_mode' must be a number"),
        ("toy_mode", {"ocr": {}}, "reward_args names \\['ocr'\\]"),
        ("toy_mode", {"toy_mode": {"width": 1}}, "reward 'toy_mode': bad arguments"),
    ],
)
def test_bad_specs_are_config_errors(spec, args, match):
    with pytest.raises(ConfigError, match=match):
        rewards.build(spec, args)


def test_non_finite_scores_are_refused():
    with pytest.raises(ValueError, match="reward 'constant' returned non-finite scores"):
        Constant(float("nan"))(torch.zeros(2, 2), ["p", "q"])
