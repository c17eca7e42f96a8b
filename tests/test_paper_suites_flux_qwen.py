"""The FLUX and Qwen-Image paper suites dry-run on the CPU: ``flowzoo bench`` runs every algorithm of each suite
at its released recipe (T, windows, kernels, shift, CFG) for one training step on the tiny random pipelines of the
same diffusers classes, with only the sizes (resolution, text length, G, batch) and the reward made small."""

from __future__ import annotations

import csv

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from flowzoo.benchmark.cli import main  # noqa: E402
from flowzoo.benchmark.run.suite import load_suite  # noqa: E402
from tests import tiny_pipelines as tiny  # noqa: E402


def _prompts(tmp_path):
    folder = tmp_path / "prompts"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.txt").write_text("a photo of a cat\ntwo red dogs\n")
    return folder


@pytest.mark.parametrize("suite_name", ["paper-flux-hpsv2", "paper-qwen-image-pickscore"])
def test_paper_suite_runs_a_step_of_every_algorithm(suite_name, tmp_path):
    if suite_name == "paper-flux-hpsv2":
        (tmp_path / "tok").mkdir()
        path = tiny.build_tiny_flux(tmp_path / "model", tmp_path / "tok")
        sizes = [f"model.args.resolution={tiny.FLUX_RESOLUTION}", f"model.args.max_sequence_length={tiny.FLUX_MAX_SEQ}"]
    else:
        path = tiny.build_tiny_qwen_image(tmp_path / "model")
        sizes = [f"model.args.resolution={tiny.QWEN_RESOLUTION}", f"model.args.max_sequence_length={tiny.QWEN_MAX_SEQ}"]
    prompts = _prompts(tmp_path)
    suite = load_suite(suite_name)
    task = next(t for t in suite.tasks if "@" not in t)
    overrides = [
        f"model.args.path={path}", *sizes, "model.args.dtype=float32", "model.args.lora_rank=2",
        "model.args.lora_alpha=4", "model.args.device=cpu", "model.args.gradient_checkpointing=false",
        "reward=jpeg_compressibility", f"prompts.train={prompts}", f"prompts.test={prompts}",
        "algorithm.group_size=2", "algorithm.micro_batch=2", "train.steps=1", "train.prompts_per_step=2",  # 4 samples: MixGRPO's 4 minibatches
        "train.eval_every=1", "train.eval_num_steps=2", "train.eval_prompts=1", "train.save_samples=false",
    ]
    runs = tmp_path / "runs"
    assert main(["bench", suite_name, "--runs", str(runs), "--workers", "1", "--tasks", task, *overrides]) == 0
    for algorithm in suite.algorithms:
        rows = list(csv.DictReader((runs / suite_name / task / algorithm / "s0" / "metrics.csv").open()))
        assert [int(r["step"]) for r in rows if r.get("reward_mean")] == [1], algorithm
        assert float(rows[-1]["nfe"]) > 0
