"""``flowzoo perf --gpu-check`` (benchmark/perf/gpu.py, gpu_large.py, gpu_plan.py, paired.py) on the CPU: the plan
lists every variant with its expected memory and H100 seconds inside the 8-minute budget; the dry run runs every
variant at tiny sizes in float32, each variant with a reference prints its ratio ours / reference and its reference's
gradient equals ours; a variant that would not fit is skipped by its expected memory, one that would pass the budget
by its expected time; an allocation failure of any kind ends only its own variant; models are built directly in bf16;
and the check runs from the repository root with no install of FlowZoo (the registry-less GPU machine's way)."""

import importlib
import os
import subprocess
import sys
import sysconfig
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from flowzoo.benchmark.perf import gpu as perf_gpu  # noqa: E402
from flowzoo.benchmark.perf import gpu_large, gpu_plan  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
H100_GIB = 81559 / 1024  # an H100 80GB HBM3's memory as the driver reports it


def test_plan_fits_the_budget_and_lists_memory():
    names = [v.name for v in gpu_plan.DEFAULT]
    assert "sd3: flow_grpo, kept rollout graph" not in names  # 85.6 GiB measured: not in the default list
    assert gpu_plan.REPEATS == 3
    total = gpu_plan.plan_total_s()
    # the total is the start-up, one build per family and every default variant, each the H200 figure x 1.15
    builds = sum(b.h200_s for b in gpu_plan.BUILDS if b.family in {v.family for v in gpu_plan.DEFAULT})
    assert total == pytest.approx(1.15 * (gpu_plan.STARTUP_H200_S + builds + sum(v.h200_s for v in gpu_plan.DEFAULT)))
    assert total < 8 * 60 == gpu_plan.BUDGET_S
    assert all(v.fits(H100_GIB) for v in gpu_plan.DEFAULT)  # every default variant fits an H100 by the estimate
    assert not next(v for v in gpu_plan.VARIANTS if v.name == "sd3: flow_grpo, kept rollout graph").fits(H100_GIB)
    assert {v.reference for v in gpu_plan.DEFAULT} == {"flow_grpo_sd3", "dance_grpo", "mix_grpo", "flow_grpo_fast"}
    # the memory column is the launch check's estimate: the batched recompute update at the released loop's measured
    # 23.1 GiB (the same rows per call), within the estimate's stated 2%
    recompute = next(v for v in gpu_plan.DEFAULT if v.name == "sd3: flow_grpo, recompute")
    assert recompute.expected_gib == pytest.approx(23.1, rel=0.02)
    plan = gpu_plan.format_plan(gpu_plan.DEFAULT, H100_GIB)
    for v in gpu_plan.VARIANTS:
        assert v.name in plan and f"{v.expected_gib:.1f}" in plan and f"{v.expected_s:.0f}" in plan
    assert f"total {total:.0f} s expected on an H100" in plan and "not run: sd3: flow_grpo, kept rollout graph" in plan


def test_plan_from_the_command_line(capsys):
    from flowzoo.benchmark.cli import main

    assert main(["perf", "--gpu-check", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "budget 480 s" in out and out.count("yes") == 4  # the four default variants with a reference
    assert main(["perf", "--plan"]) == 2  # --plan belongs to --gpu-check
    assert "use it with --gpu-check" in capsys.readouterr().err


def test_dry_run_of_the_gpu_check(capsys):
    """Every variant at tiny sizes, an 80 GB device: the kept-graph variant is skipped by its memory, the others run;
    each with a reference prints its ratio and its reference's gradient equals ours in float32."""
    results = dict(perf_gpu.dry_run(variants=gpu_plan.VARIANTS, device_gib=H100_GIB))
    assert list(results) == [v.name for v in gpu_plan.VARIANTS]
    kept = results["sd3: flow_grpo, kept rollout graph"]
    assert isinstance(kept, str) and kept.startswith("skipped: estimated ") and "> 79.6 GiB of device memory" in kept
    out = capsys.readouterr().out
    referenced = [v for v in gpu_plan.VARIANTS if v.reference and v.name != "sd3: flow_grpo, kept rollout graph"]
    assert len(referenced) == 5
    for v in referenced:
        result = results[v.name]
        assert result["ours"] > 0 and result["reference"] > 0 and result["reference_calls"] > 0
        assert result["ratio"] == pytest.approx(result["ours"] / result["reference"])
        assert result["grad_rel_diff"] < 1e-5
        assert result["num_steps"] == 6
    assert out.count("ratio ours/reference: iteration") == len(referenced)
    assert results["sd3: op_grpo"]["off_policy_frac"] > 0
    recompute, split = results["sd3: flow_grpo, recompute"], results["sd3: flow_grpo, recompute, split CFG (former auto)"]
    assert not recompute["keeps_rollout_graph"] and split["config"]["cfg_batch"] == "split"
    # the released structures' calls with gradient, counted over the update: SD3 one per trained timestep over the
    # batch (5 of T 6, one minibatch); the FLUX / Qwen-Image recipes' minibatches (2, 4 capped at the 2 samples) make
    # two optimizer steps of one sample each: Flow-GRPO-Fast one call per window step (2), DanceGRPO one per (sample,
    # trained timestep) (int(0.6 x 5) = 3), MixGRPO likewise over its window of 4
    assert recompute["reference_calls"] == 5
    assert results["qwen_image: flow_grpo_fast"]["reference_calls"] == 2 * 2
    assert results["flux: dance_grpo"]["reference_calls"] == 2 * 3
    assert results["flux: mix_grpo"]["reference_calls"] == 2 * 4


def test_budget_skips_a_variant_that_would_end_past_it(capsys):
    first, second = [v for v in gpu_plan.VARIANTS if v.family == "sd3"][:2]  # one build, two variants
    ticks = iter(range(0, 10_000, 30))  # a clock that advances 30 s each time the budget reads it
    # read at the start (0 s), before the build (30), before each variant (60, 90): the first fits, the second not
    budget = gpu_plan.Budget(limit_s=60 + first.expected_s + 1, startup_s=0.0, clock=lambda: next(ticks))
    assert 30 + gpu_plan.BUILDS[0].expected_s + min(first.expected_s, second.expected_s) <= budget.limit_s
    assert 90 + second.expected_s > budget.limit_s
    results = dict(perf_gpu.dry_run(variants=(first, second), budget=budget))
    assert isinstance(results[first.name], dict)
    assert results[second.name].startswith("skipped: ") and "would pass the budget" in results[second.name]
    assert "would pass the budget" in capsys.readouterr().out


ALLOCATION_FAILURES = [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: out of memory"),
]
if hasattr(torch, "AcceleratorError"):
    ALLOCATION_FAILURES.append(torch.AcceleratorError("CUDA error: out of memory"))


@pytest.mark.parametrize("error", ALLOCATION_FAILURES, ids=lambda e: type(e).__name__ + ":" + str(e)[:24])
def test_an_allocation_failure_ends_only_its_variant(monkeypatch, capsys, error):
    plain = perf_gpu.run_one
    first, second = [v for v in gpu_plan.VARIANTS if v.family == "sd3"][:2]  # one build, two variants
    freed = []
    monkeypatch.setattr(gpu_plan, "free_memory", lambda: freed.append(1))

    def run_one(model, variant, *args, **kwargs):
        if variant is first:
            raise error
        return plain(model, variant, *args, **kwargs)

    monkeypatch.setattr(perf_gpu, "run_one", run_one)
    results = dict(perf_gpu.dry_run(variants=(first, second)))
    assert results[first.name].startswith(f"allocation failure, variant abandoned: {type(error).__name__}: ")
    assert results[second.name]["ratio"] > 0  # the next variant ran
    assert freed  # memory freed after the failure
    assert results[first.name] in capsys.readouterr().out


def test_other_errors_are_not_swallowed(monkeypatch):
    monkeypatch.setattr(perf_gpu, "run_one", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        perf_gpu.dry_run(variants=gpu_plan.DEFAULT[:1])
    assert not gpu_plan.is_allocation_failure(ValueError("out of memory"))  # only RuntimeErrors by message


@pytest.mark.parametrize("family", ["sd3", "flux", "qwen_image"])
def test_models_are_built_directly_in_bf16(family):
    """Every parameter is registered in bf16 (none is created in float32 and cast), the build leaves torch's default
    dtype as it was, and the parameters and floating buffers end in bf16."""
    from torch.nn.modules.module import register_module_parameter_registration_hook

    registered = []
    handle = register_module_parameter_registration_hook(lambda module, name, p: registered.append(p.dtype))
    try:
        model = perf_gpu.build(family, "cpu", "bfloat16", tiny=True)
    finally:
        handle.remove()
    assert torch.get_default_dtype() == torch.float32
    frozen = [p for p in model.transformer.parameters() if not p.requires_grad]
    assert frozen and {p.dtype for p in frozen} == {torch.bfloat16}
    assert all(b.dtype == torch.bfloat16 for b in model.transformer.buffers() if b.is_floating_point())
    # registered at construction: the transformer's parameters in bf16; the LoRA's (added after, float32 by design)
    n_base = len(frozen)
    assert registered[:n_base] == [torch.bfloat16] * n_base


def test_default_dtype_is_restored_after_a_failed_build():
    with pytest.raises(TypeError):
        gpu_large.random_transformer("FluxTransformer2DModel", {"no_such_argument": 1}, torch.device("cpu"),
                                     torch.bfloat16, 0)
    assert torch.get_default_dtype() == torch.float32


def test_gpu_check_refuses_the_cpu():
    with pytest.raises(ConfigError, match="device 'cpu' is not a GPU"):
        perf_gpu.main("cpu", {})


def test_architecture_is_sd35_medium():
    arch = perf_gpu.SD35_MEDIUM
    assert (arch["num_layers"], arch["num_attention_heads"], arch["attention_head_dim"]) == (24, 24, 64)
    assert arch["dual_attention_layers"] == tuple(range(13)) and arch["joint_attention_dim"] == 4096
    assert (arch["pooled_projection_dim"], arch["in_channels"], arch["caption_projection_dim"]) == (2048, 16, 1536)


def test_large_architectures_are_the_released_configs():
    flux, qwen = gpu_large.FLUX1_DEV, gpu_large.QWEN_IMAGE
    assert (flux["num_layers"], flux["num_single_layers"], flux["joint_attention_dim"]) == (19, 38, 4096)
    assert flux["guidance_embeds"] and (qwen["num_layers"], qwen["joint_attention_dim"]) == (60, 3584)


# ---- offline: no install of FlowZoo, wheels installed with no index -------------------------------------------------
def _fake_wheel(directory: Path) -> Path:
    """A one-module wheel (what pip needs: the module, METADATA, WHEEL, RECORD)."""
    path = directory / "flowzoo_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("flowzoo_probe.py", "VALUE = 42\n")
        wheel.writestr("flowzoo_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: flowzoo-probe\nVersion: 1.0\n")
        wheel.writestr("flowzoo_probe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                            "Tag: py3-none-any\n")
        wheel.writestr("flowzoo_probe-1.0.dist-info/RECORD", "")
    return path


def test_wheels_install_offline_and_come_first(tmp_path, monkeypatch):
    from flowzoo.benchmark.perf.offline import install_wheels

    monkeypatch.setattr(sys, "path", list(sys.path))
    _fake_wheel(tmp_path)
    target = install_wheels(str(tmp_path), str(tmp_path / "site"))
    assert sys.path[0] == target
    probe = importlib.import_module("flowzoo_probe")  # the fake wheel's module (no installed package provides it)

    assert probe.VALUE == 42
    sys.modules.pop("flowzoo_probe")
    with pytest.raises(ConfigError, match="no \\*.whl in"):
        install_wheels(str(tmp_path / "site"))


def test_the_check_runs_from_the_checkout_without_an_install(tmp_path):
    """As on the registry-less GPU machine: the editable install hidden (``-S``: no site-packages .pth files, so
    no editable finder), only the third-party packages on PYTHONPATH, run from the repository root: ``python -m
    flowzoo perf --gpu-check --plan --wheels DIR`` imports FlowZoo from the checkout and the carried wheel offline."""
    _fake_wheel(tmp_path)
    site = sysconfig.get_paths()["purelib"]
    probe = ("import runpy, sys; sys.argv = ['flowzoo', 'perf', '--gpu-check', '--plan']; "
             "from flowzoo.benchmark.perf.offline import install_wheels; install_wheels(sys.argv.pop() if False else "
             f"{str(tmp_path)!r}); import flowzoo_probe, flowzoo, flowzoo.benchmark.perf.gpu as g; "
             "print('FROM', flowzoo.__file__, g.__file__, flowzoo_probe.VALUE); "
             "runpy.run_module('flowzoo', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONPATH=site, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("FROM"))
    _, init, gpu_file, value = line.split()
    assert Path(init) == ROOT / "flowzoo" / "__init__.py" and Path(gpu_file) == ROOT / "benchmark" / "perf" / "gpu.py"
    assert value == "42" and "total " in done.stdout and "expected on an H100" in done.stdout


def test_host_syncs_are_counted_on_a_gpu_only(monkeypatch):
    """``counted_syncs``: on a GPU the sync debug mode's warnings are counted and the previous mode restored (here the
    mode switch is simulated: no GPU); elsewhere nothing is counted."""
    from flowzoo.benchmark.perf.paired import counted_syncs

    into: dict = {}
    with counted_syncs("cpu", into):
        pass
    assert into == {}
    modes = ["error"]
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: modes.append(mode))
    with counted_syncs("cuda:0", into):
        warnings.warn("called a synchronizing CUDA operation", UserWarning)
        warnings.warn("another warning", UserWarning)
        warnings.warn("called a synchronizing CUDA operation", UserWarning)
    assert into == {"host_syncs": 2} and modes == ["error", "warn", 2]
