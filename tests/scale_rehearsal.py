"""The paper suites rehearsed on 2 CPU processes: every algorithm of every ``paper-*`` suite, expanded with its exact
recipe (T, kernels, windows, shift, CFG, fine-tuning, optimizer), on a tiny random pipeline of the suite's diffusers
classes (tests/tiny_pipelines.py, benchmark/perf/pipeline.py, tests/test_models_wan.py), with only the sizes
(resolution, frames, text length, prompts per step) and the reward made small:

1. sharded (FSDP2) on 2 processes, stopped when step 3 begins (after the step-2 checkpoint; OP-GRPO has replayed at
   step 2), then resumed to step 3 on 1 process (the checkpoint is a full state dict);
2. replicated on 2 processes, 3 steps;
3. the two give the same metrics (tests/scale_matrix.py's tolerance and reward), and ``flowzoo eval`` and
   ``flowzoo export`` read the sharded run.

Every 2-process run checks the lockstep contract (``FLOWZOO_CHECK_LOCKSTEP=1``, set by tests/test_fsdp.py's
``_two_processes``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.config.schema import resolved_dict
from flowzoo.benchmark.run.suite import expand, load_suite
from tests.scale_matrix import compare
from tests.test_fsdp import _checkpoint, _metrics, _two_processes

#: suite -> the model its tasks train
SUITES = {"paper-sd3-geneval": "sd3", "paper-sd3-ocr": "sd3", "paper-sd3-pickscore": "sd3",
          "paper-wan-video": "wan", "paper-flux-hpsv2": "flux", "paper-qwen-image-pickscore": "qwen_image",
          "paper-qwen-image-edit": "qwen_image_edit", "paper-flux-kontext": "flux_kontext"}
PROMPTS = ("a cat walks", "two red dogs run")
#: the edit models' prompts: (instruction, source colour) pairs, the sources written as PNG files beside a
#: ``{split}_metadata.jsonl`` (the files source's edit pairs, benchmark/prompts/files.py)
EDITS = (("make it blue", (200, 20, 20)), ("make it red", (20, 200, 20)))
EDIT_MODELS = ("qwen_image_edit", "flux_kontext")
#: Qwen-Image rehearses with its text padding masked: paper-qwen-image-pickscore's ``text_padding: attended`` (as the
#: Flow-GRPO release ran) lets a prompt attend to the padding up to the longest prompt of its transformer call, so a
#: sample's velocity depends on which prompts share its call, and with them on the number of processes and on the
#: micro-batches (tests/test_models_qwen_image.py, test_attended_padding_...); the contract "results do not depend on
#: the number of processes" holds for the masked padding only
QWEN_PADDING = ("model.args.text_padding=masked",)


def pipeline(model: str, tmp: Path) -> tuple[Path, list[str]]:
    """A tiny random pipeline of ``model``'s diffusers classes saved under ``tmp`` (built once), and the size overrides
    it needs."""
    from tests import tiny_pipelines as tiny

    directory = tmp / f"pipeline-{model}"
    if model == "sd3":
        from flowzoo.benchmark.perf.pipeline import MAX_SEQ, RESOLUTION, build_tiny_sd3

        if not directory.exists():
            (tmp / "tok-sd3").mkdir(exist_ok=True)
            build_tiny_sd3(directory, tmp / "tok-sd3")
        return directory, [f"model.args.resolution={RESOLUTION}", f"model.args.max_sequence_length={MAX_SEQ}"]
    if model == "wan":
        from tests.test_models_wan import FRAMES, HEIGHT, MAX_SEQ, WIDTH, build_tiny_wan

        if not directory.exists():
            build_tiny_wan(directory)
        return directory, [f"model.args.frames={FRAMES}", f"model.args.height={HEIGHT}", f"model.args.width={WIDTH}",
                           f"model.args.max_sequence_length={MAX_SEQ}"]
    if model == "flux":
        if not directory.exists():
            (tmp / "tok-flux").mkdir(exist_ok=True)
            tiny.build_tiny_flux(directory, tmp / "tok-flux")
        return directory, [f"model.args.resolution={tiny.FLUX_RESOLUTION}",
                           f"model.args.max_sequence_length={tiny.FLUX_MAX_SEQ}"]
    if model == "flux_kontext":
        if not directory.exists():
            (tmp / "tok-flux-kontext").mkdir(exist_ok=True)
            tiny.build_tiny_flux(directory, tmp / "tok-flux-kontext", pipeline_class="FluxKontextPipeline")
        return directory, [f"model.args.resolution={tiny.FLUX_RESOLUTION}",
                           f"model.args.max_sequence_length={tiny.FLUX_MAX_SEQ}"]
    if model == "qwen_image_edit":
        if not directory.exists():
            tiny.build_tiny_qwen_image_edit(directory)
        return directory, [f"model.args.resolution={tiny.QWEN_RESOLUTION}",
                           f"model.args.max_sequence_length={tiny.QWEN_EDIT_MAX_SEQ}", *QWEN_PADDING]
    if not directory.exists():
        tiny.build_tiny_qwen_image(directory)
    return directory, [f"model.args.resolution={tiny.QWEN_RESOLUTION}",
                       f"model.args.max_sequence_length={tiny.QWEN_MAX_SEQ}", *QWEN_PADDING]


def write_prompts(model: str, prompts: Path) -> None:
    """The train and test prompts under ``prompts``: text prompts, or for an edit model (instruction, source) pairs."""
    prompts.mkdir(exist_ok=True)
    if model not in EDIT_MODELS:
        for split in ("train", "test"):
            (prompts / f"{split}.txt").write_text("\n".join(PROMPTS) + "\n")
        return
    from PIL import Image

    lines = []
    for i, (instruction, colour) in enumerate(EDITS):
        Image.new("RGB", (32, 32), colour).save(prompts / f"{i}.png")
        lines.append(json.dumps({"prompt": instruction, "image": f"{i}.png"}))
    for split in ("train", "test"):
        (prompts / f"{split}_metadata.jsonl").write_text("\n".join(lines) + "\n")


def cells(suite_name: str, tmp: Path) -> list[tuple[str, Path]]:
    """(algorithm, config file) of every algorithm of the suite's first task, at its recipe with the small sizes."""
    model = SUITES[suite_name]
    path, sizes = pipeline(model, tmp)
    prompts = tmp / f"prompts-{model}"
    write_prompts(model, prompts)
    overrides = [
        f"model.args.path={path}", *sizes, "model.args.dtype=float32", "model.args.lora_rank=2",
        "model.args.lora_alpha=4", "model.args.device=cpu", "model.args.gradient_checkpointing=false",
        "reward=half_constant", "reward_args={}", f"prompts.train={prompts}", f"prompts.test={prompts}",
        "train.steps=3", "train.prompts_per_step=2", "algorithm.ema_every=1",  # an EMA that moves in 3 steps
        "train.eval_every=1", "train.eval_num_steps=2", "train.eval_prompts=1", "train.save_samples=false",
        "train.checkpoint_every=1", "train.threads=1",
    ]
    suite = load_suite(suite_name)
    task = next(t for t in suite.tasks if "@" not in t)
    found = []
    for config in expand(suite, tmp / "expanded", overrides):
        if config.task != task or config.seed != suite.seeds[0]:
            continue
        file = tmp / "configs" / suite_name / f"{config.algorithm_name}.yaml"
        file.parent.mkdir(parents=True, exist_ok=True)
        data = resolved_dict(config)
        data.pop("run_dir", None)
        file.write_text(yaml.safe_dump(data, sort_keys=False))
        found.append((config.algorithm_name, file))
    return found


def rehearse(config: Path, tmp: Path) -> list[str]:
    """Steps 1-3 of the module docstring for one cell; the differences found (empty: the rehearsal passed)."""
    sharded, replicated = tmp / "sharded", tmp / "replicated"
    codes = _two_processes(["model.args.fsdp=true", f"run_dir={sharded}"], stop_at=3, config=config)
    assert codes == [2, 2], f"sharded, stopped at step 3: exit codes {codes}"
    assert _checkpoint(sharded)["iteration"] == 2 and not (sharded / "done.json").exists()
    assert main(["train", str(config), f"run_dir={sharded}", "--quiet"]) == 0  # resumed on 1 process
    assert (sharded / "done.json").exists()
    codes = _two_processes([f"run_dir={replicated}"], config=config)
    assert codes == [0, 0], f"replicated: exit codes {codes}"
    problems = compare({"one": _metrics(replicated), "sharded then 1 process": _metrics(sharded)}, config.stem)
    assert main(["eval", str(sharded)]) == 0
    export = tmp / "export"
    assert main(["export", str(sharded), "--out", str(export)]) == 0 and any(export.iterdir())
    shutil.rmtree(export)
    return problems
