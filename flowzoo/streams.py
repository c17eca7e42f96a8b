"""The keys of every random stream FlowZoo derives, in one place.

All randomness of a run is a pure function of its seed, the iteration (or step) and one of the keys below, so a
resumed run repeats an uninterrupted one and no two purposes share a stream. Changing a value changes every run
that draws from it (results are no longer bit-identical to earlier runs); a new purpose takes a new, distinct key
(``tests/test_streams.py`` checks that they are).

Streams derived as ``SeedSequence([seed, iteration, key])`` (``algorithms.engine.rollout.sample_generators``, spawned per
sample, and ``algorithms.engine.plans.iteration_generator``):

=================================  ===========  ==========================================  ============================
key                                value        drawn by                                    what it decides
=================================  ===========  ==========================================  ============================
group offset ``o``                 0 .. < 1e6   ``Algorithm.fresh_rollout`` (base.py),      initial and SDE noise of the
                                                Flow-GRPO-Fast's branched rollout           fresh samples of groups o...
``PURPOSE_TRAIN_SUBSETS``          1_000_001    DanceGRPO ``step_plan``                     each sample's trained steps
``PURPOSE_WINDOW``                 1_000_002    Flow-GRPO-Fast, MixGRPO (random strategy)   the SDE window's start
``PURPOSE_SDE_STEPS``              1_000_003    Flow-DPPO ``step_plan`` (``sde_steps``)     its sparse SDE steps
``OP_GRPO_GROUP_CHOICE``           2_000_003    OP-GRPO ``_choose_groups``                  which groups get buffer
                                                                                            samples, which entries
``OP_GRPO_REGENERATION``           2_000_029    OP-GRPO (truncation)                        noise of the regenerated
                                                                                            steps of buffer samples
``DIFFUSION_NFT_FORWARD``          3_000_001    DiffusionNFT ``update`` (spawned per        each sample's trained
                                                sample)                                     timesteps and forward noise
``AWM_FORWARD``                    3_000_002    AWM ``update`` (spawned per sample)         each sample's trained
                                                                                            timesteps and forward noise
=================================  ===========  ==========================================  ============================

The group offsets are group indices (OP-GRPO's fresh groups start after the hybrid ones), far below the purpose keys
for any batch of fewer than a million prompts.

Other streams:

=================================  ===========  ==========================================  ============================
key                                value        drawn by                                    stream
=================================  ===========  ==========================================  ============================
``PROMPT_ORDER``                   17           ``prompt_samplers.base.uniform_order``      ``SeedSequence([seed, step,
                                                                                            17])``: step's prompts
``PROMPT_REFILL``                  29           the filtering samplers (``filters.py``)     ``SeedSequence([seed, step,
                                                                                            17, 29])``: all rounds
``PROMPT_CURRICULUM``              31           the ``variance`` sampler                    ``SeedSequence([seed, step,
                                                                                            31])``: its weighted draw
``UPDATE_ORDER_OFFSET``            7919         ``Algorithm`` (base.py) minibatch order     ``torch.Generator`` seeded
                                                                                            ``seed + 7919``
``GRAD_SNR_STEP_OFFSET``           1_000_000    ``flowzoo grad-snr``                        prompt step and iteration
                                                                                            of its batches (kept away
                                                                                            from a run's own steps)
``train.eval_seed`` (config)       12345        ``Runner.evaluate``                         ``SeedSequence([eval_seed``
                                                                                            ``])`` spawned per sample
``TINY_SAMPLE``                    0x5EED       ``models.tiny_data.sample_rng``             scene/text ``index`` of a
                                                                                            data stream
``TINY_EDIT_SAMPLE``               0xED17       ``models.tiny_edit_data``                   ``SeedSequence([seed,
                                                ``.sample_edit_triple``                     index, 0xED17])``: edit
                                                                                            triple ``index``
``TINY_PRETRAIN_BATCH``            0xF10        ``models.tiny_pretrain.step_generator``     noise, sigma, dropout of a
                                                                                            pretraining step
``TINY_TEXT_INIT_OFFSET``          0            ``models.tiny.build_networks``              text encoder init: ``seed``
``TINY_TRANSFORMER_INIT_OFFSET``   1            ``models.tiny.build_networks``              transformer init: ``seed+1``
``TINY_LORA_INIT_OFFSET``          2            ``models.tiny.TinyModel``                   LoRA init: ``seed + 2``
=================================  ===========  ==========================================  ============================

This module sits in ``flowzoo`` (below ``models``, ``rewards``, ``algorithms`` and ``benchmark``) so that every
layer can import it without breaking the one-way dependencies.
"""

from __future__ import annotations

#: the largest group offset a fresh rollout may use (exclusive); the purpose keys lie above it
GROUP_OFFSET_LIMIT = 1_000_000

# ---- keys of SeedSequence([seed, iteration, key]) ------------------------------------------------------------------
PURPOSE_TRAIN_SUBSETS = 1_000_001
PURPOSE_WINDOW = 1_000_002
PURPOSE_SDE_STEPS = 1_000_003
OP_GRPO_GROUP_CHOICE = 2_000_003
OP_GRPO_REGENERATION = 2_000_029
DIFFUSION_NFT_FORWARD = 3_000_001
AWM_FORWARD = 3_000_002

# ---- other streams -------------------------------------------------------------------------------------------------
PROMPT_ORDER = 17
PROMPT_REFILL = 29
PROMPT_CURRICULUM = 31
UPDATE_ORDER_OFFSET = 7919
GRAD_SNR_STEP_OFFSET = 1_000_000
TINY_SAMPLE = 0x5EED
TINY_PRETRAIN_BATCH = 0xF10
TINY_EDIT_SAMPLE = 0xED17
TINY_TEXT_INIT_OFFSET = 0
TINY_TRANSFORMER_INIT_OFFSET = 1
TINY_LORA_INIT_OFFSET = 2

#: the keys that share the ``SeedSequence([seed, iteration, key])`` space with the group offsets
ITERATION_PURPOSES = {
    "PURPOSE_TRAIN_SUBSETS": PURPOSE_TRAIN_SUBSETS,
    "PURPOSE_WINDOW": PURPOSE_WINDOW,
    "PURPOSE_SDE_STEPS": PURPOSE_SDE_STEPS,
    "OP_GRPO_GROUP_CHOICE": OP_GRPO_GROUP_CHOICE,
    "OP_GRPO_REGENERATION": OP_GRPO_REGENERATION,
    "DIFFUSION_NFT_FORWARD": DIFFUSION_NFT_FORWARD,
    "AWM_FORWARD": AWM_FORWARD,
}
#: the last element of ``SeedSequence([a, b, key])`` streams drawn without spawning (prompt order, tiny data, pretrain)
SEQUENCE_TAGS = {"PROMPT_ORDER": PROMPT_ORDER, "PROMPT_REFILL": PROMPT_REFILL, "PROMPT_CURRICULUM": PROMPT_CURRICULUM,
                 "TINY_SAMPLE": TINY_SAMPLE, "TINY_PRETRAIN_BATCH": TINY_PRETRAIN_BATCH,
                 "TINY_EDIT_SAMPLE": TINY_EDIT_SAMPLE}
#: offsets added to a seed for ``torch`` generators of model initialisation and the update's order
SEED_OFFSETS = {
    "UPDATE_ORDER_OFFSET": UPDATE_ORDER_OFFSET,
    "TINY_TEXT_INIT_OFFSET": TINY_TEXT_INIT_OFFSET,
    "TINY_TRANSFORMER_INIT_OFFSET": TINY_TRANSFORMER_INIT_OFFSET,
    "TINY_LORA_INIT_OFFSET": TINY_LORA_INIT_OFFSET,
}
