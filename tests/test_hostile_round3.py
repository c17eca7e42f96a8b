"""The third hostile-input probe (issue 44): each case it found mishandled, reproduced from the command line or at
the function a command calls.

Every case ends in one line on stderr and exit 2, or does the right thing; nothing written is lost or half-written.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from benchmark.cli import main

TINY_ARCH = {"layers": 1, "heads": 1, "head_dim": 8, "text_width": 16, "text_layers": 1, "text_heads": 1}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("flowzoo: error: "), err
    return err


def _tiny_config(path, **sampler) -> str:
    """A two-step tiny-tier run (random small network) with the ``variance`` sampler and ``sampler``'s arguments."""
    config = {
        "task": "round3", "seed": 0,
        "algorithm": {"name": "flow_grpo", "group_size": 2, "num_steps": 2, "kl_beta": 0.0, "lr": 1e-2},
        "model": {"name": "tiny", "args": {"data": "shapes", "weights": None, "arch": TINY_ARCH}},
        "reward": "shapes_geneval", "prompts": {"source": "tiny_shapes"},
        "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 0, "checkpoint_every": 1, "threads": 1,
                  "save_samples": False, "eval_prompts": 2, "eval_samples_per_prompt": 1,
                  "prompt_sampler": {"name": "variance", **sampler}},
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


# ---- 1. a sampler argument is no secret -----------------------------------------------------------------------------
def test_category_key_is_stored_verbatim_is_part_of_the_identity_and_the_run_is_usable(tmp_path, capsys):
    run = tmp_path / "run"
    config = _tiny_config(tmp_path / "c.yaml", category_key="tag")
    assert main(["train", config, f"run_dir={run}", "--quiet"]) == 0
    assert "secret" not in capsys.readouterr().err  # no "literal secret" warning
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert stored["train"]["prompt_sampler"]["category_key"] == "tag"
    # another key is another run: refused as a different config, not "already finished"
    other = _tiny_config(tmp_path / "d.yaml", category_key="prompt")
    assert main(["train", other, f"run_dir={run}", "--quiet"]) == 2
    assert "differs in train.prompt_sampler" in _one_error_line(capsys)
    # eval, export and train RUN/config.yaml work on the run
    assert main(["eval", str(run), "--samples", "1", "--out", str(tmp_path / "eval.json")]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "lora")]) == 0
    assert (tmp_path / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert main(["train", str(run / "config.yaml"), f"run_dir={tmp_path / 'again'}", "--quiet"]) == 0


# ---- 2. variance with floor 0 on a sparse reward --------------------------------------------------------------------
@pytest.mark.parametrize("category_key", [None, "tag"])
def test_variance_floor_0_draws_every_prompt_with_spread_then_the_rest_uniformly(category_key):
    """CGPO's pure rule (floor 0) on a sparse reward: 1 of 12 prompts had spread, 4 are needed per step. The draw was
    numpy's "Fewer non-zero entries in p than size"; now that prompt is always drawn, the others uniformly."""
    from algorithms.prompt_samplers.base import GroupOutcome
    from algorithms.prompt_samplers.variance import VariancePrioritised

    pool = [(f"p{i}", {"tag": "even" if i % 2 == 0 else "odd"}) for i in range(12)]
    config = VariancePrioritised.Config(floor=0.0, category_key=category_key)
    sampler = VariancePrioritised(pool, 4, seed=0, config=config)
    sampler.observe([GroupOutcome(index=i, prompt=pool[i][0], rewards=torch.tensor([1.0, 0.0] if i == 4 else [0.0, 0.0]))
                     for i in range(12)])
    drawn = [sampler.draw(step, step - 1).indices for step in range(1, 200)]
    assert all(len(set(d)) == 4 and 4 in d for d in drawn)
    others = np.bincount([i for d in drawn for i in d if i != 4], minlength=12)
    assert others[4] == 0 and (others[np.arange(12) != 4] > 10).all()  # every other prompt is reached
