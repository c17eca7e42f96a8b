"""The decoupled methods (DiffusionNFT, AWM) on the tiny tier give the metrics of one process on 2 CPU processes (gloo,
ranks forked as in tests/test_fsdp.py): their old-policy weight swaps, the merged no-grad copy of a LoRA transformer
(``PlainTransformer``, refreshed by parameter version counters) and a sharded full fine-tuning across ranks.

What differs between 1 and N processes is the order in which the per-sample gradients are summed (one backward over
the batch, or one per rank and an all-reduce), so gradients agree to float rounding only (~1e-6 relative). Two things
in the tiny tier can magnify that rounding: Adam's first step, ``g / (|g| + eps)``, moves a weight whose gradient is
near ``eps`` by a visible fraction of ``lr``; and the image rewards are quantized (JPEG byte counts, shapes_geneval's
counts), so a sample whose score sits at a step can flip under a 1e-7 change of the image. Measured on these
configs (docs/models.md): one flipped JPEG reward in a rollout (-1.951 vs -1.953) changes reward_mean by 2.5e-4 and
that step's grad_norm by ~0.2 %, and one process with ``micro_batch`` = half the batch (the ranks' summation order)
flips the same sample. The configurations below were checked not to flip on this build; a platform whose BLAS sums differently may.
"""

import numpy as np
import pytest
import torch

from flowzoo.benchmark.cli import main
from tests.test_fsdp import ARGS, CONFIG, _metrics, _two_processes

#: tests/test_fsdp.py's small random tiny run with one minibatch and no micro-batches (what a sharded DiffusionNFT /
#: AWM update allows), no checkpoints
BASE = [a for a in ARGS if not a.startswith(("algorithm.minibatches", "algorithm.micro_batch", "train.checkpoint_every"))]
BASE += ["train.checkpoint_every=0"]
CASES = {
    # LoRA, replicated: the merged no-grad copy serves rollout, v_old (old weights swapped in) and the reference
    "diffusion_nft_lora": ["algorithm.name=diffusion_nft", "model.args.finetune=lora"],
    # full fine-tuning sharded with FSDP2 (the 2-process run only): old weights are each rank's shards
    "awm_full_sharded": ["algorithm.name=awm", "model.args.finetune=full"],
    # sharded with 2 minibatches of micro-batches of 1 sample: a process with fewer parts pads (Algorithm.update_parts)
    "diffusion_nft_full_micro_sharded": ["algorithm.name=diffusion_nft", "model.args.finetune=full",
                                         "algorithm.minibatches=2", "algorithm.micro_batch=1"],
}


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("case", sorted(CASES))
def test_decoupled_methods_on_two_processes_give_the_metrics_of_one(tmp_path, monkeypatch, case):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = [*BASE, *CASES[case]]
    sharded = ["model.args.fsdp=true"] if case.endswith("_sharded") else []
    assert main(["train", str(CONFIG), *args, f"run_dir={tmp_path / 'one'}", "--quiet"]) == 0
    assert _two_processes([*args, *sharded, f"run_dir={tmp_path / 'two'}"]) == [0, 0]
    one = _metrics(tmp_path / "one")
    two = _metrics(tmp_path / "two").drop(columns=["fsdp_padding_calls"], errors="ignore")
    assert list(one.columns) == list(two.columns) and len(one) == len(two) == 4
    # the runs train: every step has a reward spread and a gradient, and the old policy lags the trained one
    assert one["reward_std"].iloc[1:].gt(0).all() and one["grad_norm"].iloc[1:].gt(0).all()
    if "old_deviation" in one:
        assert one["old_deviation"].iloc[2:].gt(0).all()
    for column in one.columns:
        np.testing.assert_allclose(two[column].to_numpy(float), one[column].to_numpy(float), rtol=1e-5, atol=1e-6,
                                   equal_nan=True, err_msg=column)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_what_a_gain_cost_on_two_processes_is_what_one_process_measures(tmp_path, monkeypatch):
    """The image tier's cost columns on 2 processes: the CLIP spread (each rank embeds its shard, the embeddings are
    gathered) and a reward judge as the gold (each rank scores its shard) equal one process's."""
    from tests.test_rewards_clip import write_tiny_clip

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    clip = write_tiny_clip(tmp_path / "clip")
    args = [*BASE, "algorithm.name=diffusion_nft", "model.args.finetune=lora", "train.eval_samples_per_prompt=2",
            f"train.spread_features={clip}", "train.gold={name: shapes_geneval, score: strict}"]
    assert main(["train", str(CONFIG), *args, f"run_dir={tmp_path / 'one'}", "--quiet"]) == 0
    assert _two_processes([*args, f"run_dir={tmp_path / 'two'}"]) == [0, 0]
    one, two = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    for column in ("eval_spread", "eval_spread_features", "eval_gold"):
        assert one[column].notna().sum() == 3, column
        np.testing.assert_allclose(two[column].to_numpy(float), one[column].to_numpy(float), rtol=1e-5, atol=1e-6,
                                   equal_nan=True, err_msg=column)
