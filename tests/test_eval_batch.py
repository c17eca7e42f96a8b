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
