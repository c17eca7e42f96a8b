"""benchmark/measures/diversity.py on samples with a known answer: a collapsed policy has no spread, the base's own
samples a ratio of 1, Gaussian samples the closed-form mean distance, a toy mode's samples a spread of 1."""

from __future__ import annotations

import math

import pytest
import torch

from flowzoo.benchmark.measures.diversity import (
    feature_spread,
    mean_cosine_distance,
    mean_pairwise_distance,
    per_prompt_spread,
    spread_ratio,
    toy_spread,
)


def _gaussian(n: int, dim: int, std: float, seed: int) -> torch.Tensor:
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * std


def test_a_collapsed_policy_has_no_spread_and_the_base_a_ratio_of_one():
    collapsed = torch.full((16, 3, 4, 4), 0.5)
    assert mean_pairwise_distance(collapsed) == 0.0
    base = [mean_pairwise_distance(_gaussian(16, 48, 0.2, s)) for s in range(4)]
    assert spread_ratio(base, base) == pytest.approx(1.0)
    assert spread_ratio([0.0] * 4, base) == 0.0
    assert math.isnan(spread_ratio([1.0], [0.0]))  # a base without spread: no ratio


@pytest.mark.parametrize("dim", [2, 64])
def test_gaussian_samples_give_the_closed_form_distance(dim):
    std = 0.3
    chi_mean = math.sqrt(2) * math.exp(math.lgamma((dim + 1) / 2) - math.lgamma(dim / 2))  # E[chi_d]
    expected = math.sqrt(2) * std * chi_mean / math.sqrt(dim)
    assert mean_pairwise_distance(_gaussian(2000, dim, std, 0)) == pytest.approx(expected, rel=0.02)
    if dim == 2:
        assert expected == pytest.approx(std * math.sqrt(math.pi) / math.sqrt(2))


def test_the_spread_is_per_prompt_in_the_evaluations_order():
    first, second = torch.zeros(4, 2), _gaussian(4, 2, 1.0, 1).float()
    spreads = per_prompt_spread(torch.cat([first, second]), 4)
    assert spreads[0] == 0.0 and spreads[1] == pytest.approx(mean_pairwise_distance(second))
    with pytest.raises(ValueError, match="do not split into prompts"):
        per_prompt_spread(torch.zeros(5, 2), 2)
    with pytest.raises(ValueError, match="at least 2 samples"):
        mean_pairwise_distance(torch.zeros(1, 2))


def test_toy_spread_is_one_for_the_true_mode_and_zero_collapsed():
    mode_std = 0.075  # the separable layout's mode (models/toy2d.py)
    mode = torch.tensor([4.0, 0.0]) + _gaussian(5000, 2, mode_std, 2)
    assert toy_spread(mode, mode_std) == pytest.approx(1.0, rel=0.05)
    assert toy_spread(torch.tensor([[4.0, 0.0]] * 8), mode_std) == 0.0
    assert toy_spread(torch.tensor([4.0, 0.0]) + _gaussian(5000, 2, 2 * mode_std, 3), mode_std) == pytest.approx(
        4.0, rel=0.05)
    with pytest.raises(ValueError, match="toy_spread takes"):
        toy_spread(torch.zeros(4, 3), mode_std)


def test_every_evaluation_logs_the_spread_of_each_prompts_samples(tmp_path):
    """The runner's evaluation: eval_spread is the mean over prompts of their samples' mean pairwise distance, the
    same samples the reward reads; absent with one sample per prompt."""
    from pathlib import Path

    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.run.runner import Runner

    config = Path(__file__).resolve().parents[1] / "benchmark" / "configs" / "toy_flow_grpo.yaml"
    small = ["model.args.hidden=32", "model.args.pretrain_steps=50", "train.save_samples=false"]
    runner = Runner(load_config(config, small + [f"run_dir={tmp_path / 'a'}", "train.eval_samples_per_prompt=8"]),
                    progress=False)
    runner.build()
    seen = []
    original = runner._score_samples

    def keep(prompts, metadata, sampler):
        scores, outputs, samples = original(prompts, metadata, sampler)
        seen.append(torch.cat(samples))
        return scores, outputs, samples

    runner._score_samples = keep
    result = runner.evaluate(0)
    assert result["eval_spread"] == pytest.approx(sum(per_prompt_spread(seen[0], 8)) / len(runner.eval_prompts))
    assert result["eval_spread"] > 0
    one = Runner(load_config(config, small + [f"run_dir={tmp_path / 'b'}", "train.eval_samples_per_prompt=1"]),
                 progress=False)
    one.build()
    assert "eval_spread" not in one.evaluate(0)


def test_the_cosine_spread_of_embeddings_has_its_known_values():
    same = torch.ones(5, 8)
    assert mean_cosine_distance(same) == pytest.approx(0.0, abs=1e-12)
    assert mean_cosine_distance(torch.eye(4) * 3.0) == pytest.approx(1.0)  # orthogonal, any norm
    assert mean_cosine_distance(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(2.0)
    assert feature_spread(torch.cat([same[:2], torch.eye(8)[:2]]), 2) == pytest.approx(0.5)  # prompt by prompt
    with pytest.raises(ValueError, match="at least 2"):
        mean_cosine_distance(same[:1])


def test_the_runner_logs_the_spread_of_clip_embeddings_of_its_images(tmp_path):
    """train.spread_features: each prompt's CLIP image embeddings (a tiny random CLIPModel here), their mean cosine
    distance averaged over prompts, from the same samples the reward reads; refused where it cannot be read."""
    from pathlib import Path

    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.run.runner import Runner
    from flowzoo.errors import ConfigError
    from tests.test_rewards_clip import write_tiny_clip

    clip = write_tiny_clip(tmp_path / "clip")
    root = Path(__file__).resolve().parents[1] / "benchmark" / "configs"
    tiny = ["train.eval_prompts=2", "train.eval_samples_per_prompt=3", "train.eval_num_steps=2",
            "train.save_samples=false", f"train.spread_features={clip}", f"run_dir={tmp_path / 'run'}"]
    runner = Runner(load_config(root / "tiny_flow_grpo.yaml", tiny), progress=False)
    runner.build()
    seen = []
    original = runner._score_samples

    def keep(prompts, metadata, sampler):
        scores, outputs, samples = original(prompts, metadata, sampler)
        seen.append(torch.cat(samples))
        return scores, outputs, samples

    runner._score_samples = keep
    result = runner.evaluate(0)
    expected = feature_spread(runner.features.embed(seen[0]), 3)
    assert result["eval_spread_features"] == pytest.approx(expected) and 0 < expected < 2
    for extra, message in (("train.eval_samples_per_prompt=1", "eval_samples_per_prompt must be >= 2"),):
        with pytest.raises(ConfigError, match=message):
            load_config(root / "tiny_flow_grpo.yaml", [*tiny, extra])
    with pytest.raises(ConfigError, match="embeds images; model 'toy2d' makes points"):
        load_config(root / "toy_flow_grpo.yaml", [f"train.spread_features={clip}"])
