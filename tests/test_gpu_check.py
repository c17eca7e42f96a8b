"""``flowzoo perf --gpu-check``'s code path (benchmark/perf/gpu.py) with tiny dimensions on the CPU: the random SD3.5-
Medium-style transformer (dual attention, QK-norm) under the SD3 adapter's code, both Flow-GRPO variants against the
reference loop with the gradient check holding in float32, and OP-GRPO iterations that replay buffer samples."""

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from flowzoo.benchmark.perf import gpu as perf_gpu  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402


def test_dry_run_of_the_gpu_check(capsys):
    results = dict(perf_gpu.dry_run())
    assert list(results) == ["flow_grpo, recompute", "flow_grpo, recompute, batched CFG", "flow_grpo, defaults",
                             "op_grpo"]
    recompute, defaults = results["flow_grpo, recompute"], results["flow_grpo, defaults"]
    batched = results["flow_grpo, recompute, batched CFG"]
    assert not recompute["keeps_rollout_graph"] and defaults["keeps_rollout_graph"]
    assert not batched["keeps_rollout_graph"] and not batched["split_cfg"] and batched["config"]["cfg_batch"] == "batched"
    for result in (recompute, batched, defaults):
        assert result["grad_rel_diff"] < 1e-5
        assert result["ours"]["total"] > 0 and result["reference"]["total"] > 0
    assert defaults["activations_gib"]["ours"] > recompute["activations_gib"]["ours"]  # the kept graphs
    assert results["op_grpo"]["off_policy_frac"] > 0 and results["op_grpo"]["seconds"] > 0
    out = capsys.readouterr().out
    assert "s/iteration" in out and "gradient relative difference" in out


def test_architecture_is_sd35_medium():
    arch = perf_gpu.SD35_MEDIUM
    assert (arch["num_layers"], arch["num_attention_heads"], arch["attention_head_dim"]) == (24, 24, 64)
    assert arch["dual_attention_layers"] == tuple(range(13)) and arch["joint_attention_dim"] == 4096
    assert (arch["pooled_projection_dim"], arch["in_channels"], arch["caption_projection_dim"]) == (2048, 16, 1536)


def test_gpu_check_refuses_the_cpu():
    with pytest.raises(ConfigError, match="device 'cpu' is not a GPU"):
        perf_gpu.main("cpu", {})


def test_dry_run_of_the_flux_and_qwen_image_checks(capsys):
    """FLUX- and Qwen-Image-shaped random transformers under the adapters' code, each at its released recipe."""
    from flowzoo.benchmark.perf import gpu_large

    results = dict(gpu_large.dry_run())
    assert list(results) == ["flux: dance_grpo", "flux: mix_grpo", "qwen_image: flow_grpo_fast"]
    for result in results.values():
        assert result["seconds"] > 0 and result["peak_gib"] > 0 and result["num_steps"] == 6
    assert results["flux: dance_grpo"]["nfe"] == 2 * 6  # G 2 x T 6, no CFG (FLUX's guidance is distilled)
    assert results["qwen_image: flow_grpo_fast"]["nfe"] == 2 * 2 * 6  # true CFG 4 doubles each call
    out = capsys.readouterr().out
    assert out.count("s/iteration") == 3 and "peak memory" in out


def test_large_architectures_are_the_released_configs():
    from flowzoo.benchmark.perf import gpu_large

    flux, qwen = gpu_large.FLUX1_DEV, gpu_large.QWEN_IMAGE
    assert (flux["num_layers"], flux["num_single_layers"], flux["joint_attention_dim"]) == (19, 38, 4096)
    assert flux["guidance_embeds"] and (qwen["num_layers"], qwen["joint_attention_dim"]) == (60, 3584)
