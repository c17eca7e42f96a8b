"""``train.eval_batch`` is how an evaluation is chunked, not what it samples: unset, the model chooses (the toy tier:
the whole evaluation in one chunk); any value gives the same scores to float rounding and the same run identity, so
runs made when 64 was everyone's default are found finished."""

from pathlib import Path

import pytest

from flowzoo.benchmark.run.checkpoints import config_digest
from flowzoo.benchmark.run.loading import load_config
from flowzoo.benchmark.run.runner import Runner
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
SMALL = ["model.args.hidden=32", "model.args.pretrain_steps=50", "train.eval_samples_per_prompt=40"]


def test_eval_batch_changes_neither_the_scores_nor_the_identity(tmp_path):
    default = load_config(CONFIG, SMALL + [f"run_dir={tmp_path / 'a'}"])
    assert default.train.eval_batch is None
    runner = Runner(default, progress=False)
    runner.build()
    assert runner.model.default_eval_batch >= 160  # the toy tier: all 4 x 40 samples in one chunk
    whole = runner.evaluate(0)
    runner.config.train.eval_batch = 7  # chunks that split groups of samples
    chunked = runner.evaluate(0)
    assert chunked["eval_reward"] == pytest.approx(whole["eval_reward"], abs=1e-6)
    legacy = load_config(CONFIG, SMALL + [f"run_dir={tmp_path / 'a'}", "train.eval_batch=64"])
    other = load_config(CONFIG, SMALL + [f"run_dir={tmp_path / 'a'}", "train.eval_batch=3"])
    assert config_digest(legacy) == config_digest(default) == config_digest(other)
    changed = load_config(CONFIG, SMALL + [f"run_dir={tmp_path / 'a'}", "train.eval_samples_per_prompt=41"])
    assert config_digest(changed) != config_digest(default)  # what is evaluated still counts


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_bad_eval_batch_is_one_clear_error(bad):
    with pytest.raises(ConfigError, match="train.eval_batch must be a positive integer or null"):
        load_config(CONFIG, [f"train.eval_batch={bad}"])


def test_padded_evaluation_calls_are_not_counted_and_change_no_score(tmp_path):
    """A process with fewer evaluation chunks than another (an uneven shard of a sharded model's evaluation) samples
    one discarded sample per missing chunk (``Algorithm.padding_samples``): those calls run, and neither they nor the
    evaluation's own calls move the run's NFE; the scores are the unpadded ones. (tests/test_fsdp.py runs an uneven
    evaluation on 2 sharded processes against 1 process.)"""
    runner = Runner(load_config(CONFIG, SMALL + [f"run_dir={tmp_path}", "train.eval_batch=7"]), progress=False)
    runner.build()
    model, algorithm = runner.model, runner.algorithm
    counted = []
    velocity = model.velocity

    def counting(*args, **kwargs):
        before = model.nfe
        out = velocity(*args, **kwargs)
        counted.append(model.nfe - before)  # what the call itself counts, before any context restores it
        return out

    model.velocity = counting
    model.nfe = 5
    plain = runner.evaluate(0)
    plain_calls = sum(counted)
    assert plain_calls > 0 and model.nfe == 5
    assert algorithm.padding_samples(3, ["class 0"], [{}], runner.eval_sampler.sigmas, None) == 0  # not sharded
    algorithm.lockstep_padding = lambda calls: 2  # as a sharded process 2 chunks short of another
    counted.clear()
    padded = runner.evaluate(0)
    steps = len(runner.eval_sampler.sigmas) - 1
    assert sum(counted) == plain_calls + 2 * steps * model.cfg_factor(runner.eval_sampler.guidance)  # the padding ran
    assert model.nfe == 5
    assert padded["eval_reward"] == plain["eval_reward"]
    counted.clear()
    assert algorithm.padding_samples(1, ["class 0"], [{}], runner.eval_sampler.sigmas, None) == 2
    assert sum(counted) > 0 and model.nfe == 5  # the helper's own calls, outside an evaluation, are not counted either
