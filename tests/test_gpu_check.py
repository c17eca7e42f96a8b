"""``flowzoo perf --gpu-check``'s code path (benchmark/perf/gpu.py) with tiny dimensions on the CPU: the random SD3.5-
Medium-style transformer (dual attention, QK-norm) under the SD3 adapter's code, both Flow-GRPO variants against the
reference loop with the gradient check holding in float32, and OP-GRPO iterations that replay buffer samples."""

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from benchmark.perf import gpu as perf_gpu  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402


def test_dry_run_of_the_gpu_check(capsys):
    results = dict(perf_gpu.dry_run())
    assert list(results) == ["flow_grpo, recompute", "flow_grpo, defaults", "op_grpo"]
    recompute, defaults = results["flow_grpo, recompute"], results["flow_grpo, defaults"]
    assert not recompute["keeps_rollout_graph"] and defaults["keeps_rollout_graph"]
    for result in (recompute, defaults):
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
