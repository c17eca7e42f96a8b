"""The per-GPU memory estimate (benchmark/run/memory.py), its table (``flowzoo memory``) and the launch check of
``flowzoo train`` / ``bench``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from flowzoo import models
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run import memory
from flowzoo.benchmark.run.memory import (
    CALIBRATION, CALIBRATION_ERROR, GIB, estimate, fit_run, run_shape,
)
from flowzoo.benchmark.run.memory_table import cell_config, suite_estimates
from flowzoo.benchmark.run.suite import load_suite, suite_names
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PAPER_SUITES = [name for name in suite_names() if name.startswith("paper-")]
#: ``algorithm.rollout_batch``'s defaults, the released trainers' sampling batches (models' default_rollout_batch:
#: Flow-GRPO's SD3 config 9 per call, Wan 8, DanceGRPO/MixGRPO FLUX 1, Flow-GRPO Qwen-Image 4)
ROLLOUT_DEFAULTS = {"sd3": 9, "flux": 1, "qwen_image": 4, "wan": 8, "wan22": 1}


@pytest.fixture
def rollout_defaults(monkeypatch):
    """The models' ``default_rollout_batch`` where the class does not declare it yet (the estimate reads the class)."""
    for name, value in ROLLOUT_DEFAULTS.items():
        cls = models.get(name)
        if getattr(cls, "default_rollout_batch", None) is None:
            monkeypatch.setattr(cls, "default_rollout_batch", value, raising=False)


@pytest.fixture(autouse=True)
def no_budget(monkeypatch):
    monkeypatch.delenv(memory.BUDGET_ENV, raising=False)
    monkeypatch.setenv(memory.BYPASS_ENV, "0")  # restored at teardown, after --no-memory-check sets it to 1


def sd3_cell(*overrides: str, suite: str = "paper-sd3-ocr", task: str = "sd3_ocr", alg: str = "flow_grpo"):
    return cell_config(load_suite(suite), task, alg, tuple(overrides))


def test_parts_add_up_to_the_total():
    for shape, _ in CALIBRATION.values():
        est = estimate(shape)
        assert est.total == pytest.approx(sum(est.resident.values()) + est.kept_graphs + est.phases[est.peak_phase])
        assert est.phases[est.peak_phase] == max(est.phases.values())
    est = estimate(run_shape(sd3_cell(), 8))
    parts = est.parts()
    assert est.total == pytest.approx(sum(parts[k] for k in est.resident) + parts["kept graphs"]
                                      + parts[est.peak_phase])
    # the resident parts by formula: bf16 transformer and text encoders, float32 LoRA with gradient and 2 moments + EMA
    sd3 = models.get("sd3").architecture
    assert parts["transformer"] == pytest.approx(sd3.transformer_params * 2 / GIB)
    assert parts["text encoders"] == pytest.approx(sd3.text_encoder_params * 2 / GIB)
    assert parts["trainable state"] == pytest.approx(sd3.lora_widths["default"] * 32 * 4 * 5 / GIB)  # ema on


def test_update_grows_with_micro_batch_and_stops_at_the_minibatch():
    small, large = (estimate(run_shape(sd3_cell(f"algorithm.micro_batch={m}"), 8)) for m in (2, 8))
    assert large.phases["update"] == pytest.approx(4 * small.phases["update"])
    assert large.resident == small.resident
    # 144 samples a GPU, 2 minibatches of 576 global rows: the call holds at most the 144 local ones
    whole = run_shape(sd3_cell("algorithm.micro_batch=null"), 8)
    assert whole.update_rows == 144


def test_rollout_and_decode_grow_with_rollout_batch(monkeypatch):
    sizes = []
    for rows in (2, 9, 36):
        monkeypatch.setattr(models.get("sd3"), "default_rollout_batch", rows, raising=False)
        shape = run_shape(sd3_cell(), 8)
        assert shape.rollout_rows == shape.decode_rows == rows
        sizes.append(estimate(shape).phases)
    for a, b in zip(sizes, sizes[1:]):
        assert b["rollout"] > a["rollout"] and b["decode"] > a["decode"] and b["update"] == a["update"]
    monkeypatch.setattr(models.get("sd3"), "default_rollout_batch", None, raising=False)
    assert run_shape(sd3_cell(), 8).rollout_rows == 144  # None: all of the process's samples in one call


def test_every_activation_part_grows_with_resolution(rollout_defaults):
    totals = []
    for res in (256, 512, 1024):
        est = estimate(run_shape(sd3_cell(f"model.args.resolution={res}", "algorithm.minibatches=1",
                                          "algorithm.micro_batch=null", "train.prompts_per_step=8"), 8))
        totals.append(est)
    for a, b in zip(totals, totals[1:]):
        for part in ("batch", "kept graphs", "rollout", "decode"):
            assert b.parts()[part] > a.parts()[part], part
        assert b.total > a.total


def test_fsdp_divides_the_sharded_parts_only(rollout_defaults):
    config = cell_config(load_suite("paper-qwen-image-pickscore"), "qwen_image_pickscore", "flow_grpo_fast")
    sharded = cell_config(load_suite("paper-qwen-image-pickscore"), "qwen_image_pickscore", "flow_grpo_fast",
                          ("model.args.fsdp=true",))
    plain, split = estimate(run_shape(config, 8)), estimate(run_shape(sharded, 8))
    for part in ("transformer", "trainable state"):
        assert split.resident[part] == pytest.approx(plain.resident[part] / 8)
    for part in ("text encoders", "VAE", "batch"):
        assert split.resident[part] == plain.resident[part]
    qwen = models.get("qwen_image").architecture
    assert split.resident["FSDP gather"] == pytest.approx(2 * qwen.transformer_params / qwen.blocks * 2 / GIB)
    assert plain.resident["FSDP gather"] == 0
    assert split.phases == plain.phases


def test_the_estimate_holds_its_stated_error_on_the_first_gpu_run():
    for label, (shape, measured) in CALIBRATION.items():
        error = abs(estimate(shape).total - measured) / measured
        assert error <= CALIBRATION_ERROR, (label, estimate(shape).total, measured)
    docs = (ROOT / "docs" / "perf.md").read_text()
    assert f"within {CALIBRATION_ERROR:.0%}" in docs
    for label, (shape, measured) in CALIBRATION.items():  # the docs' table is the estimate's
        assert re.search(rf"\| {re.escape(label)} \| {measured} \| {estimate(shape).total:.1f} \|", docs), label


def test_the_table_counts_are_the_published_architectures():
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from flowzoo.benchmark.perf.gpu import SD35_MEDIUM
    from flowzoo.benchmark.perf.gpu_large import FLUX1_DEV, QWEN_IMAGE
    from flowzoo.models.diffusers_common import SD3_LORA_TARGETS, WAN_LORA_TARGETS
    from flowzoo.models.flux import FLUX_DANCE_GRPO_LORA_TARGETS, FLUX_LORA_TARGETS
    from flowzoo.models.qwen_image import QWEN_IMAGE_LORA_TARGETS
    from flowzoo.models.wan import WAN_ARCHES
    from flowzoo.models.wan22 import WAN22_ARCHES

    wan = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
               text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
               qk_norm="rms_norm_across_heads", eps=1e-6)
    builds = {"sd3": ("SD3Transformer2DModel", SD35_MEDIUM, {"default": SD3_LORA_TARGETS}),
              "flux": ("FluxTransformer2DModel", FLUX1_DEV, {"default": FLUX_LORA_TARGETS,
                                                             FLUX_DANCE_GRPO_LORA_TARGETS: FLUX_DANCE_GRPO_LORA_TARGETS}),
              "qwen_image": ("QwenImageTransformer2DModel", QWEN_IMAGE, {"default": QWEN_IMAGE_LORA_TARGETS}),
              "wan": ("WanTransformer3DModel", wan, {"default": WAN_LORA_TARGETS}),
              "wan-14b": ("WanTransformer3DModel", dict(wan, num_attention_heads=40, ffn_dim=13824, num_layers=40),
                          {"default": WAN_LORA_TARGETS}),
              "wan22": ("WanTransformer3DModel", dict(wan, num_attention_heads=40, ffn_dim=13824, num_layers=40),
                        {"default": WAN_LORA_TARGETS}),
              "wan22-ti2v": ("WanTransformer3DModel",
                             dict(wan, num_attention_heads=24, ffn_dim=14336, in_channels=48, out_channels=48),
                             {"default": WAN_LORA_TARGETS})}
    experts = {"wan22": 2}  # the A14B: two experts of this shape, a LoRA on each
    for key, (cls, config, targets) in builds.items():
        with torch.device("meta"):
            net = getattr(diffusers, cls)(**config)
        own = {"wan-14b": WAN_ARCHES[40], "wan22-ti2v": WAN22_ARCHES["TI2V-5B"]}
        arch = own.get(key) or models.get(key).architecture
        n = experts.get(key, 1)
        assert n * sum(p.numel() for p in net.parameters()) == arch.transformer_params, key
        for name, wanted in targets.items():  # peft's match: the module's name is the target or ends with .target
            width = sum(m.in_features + m.out_features for n, m in net.named_modules()
                        if isinstance(m, torch.nn.Linear) and any(n == t or n.endswith("." + t) for t in wanted))
            assert n * width == arch.lora_widths[name], (key, name)
        assert arch.hidden == net.config.num_attention_heads * net.config.attention_head_dim


def test_the_tiny_formula_counts_the_built_tiny_transformer():
    pytest.importorskip("diffusers")
    from flowzoo.models.tiny import TinyArch, build_networks

    _, text, transformer = build_networks(TinyArch())
    arch = memory.arch_of("tiny", {})
    built = sum(p.numel() for p in transformer.parameters())
    assert abs(arch.transformer_params - built) / built < 0.15
    assert arch.text_encoder_params < 2 * sum(p.numel() for p in text.parameters())


def test_a_run_that_does_not_fit_is_refused_in_one_line_naming_the_knob(monkeypatch):
    monkeypatch.setattr(models.get("sd3"), "default_rollout_batch", None, raising=False)
    with pytest.raises(ConfigError) as caught:  # 144 images decoded at once: ~72 GiB
        fit_run(sd3_cell(), 8, budget=(40.0, "a test GPU"))
    line = str(caught.value)
    assert "\n" not in line and "algorithm.rollout_batch" in line and "40.0 GiB of a test GPU" in line
    monkeypatch.setattr(models.get("sd3"), "default_rollout_batch", 9, raising=False)
    with pytest.raises(ConfigError) as caught:  # 144 samples in one update call without checkpointing
        fit_run(sd3_cell("algorithm.micro_batch=144", "model.args.gradient_checkpointing=false"), 8,
                budget=(40.0, "a test GPU"))
    line = str(caught.value)
    assert "algorithm.micro_batch" in line and "gradient_checkpointing=true" in line
    config = sd3_cell()
    assert fit_run(config, 8, budget=(40.0, "a test GPU")) == (config, None)


def test_auto_reuse_flips_only_when_the_kept_graphs_do_not_fit(rollout_defaults):
    keys = ("algorithm.minibatches=1", "algorithm.micro_batch=null", "train.prompts_per_step=1",
            "algorithm.group_size=8", "model.args.gradient_checkpointing=false")
    config = sd3_cell(*keys)
    kept = estimate(run_shape(config, 1))
    recompute = estimate(run_shape(sd3_cell(*keys, "algorithm.reuse_rollout_graph=false"), 1))
    assert kept.kept_graphs > 0 and recompute.kept_graphs == 0 and kept.total > recompute.total
    between = (kept.total + recompute.total) / 2 + memory.RESERVE_GIB
    flipped, note = fit_run(config, 1, budget=(between, "a test GPU"))
    assert flipped.algorithm["reuse_rollout_graph"] is False and "reuse_rollout_graph auto -> false" in note
    assert config.algorithm["reuse_rollout_graph"] == "auto"  # the caller's config is left as it was
    from flowzoo.benchmark.run.checkpoints import config_digest

    assert config_digest(flipped) == config_digest(config)  # an execution key: the same run
    roomy = kept.total + memory.RESERVE_GIB + 1
    assert fit_run(config, 1, budget=(roomy, "a test GPU")) == (config, None)
    with pytest.raises(ConfigError, match="reuse_rollout_graph=false"):  # neither fits
        fit_run(config, 1, budget=(recompute.total, "a test GPU"))
    with pytest.raises(ConfigError, match="reuse_rollout_graph=false"):  # asked for: never flipped
        fit_run(sd3_cell(*keys, "algorithm.reuse_rollout_graph=true"), 1, budget=(between, "a test GPU"))


def test_cpu_runs_are_unchecked_and_unchanged(tmp_path, monkeypatch, capsys):
    from flowzoo.benchmark.run.loading import load_config

    config = load_config(ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml", ["train.steps=2", "train.eval_every=0",
                         "train.eval_samples_per_prompt=2", f"run_dir={tmp_path / 'a'}"])
    assert memory.device_budget(config) is None
    assert fit_run(config, 1) == (config, None)
    assert main(["train", str(ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"), "--quiet", "train.steps=2",
                 "train.eval_every=0", "train.eval_samples_per_prompt=2", f"run_dir={tmp_path / 'a'}"]) == 0
    monkeypatch.setenv(memory.BUDGET_ENV, "1000")  # a budget it fits: the same run, bit for bit
    assert main(["train", str(ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"), "--quiet", "train.steps=2",
                 "train.eval_every=0", "train.eval_samples_per_prompt=2", f"run_dir={tmp_path / 'b'}"]) == 0
    import pandas as pd

    a, b = (pd.read_csv(tmp_path / d / "metrics.csv") for d in ("a", "b"))
    from flowzoo.benchmark.run.runner import TIMING_COLUMNS

    pd.testing.assert_frame_equal(a.drop(columns=TIMING_COLUMNS, errors="ignore"),
                                  b.drop(columns=TIMING_COLUMNS, errors="ignore"))
    monkeypatch.setenv(memory.BUDGET_ENV, "1e-9")  # a budget nothing fits: refused before anything is written
    capsys.readouterr()
    args = ["train", str(ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"), "--quiet", "train.steps=2",
            f"run_dir={tmp_path / 'c'}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "memory estimate" in err and "change " in err
    assert not (tmp_path / "c").exists()
    assert main([*args, "--no-memory-check"]) == 0  # the bypass
    monkeypatch.setenv(memory.BYPASS_ENV, "0")
    monkeypatch.setenv(memory.BUDGET_ENV, "lots")
    with pytest.raises(ConfigError, match="FLOWZOO_DEVICE_MEMORY_GIB"):
        memory.device_budget(config)


@pytest.mark.parametrize("suite_name", PAPER_SUITES)
def test_every_paper_cell_fits_80_gib_at_its_released_gpu_count(suite_name, rollout_defaults):
    suite = load_suite(suite_name)
    assert suite.released_gpus == 8
    for row in suite_estimates(suite):
        assert row.shape.processes == 8
        assert row.estimate.total + memory.RESERVE_GIB <= 80, (row.cell, row.estimate.parts())


def test_memory_command_prints_every_cell_with_its_parts(capsys, rollout_defaults):
    assert main(["memory", "paper-wan-video", "--algorithms", "flow_grpo,awm"]) == 0
    out = capsys.readouterr().out
    assert "at 8 GPU(s)" in out and "wan_video_ocr/flow_grpo" in out and "wan_video_ocr/awm" in out
    assert "wan_video_ocr/dance_grpo" not in out
    for part in ("transformer", "text encoders", "kept graphs", "rollout", "decode", "update", "total"):
        assert f"| {part} " in out or f" {part} |" in out
    assert main(["memory", "paper-wan-video", "--algorithms", "flow_grpo", "--gpus", "1", "--device-memory",
                 "10"]) == 1
    out = capsys.readouterr().out
    assert "at 1 GPU(s)" in out and "| NO: " in out
    assert main(["memory", "paper-wan-video", "--gpus", "0"]) == 2
    with pytest.raises(SystemExit):
        main(["memory", "--help"])
    assert "--device-memory" in capsys.readouterr().out


def test_docs_table_is_the_estimate(rollout_defaults):
    docs = (ROOT / "docs" / "perf.md").read_text()
    section = docs.split("## Memory at the paper recipes", 1)[1]
    from flowzoo.benchmark.run.memory_table import report

    for name in PAPER_SUITES:
        text, every_fit = report(load_suite(name))
        assert every_fit
        for line in text.splitlines()[3:]:
            assert line in section, line


def test_an_algorithm_reading_more_than_the_stand_in_gets_the_template_plan(monkeypatch):
    """The estimate builds the algorithm on the config check's model stand-in; where its plan reads more of the model,
    the trained steps fall back to the template's ``timestep_fraction`` of T and the graph rule is still the
    algorithm's own ``keeps_rollout_graph``."""
    from types import SimpleNamespace

    from flowzoo import algorithms

    cls = algorithms.get("flow_grpo")
    monkeypatch.setattr(cls, "step_plan", lambda self, batch: self.model.latent_shape)  # not on the stand-in
    config = SimpleNamespace(algorithm_name="flow_grpo", model=SimpleNamespace(name="toy2d"), seed=0)
    for reuse, minibatches, keeps in (("auto", 1, True), ("auto", 2, False), (False, 1, False), (True, 1, True)):
        alg_cfg = cls.typed_config({"num_steps": 10, "minibatches": minibatches, "reuse_rollout_graph": reuse})
        assert memory._plan_facts(config, alg_cfg, 8, 10) == (9, keeps)


def test_recorded_step_means_count_in_the_batch(rollout_defaults):
    """Flow-DPPO's and GRPO-Guard's trajectories keep each step's Gaussian mean beside the T + 1 latents
    (``Algorithm.records_means``): T more float32 latents per sample, resident through the update."""
    shape = run_shape(sd3_cell(), 8)
    assert not shape.records_means
    with_means = estimate(dataclasses.replace(shape, records_means=True))
    extra = shape.samples * shape.num_steps * shape.latent_numbers * 4 / GIB
    assert with_means.resident["batch"] - estimate(shape).resident["batch"] == pytest.approx(extra)
    assert extra == pytest.approx(144 * 10 * 16 * 64 * 64 * 4 / GIB)  # 0.35 GiB a GPU at the paper recipe (512 px)
    for name in ("flow_dppo", "grpo_guard"):
        assert run_shape(sd3_cell(f"algorithm.name={name}"), 8).records_means, name
