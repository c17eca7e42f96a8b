"""Recipes: every value has a source, the precedence of a suite run's layers, docs/recipes.md is current, and every
paper suite resolves, per algorithm, to the released recipe.

The expected values below are typed from a reading of the released code (not from our YAML files); sources:
FG = yifan123/flow_grpo (config/grpo.py at 31c71b9, config/base.py at 54809b5, scripts/train_sd3.py and
flow_grpo/stat_tracking.py at ac4c86e, scripts/train_wan2_1.py at 32b48fd); DG = XueZeyue/DanceGRPO at 15cc71d
(scripts/finetune/finetune_flux_grpo_8gpus_lora.sh "lora.sh", finetune_wan_2_1_grpo.sh "wan.sh",
fastvideo/train_grpo_flux_lora.py, train_grpo_wan_2_1.py); MG = Tencent-Hunyuan/MixGRPO at e5cdd6a
(scripts/finetune/finetune_flux_grpo_MixGRPO.sh "mix.sh", ..._Flash.sh, fastvideo/train_grpo_flux.py).
"""

from pathlib import Path

import pytest

from flowzoo import algorithms
from flowzoo.benchmark.config import recipe_files, recipes
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.suite import Suite, expand, load_suite
from flowzoo.cells import base_task
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

# ---- released recipes, per model family ---------------------------------------------------------------------------
FLOW_SD3 = dict(
    group_size=24,  # FG grpo.py:96,138,218 num_image_per_prompt
    num_steps=10, guidance=4.5,  # FG grpo.py:90,92
    shift=3.0,  # SD3.5-Medium's scheduler shift (the suite's sampling setup)
    kernel="flow_grpo", noise_level=0.7,  # FG base.py:61
    timestep_fraction=0.99,  # FG grpo.py:104
    shared_noise=False,  # FG grpo.py:110 same_latent False
    clip_range=1e-4, adv_clip=5.0,  # FG base.py:99,97
    adv_std="batch", adv_std_unbiased=False, adv_eps=1e-4,  # FG grpo.py:108 global_std; stat_tracking.py:27 np.std + 1e-4
    drop_zero_advantage=True,  # FG train_sd3.py:796-816
    kl_beta=0.04, kl_variance="release",  # FG grpo.py:106,147; train_sd3.py:895 / (2 std_dev_t^2)
    cfg_grad="cond",  # FG train_sd3.py:194 noise_pred_uncond.detach()
    lr=3e-4, weight_decay=1e-4, adam_eps=1e-8, max_grad_norm=1.0,  # FG base.py:76,82,84,89
    inner_epochs=1, minibatches=2,  # FG grpo.py:102 gradient_accumulation_steps = batches per epoch // 2
    log_prob_reduction="mean",
    ema=True, ema_decay=0.9, ema_every=8,  # FG grpo.py:111 train.ema; train_sd3.py:445 EMAModuleWrapper(0.9, 8)
)
FLOW_WAN = dict(
    FLOW_SD3,
    group_size=4, num_steps=20, guidance=4.5,  # FG grpo.py:44,35,37 (general_ocr_wan2_1)
    shift=None,  # the Wan model's own scheduler shift
    clip_range=1e-3, kl_beta=0.004, lr=1e-4,  # FG grpo.py:56,54,55
    adv_std="group",  # FG grpo.py:64 global_std False
    cfg_grad="both",  # FG train_wan2_1.py compute_log_prob: no detach
    minibatches=2,  # FG grpo.py:46-50: 2 batches per epoch, accumulation 1
)
FAST_SD3 = dict(
    group_size=24, num_steps=10,  # FG grpo.py:178,170 (geneval_sd3_fast_nocfg)
    guidance=1.0,  # FG grpo.py:172,174: guidance 1, train.cfg False
    kernel="cps", noise_level=0.8,  # FG grpo.py:191,188
    sde_window_size=3, sde_window_range=None,  # FG grpo.py:189-190: (0, T // 2)
    shared_prefix=False, shared_noise=False,  # FG base.py:63 same_latent False
    clip_range=1e-5, kl_beta=0.0,  # FG grpo.py:185,186
    adv_std="batch", adv_std_unbiased=False, adv_eps=1e-4, drop_zero_advantage=True,
    lr=3e-4, minibatches=2, inner_epochs=1,  # FG base.py:76; grpo.py:183-184
    ema=True,  # FG grpo.py:192 train.ema
)
FAST_WAN = dict(  # no released Wan Fast recipe: the Wan recipe with the Fast sampler (ours, flow_grpo_fast.yaml)
    FAST_SD3, group_size=4, num_steps=20, guidance=4.5, clip_range=1e-3, adv_std="group", lr=1e-4,
)
DANCE_SD3 = dict(
    group_size=12,  # DG lora.sh:49 num_generations
    num_steps=10, guidance=4.5, shift=3.0,  # ours: the SD3 task's sampling setup (DanceGRPO releases no SD3 recipe)
    kernel="dance_grpo", noise_level=0.3,  # DG lora.sh:43 eta
    timestep_fraction=0.6,  # DG lora.sh:53
    shared_noise=True,  # DG lora.sh:54 init_same_noise
    sigma_grid="linspace",  # DG train_grpo_flux_lora.py:249-251
    rewarded="prediction",  # DG train_grpo_flux_lora.py:192, train_grpo_wan_2_1.py:219: latents = pred_original
    clip_range=1e-4, adv_clip=5.0,  # DG lora.sh:55-56
    adv_std="group", adv_std_unbiased=True, adv_eps=1e-8,  # DG train_grpo_flux_lora.py:486
    drop_zero_advantage=False, kl_beta=0.0,  # DG train_grpo_flux_lora.py:541-547, no mask, no KL
    cfg_grad="both",  # DG train_grpo_wan_2_1.py:238-248 (its trainers with CFG)
    lr=3e-4, weight_decay=1e-4, max_grad_norm=1.0,  # DG lora.sh:33,47,46
    minibatches=2,  # DG lora.sh:26,31: 2 x 12 samples per GPU / accumulation 12
    minibatch_order="grouped",  # DG train_grpo_flux_lora.py:511-553: the samples in order, whole groups per step
    ema=False,  # DG: no EMA in the trainers (train_grpo_wan_2_1.py parses --ema_decay and never uses it)
)
DANCE_WAN = dict(
    DANCE_SD3,
    group_size=12, num_steps=20, guidance=5.0, shift=3.0,  # DG wan.sh:47,40,55,48
    lr=1e-4,  # ours: the suite's LoRA lr (DanceGRPO's Wan run fine-tunes all weights at 1e-5, wan.sh:31)
    minibatches=1,  # DG wan.sh:24,29: 2 x 12 samples per GPU / accumulation 24
)
MIX_SD3 = dict(
    group_size=12,  # MG mix.sh:150
    num_steps=10, guidance=4.5, shift=3.0,  # ours: the SD3 task's sampling setup (MixGRPO releases FLUX only)
    kernel="flow_grpo", noise_level=0.7,  # MG mix.sh:196 --flow_grpo_sampling, :55 eta 0.7
    shared_noise=True, sigma_grid="linspace",  # MG mix.sh:155; train_grpo_flux.py:187-189
    window_size=4, window_stride=1, window_tau=25,  # MG mix.sh:58,60,57
    window_strategy="progressive", window_rollback=True, window_bound="released",  # MG mix.sh:59,168; grpo_states.py:148
    reward_aggregation="advantage",  # MG mix.sh:62 advantage_aggr
    kl_beta=0.0, clip_range=1e-4, adv_clip=5.0,  # MG mix.sh:56,156,157
    adv_std="group", adv_std_unbiased=True, adv_eps=1e-8, drop_zero_advantage=False,  # MG train_grpo_flux.py:448
    lr=3e-4,  # ours: LoRA (MixGRPO's 1e-5 fine-tunes all FLUX weights)
    minibatches=4,  # MG mix.sh:68,128,150: 12 samples per GPU / accumulation 3
    minibatch_order="interleaved",  # MG train_grpo_flux.py:516-543,606: in order, the same 3 samples of each group
    ema=False,  # MG train_grpo_flux.py:1034-1035: --ema_decay parsed, never used
)
MIX_WAN = dict(MIX_SD3, num_steps=20, shift=None, lr=1e-4)  # the Wan task's sampling setup and LoRA lr (ours)
FLASH = dict(window_tau=20, compress_ratio=0.4,  # MG ..._MixGRPO_Flash.sh:57,77
             compress_count="released")  # MG sampling_utils.py:44 int((T - last) * ratio)

NFT_SD3 = dict(group_size=24, num_steps=10, guidance=1.0, solver="dpm2", nft_beta=1.0, decay_type=1, kl_beta=1e-4,
               lr=3e-4, minibatches=1)  # DN config/nft.py:20-105, config/base.py:66
AWM_SD3 = dict(group_size=24, num_steps=14, guidance=1.0, train_timesteps=6, kl_beta=1e-3, lr=3e-4,
               weighting="ghuber")  # AWM config/dgx_awm.py:37-64
#: OP-GRPO's paper-scale off-policy share (ours, op_grpo.yaml): half the groups replay k = G / 2 -> 25%
OP_SHARE = dict(replay_prompts="buffer", off_policy_groups=0.5)
EXPECTED = {
    ("sd3", "flow_grpo"): FLOW_SD3, ("sd3", "op_grpo"): dict(FLOW_SD3, **OP_SHARE, replay_k=12), ("sd3", "flow_grpo_fast"): FAST_SD3,
    ("sd3", "dance_grpo"): DANCE_SD3, ("sd3", "mix_grpo"): MIX_SD3, ("sd3", "mix_grpo_flash"): dict(MIX_SD3, **FLASH),
    ("sd3", "diffusion_nft"): NFT_SD3, ("sd3", "awm"): AWM_SD3,
    ("wan", "diffusion_nft"): dict(group_size=24, guidance=1.0, solver="dpm2", nft_beta=1.0, decay_type=1,
                                   kl_beta=1e-4),  # ours: the SD3 recipe's values (no released Wan trainer)
    ("wan", "awm"): dict(group_size=24, guidance=1.0),  # ours: the SD3 recipe's values
    ("wan", "flow_grpo"): FLOW_WAN, ("wan", "op_grpo"): dict(FLOW_WAN, **OP_SHARE, replay_k=2), ("wan", "flow_grpo_fast"): FAST_WAN,
    ("wan", "dance_grpo"): DANCE_WAN, ("wan", "mix_grpo"): MIX_WAN, ("wan", "mix_grpo_flash"): dict(MIX_WAN, **FLASH),
}
# FLUX: DanceGRPO's LoRA recipe and MixGRPO's recipe as released for FLUX.1-dev (lora.sh, mix.sh above)
DANCE_FLUX = dict(
    DANCE_SD3,
    num_steps=12, guidance=1.0, shift=3.0,  # DG lora.sh:42 sampling_steps, :37 cfg 0.0, :50 shift
    cfg_grad="cond",  # no CFG in DanceGRPO's FLUX trainer: the class default stands (nothing to detach)
)
MIX_FLUX = dict(MIX_SD3, num_steps=25, guidance=1.0, shift=3.0)  # MG mix.sh:54 sampling_steps 25, :139 cfg 0.0, :151
# Qwen-Image: Flow-GRPO's pickscore_qwenimage (FG config/grpo.py:519-561 at 27b6ef8, base.py at 27b6ef8,
# scripts/train_qwenimage.py at 27b6ef8) and DanceGRPO's finetune_qwenimage_grpo.sh "qwen.sh" (full fine-tuning there)
FAST_QWEN = dict(
    group_size=16, num_steps=10, guidance=4.0,  # FG grpo.py:532,526,528
    cfg_grad="both",  # FG train_qwenimage.py:217-227: one call on [cond; neg], nothing detached
    kernel="flow_grpo", noise_level=1.2, sde_window_size=2, sde_window_range=None,  # FG grpo.py:544-546
    shared_noise=False, shared_prefix=False,  # FG grpo.py:542 same_latent False
    clip_range=1e-4, adv_clip=5.0, kl_beta=0.0,  # FG base.py:94,92; grpo.py:540
    adv_std="batch", adv_std_unbiased=False, adv_eps=1e-4,  # FG grpo.py:541 global_std; stat_tracking.py:27
    lr=3e-4, minibatches=2, inner_epochs=1,  # FG base.py:71; grpo.py:533,538-539
    ema=False,  # FG grpo.py:543
)
DANCE_QWEN = dict(
    DANCE_FLUX, num_steps=20,  # DG qwen.sh:41
    lr=3e-4,  # ours: LoRA (DanceGRPO's Qwen-Image run fine-tunes all weights at 1e-5, qwen.sh:32)
)
EXPECTED.update({
    ("flux", "dance_grpo"): DANCE_FLUX, ("flux", "mix_grpo"): MIX_FLUX,
    ("flux", "mix_grpo_flash"): dict(MIX_FLUX, **FLASH),
    ("qwen_image", "flow_grpo_fast"): FAST_QWEN, ("qwen_image", "dance_grpo"): DANCE_QWEN,
})
# Qwen-Image-Edit and FLUX.1-Kontext: Flow-GRPO's counting_qwenimage_edit and counting_flux_kontext (FG config/grpo.py
# at 27b6ef8, lines 609-649 and 481-517; scripts/train_qwenimage_edit.py and train_flux_kontext.py at 27b6ef8)
FLOW_QWEN_EDIT = dict(
    group_size=16, num_steps=10, guidance=4.0,  # FG grpo.py:622,616,618
    cfg_grad="both",  # FG train_qwenimage_edit.py:220-232: one call on [cond; neg], nothing detached
    kernel="flow_grpo", noise_level=1.0,  # FG grpo.py:634
    timestep_fraction=0.99,  # FG train_qwenimage_edit.py:364-367: sde_window_size 0 -> the first T - 1 = 9 steps
    shared_noise=False,  # FG grpo.py:632
    clip_range=1e-4, adv_clip=5.0, kl_beta=0.0,  # FG base.py:94,92; grpo.py:630
    adv_std="batch", adv_std_unbiased=False, adv_eps=1e-4,  # FG grpo.py:631; stat_tracking.py:27
    drop_zero_advantage=False,  # FG train_qwenimage_edit.py:800-805: no all-zero mask
    lr=3e-4, weight_decay=1e-4, adam_eps=1e-8, max_grad_norm=1.0,  # FG base.py:71,77,79,84
    minibatches=2, inner_epochs=1,  # FG grpo.py:623,628-629
    ema=False,  # FG grpo.py:633
)
FLOW_KONTEXT = dict(
    group_size=21, num_steps=6,  # FG grpo.py:494,488
    guidance=1.0,  # FG train_flux_kontext.py:183-187: 2.5 is the distilled guidance (a model arg), no true CFG
    kernel="flow_grpo", noise_level=0.9, timestep_fraction=0.99,  # FG grpo.py:507,502: int(6 x 0.99) = 5 steps
    shared_noise=False,  # FG grpo.py:505
    clip_range=1e-4, adv_clip=5.0, kl_beta=0.0,  # FG base.py:94,92; grpo.py:503
    adv_std="batch", adv_std_unbiased=False, adv_eps=1e-4,  # FG grpo.py:504; stat_tracking.py:27
    drop_zero_advantage=True,  # FG train_flux_kontext.py:765-786
    lr=3e-4, weight_decay=1e-4, adam_eps=1e-8, max_grad_norm=1.0,  # FG base.py:71,77,79,84
    minibatches=2, inner_epochs=1,  # FG grpo.py:495,500-501
    ema=True, ema_decay=0.9, ema_every=8,  # FG grpo.py:506; train_flux_kontext.py:442
)
EXPECTED.update({
    ("qwen_image_edit", "flow_grpo"): FLOW_QWEN_EDIT,
    ("qwen_image_edit", "op_grpo"): dict(FLOW_QWEN_EDIT, **OP_SHARE, replay_k=8),
    ("flux_kontext", "flow_grpo"): FLOW_KONTEXT,
    ("flux_kontext", "op_grpo"): dict(FLOW_KONTEXT, **OP_SHARE, replay_k=10),
})
PER_TASK = {
    ("sd3_pickscore", "flow_grpo"): {"kl_beta": 0.01},  # FG grpo.py:227
    ("sd3_pickscore", "op_grpo"): {"kl_beta": 0.01},
    ("sd3_pickscore", "flow_grpo_fast"): {"group_size": 18},  # FG grpo.py:338 (pickscore_sd3_fast_nocfg)
    ("sd3_ocr", "diffusion_nft"): {"nft_beta": 0.1, "decay_type": 2, "minibatches": 2},  # DN nft.py:75-78
    ("sd3_ocr", "awm"): {"kl_beta": 3e-3},  # AWM dgx_awm.py:194
    ("sd3_pickscore", "awm"): {"kl_beta": 1e-4, "time_type": "discrete", "solver": "dpm2"},  # AWM dgx_awm.py:326-367
}
PAPER_SUITES = ["paper-sd3-geneval", "paper-sd3-ocr", "paper-sd3-pickscore", "paper-wan-video", "paper-flux-hpsv2",
                "paper-qwen-image-pickscore", "paper-qwen-image-edit", "paper-flux-kontext"]


@pytest.fixture
def prompt_dir(tmp_path):
    for split in ("train", "test"):
        (tmp_path / f"{split}.txt").write_text("a photo of a cat\n")
    return [f"prompts.train={tmp_path}", f"prompts.test={tmp_path}"]


@pytest.mark.parametrize("suite_name", PAPER_SUITES)
def test_paper_suite_resolves_to_the_released_recipes(suite_name, prompt_dir, tmp_path):
    suite = load_suite(suite_name)
    configs = expand(suite, tmp_path / "runs", prompt_dir)
    assert sorted({c.algorithm_name for c in configs}) == sorted(suite.algorithms)
    wrong = []
    for c in configs:
        family = c.model.name
        task = base_task(c.task)  # the equal-batch variant task keeps its task's recipe
        expected = {**EXPECTED[(family, c.algorithm_name)], **PER_TASK.get((task, c.algorithm_name), {})}
        resolved = {k: c.algorithm[k] for k in expected}
        print(f"{suite_name} {c.task} {c.algorithm_name}: {resolved}")
        wrong += [f"{c.task}/{c.algorithm_name}.{k}: resolved {resolved[k]!r}, released {v!r}"
                  for k, v in expected.items() if resolved[k] != v]
    assert not wrong, "\n".join(wrong)


#: each release's prompts per step (the paper suites' `per_algorithm_train`; sources in the suite files)
RELEASED_PROMPTS = {"flow_grpo": 48, "op_grpo": 48, "flow_grpo_fast": 48, "dance_grpo": 16, "mix_grpo": 32,
                    "mix_grpo_flash": 32, "diffusion_nft": 48}  # DiffusionNFT: config/nft.py:28-47
#: AWM's per task: 8 GPUs x 6 samples x 36 (GenEval, OCR) or 12 (PickScore) batches per epoch / G 24 (AWM
#: config/dgx_awm.py:42-46, :181-185, :320-324 at be51372)
AWM_PROMPTS = {"sd3_geneval": 8 * 6 * 36 // 24, "sd3_ocr": 8 * 6 * 36 // 24, "sd3_pickscore": 8 * 6 * 12 // 24}


@pytest.mark.parametrize("suite_name", PAPER_SUITES[:3])
def test_paper_suites_run_each_released_batch_and_an_equal_batch_variant(suite_name, prompt_dir, tmp_path):
    configs = expand(load_suite(suite_name), tmp_path / "runs", prompt_dir)
    task = suite_name.replace("paper-", "").replace("-", "_")
    fast = 64 if task == "sd3_pickscore" else 48  # FG grpo.py:339 (pickscore_sd3_fast_nocfg)
    resolved = {(c.task, c.algorithm_name): c.train.prompts_per_step for c in configs}
    assert resolved[(task, "awm")] == AWM_PROMPTS[task] == (24 if task == "sd3_pickscore" else 72)
    assert resolved[(f"{task}@equal_batch", "awm")] == 48
    for alg, prompts in RELEASED_PROMPTS.items():
        assert resolved[(task, alg)] == (fast if alg == "flow_grpo_fast" else prompts)
        assert resolved[(f"{task}@equal_batch", alg)] == 48
    # the rest of the train block is shared
    assert len({(c.train.steps, c.train.eval_every) for c in configs}) == 1


def test_docs_recipes_md_is_current():
    doc = ROOT / "docs" / "recipes.md"
    assert doc.read_text() == recipes.recipe_table(), "docs/recipes.md is stale: run `flowzoo recipes --out docs/recipes.md`"


def test_every_recipe_value_names_a_real_knob_and_a_source():
    rows = [row for path in sorted(recipes.RECIPES_DIR.glob("*.yaml")) for row in recipes.read_recipe_file(path)]
    assert len(rows) > 100 and all(row.source for row in rows)
    assert {row.file for row in rows} >= {"flow_grpo", "flow_grpo_fast", "dance_grpo", "mix_grpo", "mix_grpo_flash"}


def _recipe_dir(tmp_path, monkeypatch, files: dict[str, str]) -> Path:
    folder = tmp_path / "hyperparams"
    folder.mkdir()
    for name, text in files.items():
        (folder / f"{name}.yaml").write_text(text)
    monkeypatch.setattr(recipe_files, "RECIPES_DIR", folder)  # the one reader of the files
    return folder


def test_a_value_without_a_source_or_an_unknown_knob_is_refused(tmp_path, monkeypatch):
    folder = _recipe_dir(tmp_path, monkeypatch, {"flow_grpo": "sd3:\n  lr: 1.0e-3\n"})
    with pytest.raises(ConfigError, match=r"flow_grpo.yaml:2: sd3.lr has no source"):
        recipes.read_recipe_file(folder / "flow_grpo.yaml")
    (folder / "flow_grpo.yaml").write_text("sd3:\n  lrate: 1.0e-3  # ours\n")
    with pytest.raises(ConfigError, match=r"unknown flow_grpo knob 'lrate'; valid: .*\blr\b"):
        recipes.read_recipe_file(folder / "flow_grpo.yaml")
    (folder / "flow_grpo.yaml").write_text("sd3: {lr: 1.0e-3}  # ours\n")
    with pytest.raises(ConfigError, match=r"flow_grpo.yaml:1: expected `scope:` or `  knob: value  # source`"):
        recipes.read_recipe_file(folder / "flow_grpo.yaml")


PRECEDENCE_RECIPE = """\
default:
  clip_range: 0.2  # test
  kl_beta: 0.1  # test
  noise_level: 0.5  # test
  group_size: 4  # test
  max_grad_norm: 2.0  # test
  minibatches: 1  # test
toy2d:
  kl_beta: 0.2  # test
  noise_level: 0.6  # test
t:
  kl_beta: 0.3  # test
"""


def test_precedence_class_shared_recipe_per_algorithm_command_line(tmp_path, monkeypatch):
    _recipe_dir(tmp_path, monkeypatch, {"flow_grpo": PRECEDENCE_RECIPE, "op_grpo": "inherits: flow_grpo\n"
                                        "default:\n  t_off: 3  # test\n  lr: 0.005  # test\n"})
    suite = Suite(name="s", algorithms=["flow_grpo", "op_grpo", "op_grpo_no_truncation"], seeds=[0], defaults={
        "algorithm": {"lr": 0.002, "clip_range": 0.3, "kl_beta": 0.9},  # shared block
        "per_algorithm": {"flow_grpo": {"group_size": 6, "max_grad_norm": 3.0}, "op_grpo": {"adv_clip": 2.0}},
    }, tasks={"t": {
        "model": {"name": "toy2d"}, "reward": "toy_mode", "prompts": {"source": "toy2d"},
        "algorithm": {"lr": 0.001},  # the task's shared block over the suite's
        "per_algorithm": {"flow_grpo": {"group_size": 8, "minibatches": 2}},
    }})
    runs = {c.algorithm_name: c.algorithm for c in expand(suite, tmp_path / "runs", ["algorithm.minibatches=3"])}
    flow = runs["flow_grpo"]
    assert flow["adv_clip"] == 5.0  # class default: nobody sets it
    assert flow["lr"] == 0.001  # shared block only (the task's over the suite's)
    assert flow["clip_range"] == 0.2  # recipe over the shared block
    assert flow["noise_level"] == 0.6 and flow["kl_beta"] == 0.3  # recipe: default < model < task
    assert flow["max_grad_norm"] == 3.0  # per-algorithm block over the recipe
    assert flow["group_size"] == 8  # the task's per-algorithm block over the suite's
    assert flow["minibatches"] == 3  # the command line over everything
    op = runs["op_grpo"]
    assert op["adv_clip"] == 2.0 and op["group_size"] == 4  # its own block only; the flow_grpo block does not leak
    assert op["kl_beta"] == 0.3 and op["lr"] == 0.005 and op["t_off"] == 3  # flow_grpo.yaml, then op_grpo.yaml over it
    assert runs["op_grpo_no_truncation"]["t_off"] is None  # the preset's identity over its base's recipe

    suite.tasks["t"]["per_algorithm"] = {"flow_grpoo": {"lr": 0.1}}
    with pytest.raises(ConfigError, match=r"unknown algorithm 'flow_grpoo'; known: .*flow_grpo"):
        expand(suite, tmp_path / "runs")


def test_recipes_command_prints_and_writes_the_table(tmp_path, capsys):
    assert main(["recipes"]) == 0
    assert capsys.readouterr().out == recipes.recipe_table()
    out = tmp_path / "recipes.md"
    assert main(["recipes", "--out", str(out)]) == 0 and out.read_text() == recipes.recipe_table()


def test_every_algorithm_reads_its_own_file_after_its_bases():
    assert [p.name for p in recipes.recipe_paths("mix_grpo_flash_star")] == ["mix_grpo.yaml", "mix_grpo_flash.yaml"]
    assert [p.name for p in recipes.recipe_paths("op_grpo_naive_is")] == ["flow_grpo.yaml", "op_grpo.yaml"]
    star = recipes.recipe("mix_grpo_flash_star", "sd3_geneval", "sd3")
    assert star["compress_ratio"] == 0.2 and star["window_tau"] == 20  # preset over mix_grpo_flash.yaml; tau from it
    assert algorithms.get("mix_grpo_flash_star").preset["compress_ratio"] == 0.2
