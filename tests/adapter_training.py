"""One or two training iterations of an algorithm on a (tiny random) diffusers adapter: shared by the SD3 and Wan
adapter tests so both check the same things."""

import importlib.util

import pytest
import torch

from flowzoo import algorithms
from flowzoo.benchmark.perf.pipeline import MeanBrightness  # noqa: F401  (shared with flowzoo perf)


#: one preset of every algorithm family (the ablation presets change no model call)
EVERY_ALGORITHM = ["flow_grpo", "flow_grpo_fast", "dance_grpo", "mix_grpo", "mix_grpo_flash", "op_grpo", "diffusion_nft",
                   "awm", "flow_dppo", "grpo_guard"]
#: what each algorithm needs on a 3-step rollout beside the shared config (its windows fit T = 3)
SMALL_T = {
    "op_grpo": {"t_off": 1},
    "flow_grpo_fast": {"sde_window_size": 1},
    "mix_grpo": {"window_size": 1},
    "mix_grpo_flash": {"window_size": 1},
}


def check_training(model, algorithm: str, prompts=("a red cube", "a blue ball"), metadata=None) -> None:
    """``metadata``: the prompts' metadata (an edit model's source images), None for text-only prompts."""
    config = {"group_size": 2, "num_steps": 3, "kl_beta": 0.04, "clip_range": 1e-3, "lr": 1e-2, "micro_batch": 2,
              **SMALL_T.get(algorithm, {})}
    alg = algorithms.get(algorithm)(model, MeanBrightness(), config, seed=0)
    base = {n: p.detach().clone() for n, p in model.transformer.named_parameters() if not p.requires_grad}
    lora = {k: v.clone() for k, v in model.trainable_state_dict().items()}
    first = alg.step(list(prompts), metadata)
    assert abs(first.ratio_mean - 1) < 1e-4 and first.clip_frac == 0.0  # on-policy first update
    assert all(torch.isfinite(torch.tensor(v)) for v in (first.loss, first.grad_norm, first.kl))
    # G 2 x prompts samples x 3 steps, doubled by CFG where the model's default guidance is on
    full = 2 * len(prompts) * model.cfg_factor() * 3
    if algorithm == "mix_grpo_flash":  # its DPM-Solver tail takes fewer points than the steps it replaces
        assert 0 < first.nfe_sampling < full
    else:
        assert first.nfe_sampling == full
    changed = [k for k, v in model.trainable_state_dict().items() if not torch.equal(v, lora[k])]
    assert changed, "no LoRA weight changed"
    assert all(torch.equal(p, base[n]) for n, p in model.transformer.named_parameters() if n in base)
    if algorithm.startswith("op_grpo"):
        second = alg.step(list(prompts), metadata)  # the buffer now holds one trajectory per prompt
        assert second.extra["off_policy_frac"] > 0 and torch.isfinite(torch.tensor(second.loss))



def check_op_grpo_replays_edits(model, metadata, monkeypatch, instruction: str = "make it red") -> None:
    """One instruction on the two sources of ``metadata`` (tensors) is two conditions: OP-GRPO's buffer keeps an entry
    for each, and a replayed sample's condition is encoded with the source its entry was sampled from."""
    from flowzoo.algorithms.methods.op_grpo import OPGRPO
    from flowzoo.source_images import SOURCE_IMAGE, condition_key

    prompts = [instruction] * 2
    config = {"group_size": 2, "num_steps": 3, "kl_beta": 0.0, "clip_range": 1e-3, "lr": 1e-2, "micro_batch": 2,
              "t_off": 1, "off_policy_groups": 1.0, "buffer_admission": "any"}
    alg = algorithms.get("op_grpo")(model, MeanBrightness(), config, seed=0)
    alg.step(prompts, metadata)
    assert len(alg.buffer) == 2
    keys = {condition_key(e.prompt, e.metadata) for e in alg.buffer.entries}
    assert keys == {condition_key(p, m) for p, m in zip(prompts, metadata)}
    seen = []
    original = OPGRPO._replay_inputs

    def spy(self, groups, prompts, metadata, rows):
        inputs, stored, pi_off = original(self, groups, prompts, metadata, rows)
        order = [e for _, entries in groups.items() for e in entries][rows.start: rows.stop]
        seen.extend((e.metadata[SOURCE_IMAGE], m[SOURCE_IMAGE]) for e, m in zip(order, inputs.metadata))
        return inputs, stored, pi_off

    monkeypatch.setattr(OPGRPO, "_replay_inputs", spy)
    stats = alg.step(prompts, metadata)
    assert stats.extra["off_policy_frac"] > 0 and seen
    assert all(torch.equal(stored, given) for stored, given in seen)
    assert {id(given) for _, given in seen} <= {id(m[SOURCE_IMAGE]) for m in metadata}


#: the diffusers adapters' tests need these packages (skipped with the reason otherwise)
needs_diffusers = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("diffusers", "transformers", "peft")),
    reason="diffusers, transformers and peft are needed")


def random_lora_sd3(tmp_path_factory, tag: str):
    """A tiny random SD3 pipeline loaded through the adapter, its LoRA weights random (seed 11), so the policy
    differs from the reference."""
    from flowzoo.benchmark.perf.pipeline import MAX_SEQ, RESOLUTION, build_tiny_sd3
    from flowzoo.models.sd3 import SD3Model

    directory = build_tiny_sd3(tmp_path_factory.mktemp(f"{tag}_sd3"), tmp_path_factory.mktemp(f"{tag}_tok"))
    model = SD3Model(path=directory, resolution=RESOLUTION, max_sequence_length=MAX_SEQ, lora_rank=4, lora_alpha=8,
                     device="cpu")
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model
