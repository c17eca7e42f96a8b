"""FSDP2 sharding (models/sharding.py) of the tiny tier's full fine-tuning on 2 CPU processes (gloo).

One sharded run, stopped after its step-2 checkpoint and resumed (first leg asked by ``model.args.fsdp``, the resume by
accelerate's FSDP environment), gives the metrics and the final weights and AdamW moments of an uninterrupted
1-process run to float rounding; each process holds about half of the transformer's weights and moments
(``sharding.json``, measured from the local shards); the sharded checkpoint resumes in one process too, and exports the
full transformer. The ranks are forked from this process (their imports are already done: a 2-process launch through
``accelerate launch`` costs ~20 s of imports on the CI's 2 cores; tests/test_distributed.py covers that launcher).
"""

import json
import multiprocessing
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from flowzoo.algorithms.engine.base import FSDP_PADDING
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.loading import load_config
from flowzoo.benchmark.run.runner import TIMING_COLUMNS, Runner
from flowzoo.errors import ConfigError, RunError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "tiny_flow_grpo.yaml"
#: the smallest tiny-tier run that exercises every sharded path: full fine-tuning of a random 2-block transformer with a
#: KL to its (sharded) reference copy; 2 minibatches of the 8 samples in chunks of 1 (a rank holding fewer samples of a
#: minibatch than the other makes padding calls); 3 evaluation samples one per chunk (ranks sample 1 and 2: padded); a
#: dense reward
ARGS = ["model.args.weights=null",
        "model.args.arch={layers: 2, heads: 2, head_dim: 8, text_width: 16, text_layers: 1, text_heads: 2}",
        "model.args.finetune=full", "reward=jpeg_compressibility", "algorithm.num_steps=3",
        "algorithm.timestep_fraction=0.67", "algorithm.group_size=4", "algorithm.minibatches=2",
        "algorithm.micro_batch=1",
        "algorithm.reuse_rollout_graph=auto", "algorithm.kl_beta=0.04", "algorithm.lr=1e-3", "train.steps=3",
        "train.prompts_per_step=2", "train.eval_every=2", "train.eval_prompts=3", "train.eval_batch=1",
        "train.eval_num_steps=2", "train.checkpoint_every=2", "train.save_samples=false", "train.threads=1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, args: list[str], env: dict[str, str], stop_at: int | None, config: Path) -> None:
    """One process of the run (forked): the launcher's environment, then ``flowzoo train`` (which ends the process)."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
                       "FLOWZOO_CHECK_LOCKSTEP": "1", **env})  # every sharded test checks the lockstep contract
    if stop_at is not None:  # the run is stopped when step ``stop_at`` begins (after the checkpoint before it)
        from flowzoo.algorithms.engine.base import Algorithm

        train_step = Algorithm.train_step

        def stopping(self, step):
            if step == stop_at:
                raise RunError(f"stopped at step {step}")  # a user error: one line, no traceback
            return train_step(self, step)

        Algorithm.train_step = stopping
    os._exit(main(["train", str(config), *args, "--quiet"]))


def _two_processes(args: list[str], env: dict[str, str] | None = None, stop_at: int | None = None,
                   config: Path = CONFIG) -> list[int]:
    """The exit codes of a 2-process ``flowzoo train CONFIG ARGS`` whose ranks are forked from this process."""
    context = multiprocessing.get_context("fork")
    port = _free_port()
    ranks = [context.Process(target=_rank, args=(r, port, args, env or {}, stop_at, config)) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=240)
    for p in ranks:
        if p.is_alive():  # a rank waiting in a collective its peer never joined: fail, do not hang the suite
            p.kill()
            p.join()
    return [p.exitcode for p in ranks]


def _metrics(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "metrics.csv")
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])


JPEG_BYTE = 1e-3
REWARD_COLUMNS = {"eval_reward", "reward_mean", "reward_std"}


def _assert_same_metrics(one: pd.DataFrame, other: pd.DataFrame, what: str) -> None:
    other = other.drop(columns=[FSDP_PADDING], errors="ignore")  # logged by sharded steps only
    assert list(one.columns) == list(other.columns) and len(one) == len(other) == 4, what
    for column in one.columns:
        # the reward is a JPEG's size in kB of an image quantised to uint8: float rounding that flips one pixel level
        # moves a sample's reward by a byte (1e-3), which no other column amplifies
        atol = JPEG_BYTE if column in REWARD_COLUMNS else 1e-6
        np.testing.assert_allclose(other[column].to_numpy(float), one[column].to_numpy(float), rtol=1e-5, atol=atol,
                                   equal_nan=True, err_msg=f"{what}: {column}")


def _checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)["algorithm"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_sharded_full_fine_tuning_equals_one_process_and_resumes_on_any_world_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one, two, moved = tmp_path / "one", tmp_path / "two", tmp_path / "moved"
    assert main(["train", str(CONFIG), *ARGS, f"run_dir={one}", "--quiet"]) == 0
    reference = _metrics(one)
    assert reference["reward_std"].iloc[1:].gt(0).all() and reference["grad_norm"].iloc[1:].gt(0).all()

    # sharded, stopped when step 3 begins: the step-2 checkpoint (gathered from both ranks) is what is left
    assert _two_processes([*ARGS, "model.args.fsdp=true", f"run_dir={two}"], stop_at=3) == [2, 2]
    assert not (two / "done.json").exists() and _checkpoint(two)["iteration"] == 2
    shutil.copytree(two, moved)
    # resumed sharded: FSDP asked by accelerate's environment (distributed_type: FSDP), no model arg
    assert _two_processes([*ARGS, f"run_dir={two}"], env={"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}) == [0, 0]
    # and the sharded checkpoint resumed by one process (the checkpoint is a full state dict)
    assert main(["train", str(CONFIG), *ARGS, "model.args.fsdp=false", f"run_dir={moved}", "--quiet"]) == 0
    sharded_metrics = _metrics(two)
    _assert_same_metrics(reference, sharded_metrics, "sharded, stopped and resumed sharded")
    assert sharded_metrics[FSDP_PADDING].iloc[1:].gt(0).any()  # the update's lockstep padding ran (and changed nothing)
    _assert_same_metrics(reference, _metrics(moved), "sharded, resumed in one process")

    # the sharded run's checkpoint is the single-process one: same keys and shapes, same values to float rounding
    full, sharded = _checkpoint(one), _checkpoint(two)
    assert full["model"].keys() == sharded["model"].keys() and len(full["model"]) > 30
    moved_by_training = 0
    for name, weight in full["model"].items():
        assert type(sharded["model"][name]) is torch.Tensor and sharded["model"][name].shape == weight.shape
        # Adam divides by sqrt(v): gradients equal to float rounding move weights equally to ~1e-6 (lr 1e-3, 3 steps)
        torch.testing.assert_close(sharded["model"][name], weight, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    for index, moments in full["optimizer"]["state"].items():
        other = sharded["optimizer"]["state"][index]
        assert other.keys() == moments.keys() and float(other["step"]) == float(moments["step"]) == 6  # 3 steps x 2 minibatches
        for key in ("exp_avg", "exp_avg_sq"):
            assert type(other[key]) is torch.Tensor and other[key].shape == moments[key].shape
            scale = float(moments[key].abs().max())  # float rounding relative to the tensor's magnitude
            torch.testing.assert_close(other[key], moments[key], rtol=1e-4, atol=1e-5 * scale,
                                       msg=lambda m, index=index, key=key: f"{index} {key}: {m}")
        moved_by_training += int(moments["exp_avg"].abs().sum() > 0)
    assert moved_by_training > 30  # the update reached every block

    # each process holds about half of the sharded weights and of their AdamW moments, measured from its shards
    record = json.loads((two / "sharding.json").read_text())
    assert record["world_size"] == 2 and record["block_lists"] == ["transformer_blocks"] and record["step"] == 3
    totals = record["totals"]
    assert totals["optimizer_state"] == 2 * totals["trainable_parameters"]  # Adam's two moments per weight
    assert totals["sharded_module_parameters"] == 2 * totals["trainable_parameters"]  # + the frozen reference copy
    for key, total in totals.items():
        held = [r[key] for r in record["ranks"]]
        assert sum(held) == total, key
        assert all(0.45 <= h / total <= 0.55 for h in held), (key, held, total)

    # flowzoo export writes the full transformer of the sharded run, which diffusers loads as trained
    from diffusers import SD3Transformer2DModel

    capsys.readouterr()
    assert main(["export", str(two), "--out", str(tmp_path / "export")]) == 0
    assert capsys.readouterr().out.strip() == f"transformer written to {tmp_path / 'export'}"
    exported = SD3Transformer2DModel.from_pretrained(tmp_path / "export" / "transformer").state_dict()
    assert set(sharded["model"]) <= set(exported)  # every weight (the export holds buffers too)
    for name, weight in sharded["model"].items():
        assert torch.equal(exported[name], weight), name


def _config(tmp_path, *extra):
    return load_config(CONFIG, [*ARGS, f"run_dir={tmp_path / 'run'}", *extra])


def test_sharding_asked_where_it_cannot_run_fails_in_one_line(tmp_path, monkeypatch):
    toy = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(toy, ["model.args.fsdp=true"])
    assert "\n" not in str(err.value) and "'toy2d' has no transformer blocks" in str(err.value)
    assert "shardable models: " in str(err.value) and "tiny" in str(err.value) and "sd3" in str(err.value)
    with pytest.raises(ConfigError, match=r"model.args.fsdp must be true or false, got 'sometimes'"):
        _config(tmp_path, "model.args.fsdp=sometimes")
    with pytest.raises(ConfigError, match=r"model.args.finetune: bad value 'partial'; valid: lora, full"):
        _config(tmp_path, "model.args.finetune=partial")
    # one process: refused before the model loads or the run directory exists
    with pytest.raises(ConfigError) as err:
        Runner(_config(tmp_path, "model.args.fsdp=true"), progress=False).run()
    assert "\n" not in str(err.value) and "needs several processes" in str(err.value) and "has 1" in str(err.value)
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ConfigError, match=r"fsdp_version 1; the runner shards with FSDP2: set fsdp_version: 2"):
        _config(tmp_path)
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(ConfigError, match=r"the accelerate config's distributed_type: FSDP asks for FSDP sharding, "
                                          r"but model 'toy2d' has no transformer blocks"):
        load_config(toy, [])


def test_each_adapter_names_the_block_lists_fsdp_wraps():
    """The block lists each transformer adapter's ``shard_blocks`` resolves to on its diffusers class (tiny random
    configs): every list of blocks, FLUX's single-stream ones included."""
    import diffusers

    from flowzoo import models
    from flowzoo.models.sharding import block_lists

    small = {
        "sd3": ("SD3Transformer2DModel", dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2,
                                              attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                              caption_projection_dim=16, pooled_projection_dim=16, out_channels=4)),
        "wan": ("WanTransformer3DModel", dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                              in_channels=4, out_channels=4, text_dim=16, freq_dim=32, ffn_dim=16,
                                              num_layers=2, rope_max_seq_len=32)),
        "flux": ("FluxTransformer2DModel", dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=2,
                                                attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                                pooled_projection_dim=16, axes_dims_rope=(4, 4, 8))),
        "qwen_image": ("QwenImageTransformer2DModel", dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                                           attention_head_dim=16, num_attention_heads=2,
                                                           joint_attention_dim=16, axes_dims_rope=(8, 4, 4))),
    }
    expected = {"sd3": ["transformer_blocks"], "wan": ["blocks"], "qwen_image": ["transformer_blocks"],
                "flux": ["transformer_blocks", "single_transformer_blocks"]}
    for name, (cls, config) in small.items():
        transformer = getattr(diffusers, cls)(**config)
        assert models.get(name).shardable
        found = block_lists(transformer, models.get(name).shard_blocks)
        assert list(found) == expected[name], name
        assert all(len(blocks) == transformer.config.get("num_layers") or name == "flux" for blocks in found.values())
    assert models.get("tiny").shard_blocks == ("transformer_blocks",) and not models.get("toy2d").shardable
    with pytest.raises(ConfigError, match="QwenImageTransformer2DModel has no block list 'blocks' to shard"):
        block_lists(transformer, ("blocks",))
