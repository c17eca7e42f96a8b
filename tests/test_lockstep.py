"""The lockstep check (algorithms/engine/lockstep.py): what the ledger records of a model's transformer calls, and the one-line
error when processes differ; the torch version FSDP sharding needs; the FLUX and Qwen-Image adapters' full
fine-tuning (the path the paper suites' sharded rehearsal runs)."""

from __future__ import annotations

import pytest
import torch

from flowzoo.algorithms.engine.distributed import SingleProcess
from flowzoo.algorithms.engine.lockstep import CallLedger, LockstepError, describe
from flowzoo.errors import ConfigError
from flowzoo.models.tiny import TinyModel

ARCH = {"layers": 1, "heads": 2, "head_dim": 8, "text_width": 16, "text_layers": 1, "text_heads": 2}


class TwoProcesses(SingleProcess):
    """A stand-in for 2 processes: ``all_gather_object`` returns this process's object and the peer's."""

    world_size = 2

    def __init__(self, peer):
        self.peer = peer

    def all_gather_object(self, obj):
        return [obj, self.peer]


def _calls(model):
    x = model.initial_noise([torch.Generator().manual_seed(0)])
    sigma, cond = torch.tensor([0.5]), model.encode(["a red circle"])
    return x, sigma, cond


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_ledger_records_forwards_graphs_and_backwards_per_phase(finetune):
    model = TinyModel(weights=None, arch=ARCH, finetune=finetune)
    ledger = CallLedger.attach(model)
    assert CallLedger.attach(model) is ledger  # one per model, however many algorithms are built on it
    x, sigma, cond = _calls(model)
    with ledger.phase("rollout"), torch.no_grad():
        model.velocity(x, sigma, cond, guidance=1.0)
        model.velocity(x, sigma, cond, guidance=4.5)  # CFG without autograd: one batched call
    with ledger.phase("update"):
        v = model.velocity(x, sigma, cond, guidance=4.5, cfg_batch="split")  # autograd: cond call + no-grad uncond
        with torch.no_grad(), model.reference():
            model.velocity(x, sigma, cond, guidance=1.0)
        v.sum().backward()
    reference = "F" if finetune == "full" else "f"  # a full fine-tuning's reference is its own (sharded) module
    assert {k: "".join(v) for k, v in ledger.events.items()} == {"rollout": "ff", "update": f"gf{reference}b"}
    assert describe("gffb") == "2 forward, 1 forward+grad, 1 backward" and describe("") == "no call"


def test_equal_calls_pass_and_a_difference_is_one_line_naming_the_phase_and_the_counts():
    ledger = CallLedger.attach(TinyModel(weights=None, arch=ARCH))
    ledger.events = {"rollout": list("fff"), "update": list("gb")}
    ledger.check(TwoProcesses({"rollout": "fff", "update": "gb"}), "training step 2")
    assert ledger.events == {}  # cleared after each check

    ledger.events = {"rollout": list("fff"), "update": list("gb")}
    with pytest.raises(LockstepError) as err:
        ledger.check(TwoProcesses({"rollout": "ffff", "update": "gb"}), "training step 2")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("lockstep broken at training step 2, phase 'rollout'")
    assert "rank 0: 3 forward; rank 1: 4 forward" in message

    ledger.events = {"update": list("gfgb")}  # same counts, another order: still a mismatch of collectives
    with pytest.raises(LockstepError, match=r"phase 'update'.*same counts, another order: call 2 is forward on rank 0, "
                                            r"forward\+grad on rank 1"):
        ledger.check(TwoProcesses({"update": "ggfb"}), "training step 3")

    ledger.events = {}  # a phase one process never entered
    with pytest.raises(LockstepError, match=r"phase 'evaluation'.*rank 0: no call; rank 1: 1 forward"):
        ledger.check(TwoProcesses({"evaluation": "f"}), "the evaluation at step 2")


def test_sharding_asked_on_a_torch_without_sum_reductions_fails_in_one_line(monkeypatch):
    from torch.distributed.fsdp import FSDPModule

    from flowzoo import models
    from flowzoo.models.sharding import check_request

    monkeypatch.delattr(FSDPModule, "set_force_sum_reduction_for_comms")
    with pytest.raises(ConfigError, match=r"FSDP sharding needs torch >= 2.8 .*; this is torch "):
        check_request(models.get("tiny"), {"fsdp": True})
    check_request(models.get("tiny"), {})  # no sharding asked: nothing to check


@pytest.mark.parametrize("name", ["flux", "qwen_image"])
def test_flux_and_qwen_image_take_full_fine_tuning(name, tmp_path):
    pytest.importorskip("diffusers")
    from flowzoo.models.flux import FluxModel
    from flowzoo.models.qwen_image import QwenImageModel
    from tests import tiny_pipelines as tiny

    if name == "flux":
        (tmp_path / "tok").mkdir()
        model = FluxModel(path=tiny.build_tiny_flux(tmp_path / "model", tmp_path / "tok"), finetune="full",
                          resolution=tiny.FLUX_RESOLUTION, max_sequence_length=tiny.FLUX_MAX_SEQ)
    else:
        model = QwenImageModel(path=tiny.build_tiny_qwen_image(tmp_path / "model"), finetune="full",
                               resolution=tiny.QWEN_RESOLUTION, max_sequence_length=tiny.QWEN_MAX_SEQ)
    trained = model.trainable_parameters()
    assert model.finetune == "full"
    assert sum(p.numel() for p in trained) == sum(p.numel() for p in model.transformer.parameters())
    assert len(model.fsdp_modules()) == 2  # the trained transformer and its frozen reference copy, both sharded
    assert not any(p.requires_grad for p in model.fsdp_modules()[1].parameters())


@pytest.mark.parametrize("name", ["diffusion_nft", "awm"])
def test_ready_padding_parts_train_nothing_and_count_no_nfe(name, toy_prompts):
    """``Algorithm.update_parts`` hands DiffusionNFT and AWM their padding parts ready (one row of a padding
    trajectory, its own forward draws, weight 0): a process 2 parts short of another in every minibatch (forced here,
    in one process) makes their calls and ends the step with the weights, statistics and NFE of the unpadded step."""
    from flowzoo import algorithms, models, rewards

    def step(padding: int):
        model = models.get("toy2d")()
        config = {"group_size": 4, "lr": 1e-3, "minibatches": 2, "micro_batch": 3, "max_grad_norm": 0.0}
        alg = algorithms.get(name)(model, rewards.build("toy_mode"), config, seed=0)
        asked, velocity = [], model.velocity
        if padding:
            alg.lockstep_padding = lambda parts: asked.append(parts) or padding
        calls = []
        model.velocity = lambda *args, **kwargs: calls.append(1) or velocity(*args, **kwargs)
        stats = alg.step(*toy_prompts)
        return stats, [p.detach().clone() for p in model.trainable_parameters()], len(calls), asked

    plain, plain_weights, plain_calls, _ = step(0)
    padded, padded_weights, padded_calls, asked = step(2)
    assert asked and all(parts >= 1 for parts in asked)  # every minibatch asked, with its real parts
    assert padded_calls > plain_calls  # the padding parts' calls ran
    assert padded.nfe_training == plain.nfe_training  # and were not counted
    for mine, theirs in zip(padded_weights, plain_weights):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    for field in ("loss", "kl", "grad_norm", "clip_frac", "ratio_mean"):
        assert getattr(padded, field) == getattr(plain, field), field
