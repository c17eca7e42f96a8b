"""The third hostile-input probe (issue 44; sections by its item numbers): each case it found mishandled, reproduced
from the command line or at the function a command calls.

Every case ends in one line on stderr and exit 2, or does the right thing; nothing written is lost or half-written.
"""

from __future__ import annotations

import errno
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from flowzoo.benchmark.cli import main
from tests.synthetic_runs import write_run

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
    from flowzoo.algorithms.prompt_samplers.base import GroupOutcome
    from flowzoo.algorithms.prompt_samplers.variance import VariancePrioritised

    pool = [(f"p{i}", {"tag": "even" if i % 2 == 0 else "odd"}) for i in range(12)]
    config = VariancePrioritised.Config(floor=0.0, category_key=category_key)
    sampler = VariancePrioritised(pool, 4, seed=0, config=config)
    sampler.observe([GroupOutcome(index=i, prompt=pool[i][0], rewards=torch.tensor([1.0, 0.0] if i == 4 else [0.0, 0.0]))
                     for i in range(12)])
    drawn = [sampler.draw(step, step - 1).indices for step in range(1, 200)]
    assert all(len(set(d)) == 4 and 4 in d for d in drawn)
    others = np.bincount([i for d in drawn for i in d if i != 4], minlength=12)
    assert others[4] == 0 and (others[np.arange(12) != 4] > 10).all()  # every other prompt is reached


# ---- 3. a damaged metrics.csv is never read as results --------------------------------------------------------------
STEPS = [0, 10, 20, 30, 40]


def _write_run(root, algorithm, seed, rewards) -> Path:
    return write_run(root, "t", algorithm, seed, STEPS, rewards, {"clip_frac": 0.1})


def _cut_inside_eval_reward(path: Path) -> None:
    """The last line ends inside ``eval_reward`` (``...,0.1041`` -> ``...,0.``), as a write cut by a full disk."""
    text = path.read_text()
    head, last = text.rstrip("\n").rsplit("\n", 1)
    fields = last.split(",")
    fields[3] = fields[3][:2]
    path.write_text(head + "\n" + ",".join(fields[:4]))


def _nan_last_evaluation(path: Path) -> None:
    lines = path.read_text().splitlines()
    fields = lines[-1].split(",")
    fields[3] = "nan"
    path.write_text("\n".join([*lines[:-1], ",".join(fields)]) + "\n")


def _short_row(path: Path) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:-1], ",".join(lines[-1].split(",")[:3])]) + "\n")


@pytest.mark.parametrize("damage,cause", [
    (_cut_inside_eval_reward, "last line is cut mid-row"),
    (_nan_last_evaluation, "column 'eval_reward' is 'nan' at step 40"),
    (_short_row, "line 6 has 3 fields, the header 5"),
])
def test_a_damaged_metrics_file_is_refused_by_the_reader(tmp_path, damage, cause):
    from flowzoo.benchmark.analysis.runs import read_metrics
    from flowzoo.errors import RunError

    path = _write_run(tmp_path, "a", 0, [0.0, 0.1, 0.2, 0.3, 0.1042])
    assert read_metrics(path)["eval_reward"].iloc[-1] == pytest.approx(0.1042)
    damage(path)
    with pytest.raises(RunError, match=cause):
        read_metrics(path)


@pytest.mark.parametrize("damage", [_cut_inside_eval_reward, _nan_last_evaluation])
def test_report_and_study_skip_a_damaged_run_and_say_so(tmp_path, capsys, damage):
    """The damaged seed (final 0.1042) would otherwise be read as a final reward of 0.0 or of its earlier 0.0625."""
    from flowzoo.benchmark.study.verdicts import main as study_main

    runs = tmp_path / "runs"
    for seed in range(3):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
        _write_run(runs, "op_grpo", seed, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed])
    damage(_write_run(runs, "op_grpo", 3, [0.0, 0.0, 0.0625, 0.0625, 0.1042]))
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "index.md").read_text()
    assert "skipped (unreadable): 1" in report and "t/op_grpo/s3" in report
    assert study_main([str(runs), "--out", str(tmp_path / "study"), "--resamples", "200"]) == 0
    study = (tmp_path / "study" / "README.md").read_text()
    assert "Runs read: 6; skipped (unreadable): 1" in study and "t/op_grpo/s3" in study
    table = pd.read_csv(tmp_path / "study" / "runs.csv")
    assert 3 not in set(table[table["algorithm"] == "op_grpo"]["seed"])


def test_report_lists_a_half_present_run_as_skipped_with_its_cause(tmp_path, capsys):
    """A run that has written config.yaml but not its first metrics row (or a copy that lost its config) is neither
    read nor silently dropped: the report counts it as skipped and names the missing file."""
    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4])
    _write_run(runs, "flow_grpo", 2, [0.0, 0.1, 0.2, 0.3, 0.4]).unlink()  # started, no row yet
    (runs / "t" / "flow_grpo" / "s3").mkdir()
    (runs / "t" / "flow_grpo" / "s3" / "metrics.csv").write_text("step,nfe,wall_s,eval_reward\n0,0,0,0.1\n")
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "index.md").read_text()
    assert "skipped (unreadable): 2" in report
    assert "t/flow_grpo/s2" in report and "no metrics.csv" in report
    assert "t/flow_grpo/s3" in report and "no config.yaml" in report
    only_started = tmp_path / "only"
    _write_run(only_started, "flow_grpo", 0, [0.0, 0.1, 0.2, 0.3, 0.4]).unlink()
    assert main(["report", str(only_started), "--out", str(tmp_path / "r2")]) == 2
    assert "1 hold only one of them" in _one_error_line(capsys)


# ---- 4. configs that train nothing ----------------------------------------------------------------------------------
TOY = "benchmark/configs/toy_flow_grpo.yaml"


@pytest.mark.parametrize("algorithm", ["flow_grpo", "diffusion_nft", "awm", "dance_grpo"])
def test_guidance_0_with_a_detached_unconditional_branch_is_refused(tmp_path, capsys, algorithm):
    """u + 0 (c - u) = u, and u carries no gradient under cfg_grad cond: every gradient was exactly 0."""
    args = ["train", TOY, f"algorithm.name={algorithm}", "algorithm.guidance=0", f"run_dir={tmp_path / 'run'}"]
    assert main(args) == 2
    err = _one_error_line(capsys)
    assert "algorithm.guidance 0 with cfg_grad cond trains nothing" in err and "cfg_grad: both" in err
    assert not (tmp_path / "run").exists()


def test_guidance_0_is_not_refused_where_a_gradient_flows():
    """cfg_grad both at g = 0 trains the unconditional branch (d v = d u), which a g = 0 evaluation samples."""
    from flowzoo.benchmark.run.loading import load_config

    load_config(TOY, ["algorithm.guidance=0", "algorithm.cfg_grad=both"])  # negative: tests/test_hostile_round4.py


def test_guidance_0_with_cfg_grad_cond_really_gives_a_zero_gradient_and_both_does_not():
    """The refusal's premise, on the toy model: one update's gradient under each cfg_grad at g = 0."""
    from flowzoo import algorithms
    from flowzoo import models
    from flowzoo import rewards
    from flowzoo.models.toy2d import prompt_set

    grads = {}
    for cfg_grad in ("cond", "both"):
        model = models.get("toy2d")(pretrain_steps=20, hidden=16)
        alg = algorithms.get("flow_grpo")(model, rewards.get("toy_mode")(), {
            "group_size": 4, "guidance": 0.0, "cfg_grad": cfg_grad, "kl_beta": 0.0, "lr": 1e-3}, seed=0)
        alg.step(*[list(column) for column in zip(*prompt_set()[:2])])
        grads[cfg_grad] = sum(float(p.grad.abs().sum()) for p in model.trainable_parameters() if p.grad is not None)
    assert grads["cond"] == 0 and grads["both"] > 0


@pytest.mark.parametrize("overrides,total", [
    (["algorithm.ema_every=10", "train.steps=4"], 4),
    (["algorithm.ema_every=10", "train.steps=4", "algorithm.inner_epochs=2"], 8),
])
def test_an_ema_that_never_moves_is_refused(tmp_path, capsys, overrides, total):
    """The average first moves after optimizer step ema_every - 1: with fewer, every evaluation and the export were
    the base model."""
    assert main(["train", TOY, "algorithm.ema=true", *overrides, f"run_dir={tmp_path / 'run'}"]) == 2
    err = _one_error_line(capsys)
    assert f"the run takes at most {total}" in err and "base model" in err and f"ema_every <= {total + 1}" in err
    from flowzoo.benchmark.run.loading import load_config

    load_config(TOY, ["algorithm.ema=true", "algorithm.ema_every=5", "train.steps=4"])  # moves after step 4


def test_training_knobs_refuse_bench_but_not_eval_or_grad_snr(tmp_path, capsys):
    """bench refuses the grid before any run; evaluating such a config (its untrained model) is no training."""
    assert main(["bench", "smoke", "--runs", str(tmp_path / "runs"), "algorithm.guidance=0"]) == 2
    assert "algorithm.guidance 0 with cfg_grad cond trains nothing" in _one_error_line(capsys)
    assert not (tmp_path / "runs" / "smoke" / "toy2d_mode").exists()
    small = ["model.args.pretrain_steps=30", "model.args.hidden=32"]
    assert main(["eval", TOY, *small, "algorithm.guidance=0", "--samples", "1"]) == 0
    assert main(["eval", TOY, *small, "algorithm.ema=true", "algorithm.ema_every=1000", "--samples", "1"]) == 0
    capsys.readouterr()
    assert main(["grad-snr", TOY, *small, "algorithm.guidance=0", "train.prompts_per_step=2", "algorithm.group_size=4",
                 "--batches", "3", "--quiet"]) == 0
    assert "the gradient is exactly 0 in 3 of 3 batches" in capsys.readouterr().out


def test_grad_snr_on_a_zero_gradient_says_so(tmp_path, capsys):
    """A random tiny network never passes the strict GenEval check: every reward 0, every advantage 0, every gradient
    exactly 0. It printed "cosine +0.0000 (se 0.0000)", read as pure noise."""
    config = _tiny_config(tmp_path / "c.yaml")
    assert main(["grad-snr", config, "reward_args={shapes_geneval: {score: strict}}", "train.prompt_sampler=null",
                 "--batches", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "the gradient is exactly 0 in 3 of 3 batches" in out and "no gradient cosine" in out
    assert "+0.0000" not in out and "nan" not in out


def test_grad_snr_line_with_some_zero_batches_and_too_few_for_an_se():
    from flowzoo.benchmark.run.grad_snr import SNRResult

    line = SNRResult(4, 8, 0.25, math.nan, 0.01, 0.1, 1.0, zero_batches=2).line()
    assert "cosine +0.2500 (no se: it needs 3 batches with a non-zero gradient)" in line
    assert "2 of 4 batches had an exactly zero gradient" in line and "nan" not in line


# ---- 5. a full disk: one line naming the path, no half-written output folder -----------------------------------------
def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no filename


def _no_partial_siblings(parent: Path) -> None:
    assert not [p.name for p in parent.iterdir() if ".partial-" in p.name]


def test_train_on_a_full_disk_names_the_file_and_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    import torch as torch_module

    run = tmp_path / "run"
    args = ["train", TOY, "model.args.pretrain_steps=30", "model.args.hidden=32", "train.eval_every=0",
            "train.save_samples=false", "train.prompts_per_step=2", "algorithm.group_size=4", "train.steps=3",
            "train.checkpoint_every=1", f"run_dir={run}", "--quiet"]
    real, calls = torch_module.save, []

    def full_after_first(obj, f, *a, **k):
        calls.append(1)
        if len(calls) > 1:  # the step-2 checkpoint: the disk is full
            _enospc()
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch_module, "save", full_after_first)
    assert main(args) == 2
    err = _one_error_line(capsys)
    assert str(run / "checkpoint.pt") in err and "No space left on device" in err
    monkeypatch.setattr(torch_module, "save", real)
    assert torch_module.load(run / "checkpoint.pt", weights_only=False)  # the last good checkpoint is intact
    assert main(args) == 0 and (run / "done.json").is_file()  # and the run resumes to the end


def test_naming_gives_a_pathless_write_error_its_path_and_leaves_others_alone(tmp_path):
    from flowzoo.io import atomic_torch_save, naming

    def torch_writer_failed(*args, **kwargs):  # what torch.save raises when its zip writer cannot write
        raise RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "save", torch_writer_failed)
        with pytest.raises(OSError) as caught:
            atomic_torch_save({}, tmp_path / "c.pt")
    assert caught.value.filename == str(tmp_path / "c.pt") and "write failed" in caught.value.strerror
    assert list(tmp_path.iterdir()) == []  # no temporary file left
    with pytest.raises(OSError) as caught, naming(tmp_path / "x"):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/elsewhere")
    assert caught.value.filename == "/elsewhere"  # an error that names its path keeps it
    with pytest.raises(RuntimeError, match="a bug"), naming(tmp_path / "x"):
        raise RuntimeError("a bug")


def test_every_atomic_write_on_a_full_disk_names_its_path(tmp_path, capsys, monkeypatch):
    import os

    monkeypatch.setattr(os, "fsync", _enospc)
    assert main(["train", TOY, f"run_dir={tmp_path / 'run'}", "--quiet"]) == 2
    assert f"{tmp_path / 'run' / 'config.yaml'}: No space left on device" in _one_error_line(capsys)
    assert main(["eval", TOY, "model.args.pretrain_steps=30", "model.args.hidden=32", "--samples", "1",
                 "--out", str(tmp_path / "eval.json")]) == 2
    assert f"{tmp_path / 'eval.json'}: No space left on device" in _one_error_line(capsys)


def test_report_and_study_on_a_full_disk_leave_no_output_folder(tmp_path, capsys, monkeypatch):
    from flowzoo.benchmark.study.verdicts import main as study_main

    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
        _write_run(runs, "op_grpo", seed, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed])
    monkeypatch.setattr("matplotlib.figure.Figure.savefig", _enospc)
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 2
    err = _one_error_line(capsys)
    assert f"{tmp_path / 'report'}/figures/" in err and "No space left on device" in err
    assert not (tmp_path / "report").exists()
    monkeypatch.setattr(pd.DataFrame, "to_csv", _enospc)
    assert study_main([str(runs), "--out", str(tmp_path / "study"), "--resamples", "200"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("flowzoo: error: ") and f"{tmp_path / 'study'}/" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "study").exists()
    _no_partial_siblings(tmp_path)


def test_a_failed_report_into_an_existing_folder_keeps_its_files(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
    out = tmp_path / "report"
    assert main(["report", str(runs), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr("flowzoo.benchmark.render.report.markdown_to_html", _enospc)
    assert main(["report", str(runs), "--out", str(out)]) == 2
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    _no_partial_siblings(tmp_path)


def test_export_on_a_full_disk_leaves_no_output_folder(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", _tiny_config(tmp_path / "c.yaml"), f"run_dir={run}", "train.prompt_sampler=null",
                 "--quiet"]) == 0
    monkeypatch.setattr("safetensors.torch.save_file", _enospc)
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "lora")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("flowzoo:")]  # not diffusers'
    assert len(err) == 1 and err[0].startswith("flowzoo: error: ")
    err = err[0]
    assert str(tmp_path / "lora") in err and ".partial-" not in err and "No space left on device" in err
    assert not (tmp_path / "lora").exists()
    _no_partial_siblings(tmp_path)


def test_bench_on_a_full_disk_reports_each_failed_run_in_one_line(tmp_path, capsys, monkeypatch):
    import torch as torch_module

    monkeypatch.setattr(torch_module, "save", _enospc)
    assert main(["bench", "smoke", "--runs", str(tmp_path / "runs"), "--seeds", "0", "train.steps=1",
                 "train.eval_every=0"]) == 1
    err = capsys.readouterr().err
    run = tmp_path / "runs" / "smoke" / "toy2d_mode" / "flow_grpo" / "s0"
    assert [line for line in err.splitlines() if line.startswith("failed")] == [
        f"failed: {run}: {run / 'checkpoint.pt'}: No space left on device"], err
    assert "Traceback" not in err


# ---- 7. smaller: --algorithms outside the suite; the study's outputs and degenerate input ----------------------------
def test_bench_algorithms_outside_the_suite_is_refused(tmp_path, capsys):
    assert main(["bench", "smoke", "--runs", str(tmp_path / "runs"), "--algorithms", "awm"]) == 2
    assert _one_error_line(capsys) == ("flowzoo: error: --algorithms: suite smoke does not run awm; its algorithms: "
                                       "flow_grpo")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("option", ["--out", "--save-metrics"])
def test_study_refuses_an_output_in_the_shipped_weights(tmp_path, capsys, monkeypatch, option):
    import flowzoo.models.tiny as tiny
    from flowzoo.benchmark.study.verdicts import main as study_main

    weights = tmp_path / "weights"
    weights.mkdir()
    monkeypatch.setattr(tiny, "WEIGHTS_DIR", weights)
    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
    args = [str(runs), "--out", str(tmp_path / "study"), "--resamples", "200"]
    args += [option, str(weights / "study")] if option == "--save-metrics" else []
    if option == "--out":
        args[2] = str(weights / "study")
    assert study_main(args) == 2
    err = capsys.readouterr().err
    assert "inside the shipped weights directory" in err and len(err.strip().splitlines()) == 1
    assert list(weights.iterdir()) == []


def test_study_refuses_an_existing_file_as_out(tmp_path, capsys):
    from flowzoo.benchmark.study.verdicts import main as study_main

    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
    (tmp_path / "file").write_text("mine")
    assert study_main([str(runs), "--out", str(tmp_path / "file"), "--resamples", "200"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err and (tmp_path / "file").read_text() == "mine"


def test_study_of_baseline_only_runs_is_one_line(tmp_path, capsys):
    from flowzoo.benchmark.study.verdicts import main as study_main

    runs = tmp_path / "runs"
    for seed in range(3):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
    assert study_main([str(runs), "--out", str(tmp_path / "study"), "--resamples", "200"]) == 2  # was a KeyError
    err = capsys.readouterr().err.strip()
    assert err == (f"flowzoo: error: only the baseline 'flow_grpo' has runs in {runs}; a study pairs other cells "
                   "with it (give the runs of the algorithms to compare, or another --baseline)")
    assert not (tmp_path / "study").exists()



# ---- 6. trackers' services: bounded, one line naming the service -----------------------------------------------------
TOY_TRAIN = ["model.args.pretrain_steps=30", "model.args.hidden=32", "train.eval_every=0", "train.save_samples=false",
             "train.prompts_per_step=2", "algorithm.group_size=4", "train.steps=2", "--quiet"]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def test_mlflow_server_down_is_one_line_at_once(tmp_path, capsys, monkeypatch):
    import time

    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:hunter2@127.0.0.1:{_closed_port()}/path")
    start = time.monotonic()
    assert main(["train", TOY, *TOY_TRAIN, "train.trackers=[mlflow]", f"run_dir={tmp_path / 'run'}"]) == 2
    assert time.monotonic() - start < 30  # was 293 s of retries
    err = _one_error_line(capsys)
    assert "tracker mlflow" in err and "cannot be reached" in err and "MLFLOW_TRACKING_URI=http://127.0.0.1:" in err
    assert "hunter2" not in err and not (tmp_path / "run").exists()


def test_mlflow_file_uri_selects_that_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    store = tmp_path / "store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert main(["train", TOY, *TOY_TRAIN, "train.trackers=[mlflow]", f"run_dir={tmp_path / 'run'}"]) == 0
    assert list(store.rglob("meta.yaml")) and not (tmp_path / "run" / "trackers" / "mlruns").exists()


def test_wandb_online_without_a_key_is_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("NETRC", raising=False)
    assert main(["train", TOY, *TOY_TRAIN, "train.trackers=[wandb]", f"run_dir={tmp_path / 'run'}"]) == 2
    err = _one_error_line(capsys)
    assert "tracker wandb: WANDB_MODE=online needs a W&B API key" in err and not (tmp_path / "run").exists()


def test_a_tracker_on_a_full_disk_is_one_line_naming_its_folder(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    monkeypatch.setattr(SummaryWriter, "add_scalar", _enospc)  # as its writer thread's error comes back
    run = tmp_path / "run"
    assert main(["train", TOY, *TOY_TRAIN, "train.trackers=[tensorboard]", f"run_dir={run}"]) == 2
    assert _one_error_line(capsys) == f"flowzoo: error: {run / 'trackers'}: No space left on device"


# ---- 6. YAML alias bombs are refused before anything is built --------------------------------------------------------
def _alias_bomb(levels: int = 8) -> str:
    """~700 bytes whose nested aliases expand to 10^levels leaves."""
    names = [f"l{i}" for i in range(levels)]
    lines = [f"{names[0]}: &{names[0]} [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip(names, names[1:])]
    return "\n".join(["task: bomb", *lines, f"algorithm: {{name: flow_grpo, junk: *{names[-1]}}}"]) + "\n"


def test_a_yaml_alias_bomb_is_refused_fast(tmp_path, capsys):
    import time

    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    assert len(path.read_bytes()) < 1000
    start = time.monotonic()
    assert main(["train", str(path), f"run_dir={tmp_path / 'run'}"]) == 2
    assert time.monotonic() - start < 5  # was 104 s
    err = _one_error_line(capsys)
    assert "bomb.yaml: expands to more than 100,000 values" in err and not (tmp_path / "run").exists()
    assert main(["train", TOY, f"algorithm.junk={_alias_bomb(7)}", f"run_dir={tmp_path / 'run'}"]) == 2
    assert "expands to more than 100,000 values" in _one_error_line(capsys)


def test_shared_aliases_that_stay_small_and_self_reference(tmp_path):
    from flowzoo import strict_yaml
    from flowzoo.errors import ConfigError

    assert strict_yaml.load("a: &x {b: 1}\nc: *x\n", "ok") == {"a": {"b": 1}, "c": {"b": 1}}
    with pytest.raises(ConfigError, match="contains itself"):
        strict_yaml.load("a: &x [1, *x]\n", "cycle.yaml")
    with pytest.raises(ConfigError, match="more than 10,000,000"):
        strict_yaml.load("a: " + "x" * 10_000_001, "long.yaml")

def test_recipes_out_on_a_full_disk_names_the_file(tmp_path, capsys, monkeypatch):
    import os

    monkeypatch.setattr(os, "fsync", _enospc)
    assert main(["recipes", "--out", str(tmp_path / "recipes.md")]) == 2
    assert _one_error_line(capsys) == f"flowzoo: error: {tmp_path / 'recipes.md'}: No space left on device"
    assert list(tmp_path.iterdir()) == []


# ---- the held-back cases, found along the principles (sections by item) ----------------------------------------------
# 3. every reader of run files validates what it reads and says what it skipped
def _damage_config(path: Path, text: str) -> None:
    path.write_text(text)


@pytest.mark.parametrize("text,cause", [
    ("task: t\nseed: abc\nalgorithm: {name: op_grpo}\ntrain: {steps: 40}\n", "seed is 'abc', not an integer"),
    ("task: t\nseed: 2\nalgorithm: op_grpo\ntrain: {steps: 40}\n", "missing key 'algorithm.name'"),
    ("task: t\nseed: 2\ntrain: {steps: 40}\n" + _alias_bomb().split("\n", 1)[1], "expands to more than 100,000 values"),
])
def test_report_and_study_skip_a_damaged_config_in_one_line(tmp_path, capsys, text, cause):
    """A config.yaml whose seed is text or whose algorithm is no mapping was a traceback in the report's fingerprint
    (which read config.yaml on its own); an alias bomb there took minutes in every reader (yaml.safe_load)."""
    import time

    from flowzoo.benchmark.study.verdicts import main as study_main

    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
        _write_run(runs, "op_grpo", seed, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed])
    damaged = _write_run(runs, "op_grpo", 2, [0.0, 0.2, 0.3, 0.4, 0.5]).parent / "config.yaml"
    _damage_config(damaged, text)
    start = time.monotonic()
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "index.md").read_text()
    assert "skipped (unreadable): 1" in report and cause in report
    assert "op_grpo/s2" not in (tmp_path / "report" / "fingerprint.json").read_text()
    assert study_main([str(runs), "--out", str(tmp_path / "study"), "--resamples", "200",
                       "--save-metrics", str(tmp_path / "saved")]) == 0
    assert "skipped (unreadable): 1" in (tmp_path / "study" / "README.md").read_text()
    assert not (tmp_path / "saved" / "t" / "op_grpo" / "s2").exists()  # --save-metrics copies no damaged run
    assert time.monotonic() - start < 60


def test_study_save_metrics_skips_a_binary_config(tmp_path):
    """--save-metrics read each config.yaml as text itself: a binary one was a UnicodeDecodeError traceback."""
    from flowzoo.benchmark.study.verdicts import main as study_main

    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
        _write_run(runs, "op_grpo", seed, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed])
    (_write_run(runs, "op_grpo", 2, [0.0] * 5).parent / "config.yaml").write_bytes(bytes(range(256)) * 4)
    assert study_main([str(runs), "--out", str(tmp_path / "study"), "--resamples", "200",
                       "--save-metrics", str(tmp_path / "saved")]) == 0
    assert "not UTF-8 text" in (tmp_path / "study" / "README.md").read_text()
    assert sorted(p.parent.name for p in (tmp_path / "saved").rglob("config.yaml")) == ["s0", "s0", "s1", "s1"]


def test_a_metrics_file_with_a_header_and_no_rows_is_skipped_and_said(tmp_path):
    """It was dropped from every count without a word (the runner never writes one: the step-0 row comes with it)."""
    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
    metrics = _write_run(runs, "flow_grpo", 2, [0.0] * 5)
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "index.md").read_text()
    assert "skipped (unreadable): 1" in report and "a header and no rows" in report


@pytest.mark.parametrize("fingerprint,cause", [
    ({"steps": 3, "cells": {"a/b": "x"}}, "cell 'a/b': not a mapping"),
    ({"steps": 3, "cells": {"a/b": {"seed": 0, "config": "x", "rows": []}}}, "config is not a mapping"),
    ({"steps": 3, "cells": {"a/b": {"seed": 0, "config": {}, "rows": "x"}}}, "rows are not a list"),
    ({"steps": 3, "cells": {"a/b": {"seed": 0, "config": {}, "rows": [{"step": 0, "eval_reward": "x"}]}}},
     "step 0 eval_reward is 'x', not a finite number"),
    ({"steps": 10**9, "cells": {}}, "steps 1000000000 is not in [1, 100]"),  # would rerun each cell 10^9 steps
])
def test_freshness_of_a_damaged_fingerprint_is_one_line(tmp_path, capsys, fingerprint, cause):
    import json

    from flowzoo.benchmark.render.freshness import main as fresh_main

    (tmp_path / "fingerprint.json").write_text(json.dumps(fingerprint))
    assert fresh_main([str(tmp_path), "--suite", "smoke"]) == 2  # each was a TypeError/ValueError traceback
    err = _one_error_line(capsys)
    assert cause in err


# 4. a knob that cannot change anything: --tuned naming no tuned cell
def test_bench_tuned_without_a_tuned_cell_is_refused(tmp_path, capsys):
    """bench --tuned DIR with no DIR/<task>/<algorithm>.yaml for any cell ran every cell untuned, saying nothing."""
    (tmp_path / "tuned").mkdir()
    assert main(["bench", "smoke", "--runs", str(tmp_path / "runs"), "--tuned", str(tmp_path / "tuned")]) == 2
    assert "holds no tuned configuration for any cell of this grid" in _one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_a_number_written_as_text_in_reward_args_is_read_as_the_number():
    """YAML 1.1 reads 1e9 (no dot) as text: the config's own fields took it as a number, reward_args passed the string
    on ('<=' not supported between 'str' and 'int', or a range check skipped); now it is the number, range-checked."""
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.errors import ConfigError

    config = load_config(TOY, ["reward_args={toy_mode: {scale: 2e-1}}"])
    assert config.reward_args["toy_mode"]["scale"] == 0.2  # a float, not '2e-1' (the range check below needs it)
    with pytest.raises(ConfigError, match="expected a number, got 'x'"):
        load_config(TOY, ["reward_args={toy_mode: {scale: x}}"])


# 5. every writer names its path and writes whole: a directory, or a file above the path, given as a file --out
def test_a_file_out_that_is_a_directory_or_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("mine")
    assert main(["recipes", "--out", str(tmp_path / "dir")]) == 2  # named a temporary file: '.dir.x1y2.tmp -> dir'
    assert _one_error_line(capsys) == f"flowzoo: error: {tmp_path / 'dir'}: is a directory; give a file path"
    assert main(["recipes", "--out", str(tmp_path / "file" / "r.md")]) == 2  # was 'file: File exists'
    assert f"{tmp_path / 'file'}: is a file" in _one_error_line(capsys)
    assert (tmp_path / "file").read_text() == "mine" and list((tmp_path / "dir").iterdir()) == []


def _claims(path: Path, rows: list[str]) -> Path:
    path.mkdir(parents=True)
    (path / "claims.csv").write_text("\n".join(["claim,verdict exploration,verdict replication,replication", *rows])
                                     + "\n")
    return path


@pytest.mark.parametrize("shared_rows,tuned_rows,cause", [
    ([], ["c1,yes,yes,replicated"], "holds no claim"),  # was KeyError: 'change'
    (["c1,yes,yes,replicated"], ["c1,yes,yes,replicated", "c1,no,no,contradicted"], "lists the claim 'c1' twice"),
])
def test_recipe_compare_of_degenerate_claims_is_one_line(tmp_path, capsys, shared_rows, tuned_rows, cause):
    from flowzoo.benchmark.study.recipe_compare import main as compare_main

    shared, tuned = _claims(tmp_path / "shared", shared_rows), _claims(tmp_path / "tuned", tuned_rows)
    assert compare_main([str(shared), str(tuned), "--out", str(tmp_path / "out.md")]) == 2
    assert cause in _one_error_line(capsys) and not (tmp_path / "out.md").exists()


def test_recipe_compare_refuses_the_shipped_weights_and_names_a_full_disk(tmp_path, capsys, monkeypatch):
    import os

    import flowzoo.models.tiny as tiny
    from flowzoo.benchmark.study.recipe_compare import main as compare_main

    shared = _claims(tmp_path / "shared", ["c1,yes,yes,replicated"])
    weights = tmp_path / "weights"
    weights.mkdir()
    monkeypatch.setattr(tiny, "WEIGHTS_DIR", weights)
    assert compare_main([str(shared), str(shared), "--out", str(weights / "x.md")]) == 2  # was written there
    assert "inside the shipped weights directory" in _one_error_line(capsys) and list(weights.iterdir()) == []
    monkeypatch.setattr(os, "fsync", _enospc)
    assert compare_main([str(shared), str(shared), "--out", str(tmp_path / "x.md")]) == 2  # was a traceback
    assert _one_error_line(capsys) == f"flowzoo: error: {tmp_path / 'x.md'}: No space left on device"


def _tuning_suite(tmp_path: Path) -> Path:
    """One cell, two trials of two toy steps each (the shape of tests/test_tuning.py's suite)."""
    suite = tmp_path / "tiny-tune.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "tiny-tune", "seeds": [0], "algorithms": ["flow_grpo"],
        "defaults": {"algorithm": {"group_size": 4, "kl_beta": 0.0},
                     "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 1, "eval_samples_per_prompt": 2,
                               "checkpoint_every": 2, "save_samples": False, "threads": 1},
                     "model": {"name": "toy2d", "args": {"pretrain_steps": 30, "hidden": 32}}, "reward": "toy_mode"},
        "tasks": {"toy2d_mode": {}},
        "tuning": {"objective": "auc", "trials": 2, "seeds": [1000], "validation": {"eval_seed": 54321, "prompts": "reported"},
                   "sampler": {"seed": 0, "startup_trials": 1},
                   "pruner": {"startup_trials": 1, "warmup_evaluations": 1}},
    }))
    return suite


def test_tune_report_without_a_storage_and_on_a_full_disk(tmp_path, capsys, monkeypatch):
    """--report on a --runs where no trial ran created an empty database there and reported 0 trials per cell; on a
    full disk it left a half-written folder; an existing file as --out was refused only after every trial ran."""
    import os

    suite = _tuning_suite(tmp_path)
    runs = tmp_path / "runs"
    assert main(["tune", str(suite), "--runs", str(runs), "--report", "--out", str(tmp_path / "out")]) == 2
    assert "--report: no tuning storage at" in _one_error_line(capsys)
    assert not runs.exists() and not (tmp_path / "out").exists()
    (tmp_path / "file").write_text("mine")
    assert main(["tune", str(suite), "--runs", str(runs), "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a directory" in _one_error_line(capsys) and not runs.exists()
    assert main(["tune", str(suite), "--runs", str(runs)]) == 0  # two trials
    capsys.readouterr()
    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", _enospc)
        assert main(["tune", str(suite), "--runs", str(runs), "--report", "--out", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys)
    assert f"{tmp_path / 'out'}/" in err and "No space left on device" in err
    assert not (tmp_path / "out").exists()
    _no_partial_siblings(tmp_path)
    assert main(["tune", str(suite), "--runs", str(runs), "--report", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "index.md").is_file()
    # --from-trials: the report again from its own trial tables, without the storage; misuse is one line
    assert main(["tune", str(suite), "--report", "--from-trials", str(tmp_path / "out"), "--out",
                 str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "index.md").read_text() == (tmp_path / "out" / "index.md").read_text()
    assert main(["tune", str(suite), "--from-trials", str(tmp_path / "out"), "--out", str(tmp_path / "x")]) == 2
    assert "add --report" in _one_error_line(capsys)
    assert main(["tune", str(suite), "--report", "--from-trials", str(tmp_path / "nowhere"), "--out",
                 str(tmp_path / "x")]) == 2
    assert "no trial tables in" in _one_error_line(capsys) and not (tmp_path / "x").exists()


# 6. trackers are no part of reading a run; a reward server's wait is bounded
def test_eval_of_a_tracked_run_does_not_need_its_tracker(tmp_path, capsys, monkeypatch):
    """A run trained with a tracker was refused by eval (and export) where the tracker is not installed, or where its
    server is down: they log to none. Training with it is still refused there, before anything is written."""
    import flowzoo.benchmark.run.tracking as tracking

    class Recorder:
        def __init__(self, *args, **kwargs):
            pass

        def log(self, row, step):
            pass

        def replay(self, rows):  # a resumed run's history, as Trackers.replay sends it
            for row in rows:
                self.log(row, row["step"])

        def finish(self):
            pass

    run = tmp_path / "run"
    with monkeypatch.context() as elsewhere:  # the machine it was trained on: tensorboard installed
        elsewhere.setattr(tracking, "available_trackers", lambda: ["tensorboard"])
        elsewhere.setattr("flowzoo.benchmark.run.runner.Trackers", Recorder)
        assert main(["train", TOY, *TOY_TRAIN, "train.trackers=[tensorboard]", f"run_dir={run}"]) == 0
    monkeypatch.setattr(tracking, "available_trackers", lambda: [])  # here: none
    capsys.readouterr()
    assert main(["eval", str(run), "--samples", "1"]) == 0
    assert main(["train", TOY, *TOY_TRAIN, "train.trackers=[tensorboard]", f"run_dir={tmp_path / 'new'}"]) == 2
    assert "tracker 'tensorboard' is not installed" in _one_error_line(capsys) and not (tmp_path / "new").exists()
    assert main(["train", TOY, *TOY_TRAIN, "train.trackers=[tensorbored]", f"run_dir={tmp_path / 'new'}"]) == 2
    assert "unknown tracker 'tensorbored'" in _one_error_line(capsys)  # a typo is still refused at load


@pytest.mark.parametrize("argument,value,bound", [
    ("retries", 1000000, "[0, 10]"),  # back-off doubling from 1 s: the run never ended
    ("timeout", "1e9", "(0, 3600]"),  # text to YAML 1.1; was "'<=' not supported between 'str' and 'int'"
    ("retry_wait_s", 100000, "[0, 600]"),
])
def test_a_reward_servers_wait_is_bounded(tmp_path, capsys, argument, value, bound):
    config = _tiny_config(tmp_path / "c.yaml")
    assert main(["train", config, "reward=unifiedreward", "train.prompt_sampler=null",
                 f"reward_args={{unifiedreward: {{{argument}: {value}}}}}", f"run_dir={tmp_path / 'run'}"]) == 2
    assert f"reward_args.unifiedreward.{argument} must be in {bound}" in _one_error_line(capsys)


# 5. nothing written is lost: the study's trimmed copies never land on the runs they copy
@pytest.mark.parametrize("inside", [False, True])
def test_study_save_metrics_into_the_runs_directory_is_refused(tmp_path, capsys, inside):
    """--save-metrics RUNS_DIR rewrote each run's own metrics.csv trimmed to the study's columns (a run's loss and
    every other column gone); inside RUNS_DIR, the copies were read as more runs by the next report."""
    from flowzoo.benchmark.study.verdicts import main as study_main

    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
        _write_run(runs, "op_grpo", seed, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed])
    metrics = runs / "t" / "op_grpo" / "s0" / "metrics.csv"
    frame = pd.read_csv(metrics).assign(loss=0.123)
    frame.to_csv(metrics, index=False)
    before = metrics.read_bytes()
    saved = runs / "saved" if inside else runs
    assert study_main([str(runs), "--out", str(tmp_path / "study"), "--resamples", "200",
                       "--save-metrics", str(saved)]) == 2
    err = _one_error_line(capsys)
    assert ("inside the runs directory" if inside else "is the runs directory") in err
    assert metrics.read_bytes() == before and not (runs / "saved").exists() and not (tmp_path / "study").exists()


# 3. the study's --timing file is validated as run files are
@pytest.mark.parametrize("cost", ["nan", "0", "-1", ""])
def test_study_timing_with_a_cost_that_is_no_positive_number_is_one_line(tmp_path, capsys, cost):
    """A per-step cost of nan, 0 or < 0 gave a wall-clock table of 'nan (nan-nan)' or negative ratios, exit 0."""
    from flowzoo.benchmark.study.verdicts import main as study_main

    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
        _write_run(runs, "op_grpo", seed, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed])
    timing = tmp_path / "timing.csv"
    timing.write_text(f"repeat,cell,task,algorithm,s_per_step\n0,t/flow_grpo,t,flow_grpo,1.0\n0,t/op_grpo,t,op_grpo,{cost}\n")
    assert study_main([str(runs), "--out", str(tmp_path / "study"), "--resamples", "200", "--timing", str(timing)]) == 2
    assert "s_per_step of t/op_grpo (repeat 0)" in _one_error_line(capsys) and not (tmp_path / "study").exists()


# ---- the difficulty sampler's threshold outside its reward's range ---------------------------------------------------
@pytest.mark.parametrize("threshold,rate", [(1.0, 0), (1.5, 0), (-0.1, 1)])
def test_a_difficulty_threshold_outside_the_reward_range_is_refused(tmp_path, capsys, threshold, rate):
    """toy_mode scores lie in [0, 1]: "reward > 1" never holds (pass rate 0), "reward > -0.1" always does (rate 1);
    the band [0.25, 0.75] keeps neither, so every step paid max_rounds rollouts for uniform sampling."""
    args = ["train", TOY, "train.prompt_sampler.name=difficulty",
            f"train.prompt_sampler.success_threshold={threshold}", f"run_dir={tmp_path / 'run'}"]
    assert main(args) == 2
    err = _one_error_line(capsys)
    assert f"success_threshold {threshold:g}" in err and f"pass rate is {rate}" in err
    assert "[0.25, 0.75]" in err and "give a threshold in [0, 1)" in err and "'toy_mode'" in err
    assert not (tmp_path / "run").exists()


def test_a_difficulty_threshold_is_kept_where_the_band_or_the_reward_allows_it():
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.config.inert import check_threshold_in_reward_range

    def check(*overrides):
        config = load_config(TOY, ["train.prompt_sampler.name=difficulty", *overrides])
        check_threshold_in_reward_range(config)

    check("train.prompt_sampler.success_threshold=0.99")  # inside [0, 1)
    check("train.prompt_sampler.success_threshold=1.0", "train.prompt_sampler.low=0.0")  # rate 0 is in the band
    check("train.prompt_sampler.success_threshold=-1", "train.prompt_sampler.high=1.0")  # rate 1 is in the band
    # weights stretch the range: 2 x toy_mode lies in [0, 2], so 1.5 can be passed
    check("train.prompt_sampler.success_threshold=1.5", "reward={toy_mode: 2.0}")
    with pytest.raises(Exception, match="give a threshold in \\[0, 2\\)"):
        check("train.prompt_sampler.success_threshold=2.0", "reward={toy_mode: 2.0}")


def test_reward_bounds_of_names_and_weighted_sums():
    from flowzoo import rewards

    assert rewards.bounds("toy_target") == (0.0, 1.0)
    assert rewards.bounds({"toy_mode": 2.0, "toy_target": -1.0}) == (-1.0, 2.0)
    assert rewards.bounds("pickscore") is None and rewards.bounds({"toy_mode": 1.0, "jpeg_compressibility": 1.0}) is None


def test_the_refusal_premise_no_group_is_kept_when_the_threshold_is_at_the_top():
    from flowzoo.algorithms.prompt_samplers.filters import BalancedDifficulty, DifficultyConfig

    sampler = BalancedDifficulty.__new__(BalancedDifficulty)
    sampler.config = DifficultyConfig(success_threshold=1.0)
    generator = torch.Generator().manual_seed(0)
    groups = [torch.rand(8, generator=generator) for _ in range(200)] + [torch.ones(8), torch.zeros(8)]
    assert not any(sampler.keeps(g) for g in groups)
    sampler.config = DifficultyConfig(success_threshold=0.5)
    assert any(sampler.keeps(g) for g in groups)


def test_a_metrics_file_over_the_size_bound_is_skipped_unread(tmp_path):
    """A 2 GiB metrics.csv (sparse: no disk used) was read whole into memory before any check."""
    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
    metrics = _write_run(runs, "flow_grpo", 2, [0.0] * 5)
    with open(metrics, "r+b") as handle:
        handle.truncate(2 << 30)
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "index.md").read_text()
    assert "skipped (unreadable): 1" in report and "2.0 GiB, over the 1 GiB a run's metrics may hold" in report
