"""``flowzoo export RUN_DIR --out DIR``: a run's trained LoRA in the format diffusers loads.

The run's ``config.yaml`` rebuilds its model (on the CPU), the LoRA of its last ``checkpoint.pt`` is loaded into it
(its moving average when the run kept one, ``algorithm.ema``: the weights the run evaluated with), and peft's
``get_peft_model_state_dict`` with the pipeline class's own ``save_lora_weights`` write
``DIR/pytorch_lora_weights.safetensors`` (keys ``transformer.<module>.lora_A.weight``/``lora_B.weight``, the
adapter's ``LoraConfig`` - rank, alpha, targets - in the file's metadata), so that
``StableDiffusion3Pipeline.from_pretrained(base).load_lora_weights(DIR)`` (``WanPipeline`` for wan runs,
``FluxPipeline`` for flux, ``QwenImagePipeline`` for qwen_image) gives the trained policy. A Wan2.2 two-expert
run (wan22) writes its low-noise expert's LoRA beside it, ``DIR/pytorch_lora_weights_transformer_2.safetensors``,
which ``load_lora_weights(DIR, weight_name=..., load_into_transformer_2=True)`` loads (the adapter's
``exported_transformers``; a full fine-tuning: ``DIR/transformer_2``). The pipeline class is the model adapter's
``lora_format`` (``models/base.py``; a diffusers adapter's own ``pipeline_class``), so a new adapter declares it
on its class. The tiny tier's transformer is an ``SD3Transformer2DModel`` without a diffusers pipeline: its file has
the SD3 layout and loads with
``transformer.load_lora_adapter(DIR, weight_name="pytorch_lora_weights.safetensors", prefix="transformer")`` (the
model card's line: the adapter's ``export_load_hint``).
A full fine-tuning (``model.args.finetune: full``) has no LoRA: its whole transformer goes to ``DIR/transformer``
with diffusers' ``save_pretrained`` (config + safetensors), which ``<TransformerClass>.from_pretrained(DIR/transformer)``
loads (the adapter's ``transformer_class``; ``StableDiffusion3Pipeline.from_pretrained(BASE, transformer=...)`` for
sd3). A run trained sharded (FSDP) is exported the same way: its checkpoint holds the full, gathered weights.
``DIR/README.md`` is a model card: the run's config and its final metrics. Every file is written atomically.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import yaml

from flowzoo import models
from flowzoo.errors import RunError
from flowzoo.io import _UMASK, atomic_write_text, staged_directory

WEIGHTS_NAME = "pytorch_lora_weights.safetensors"


def exportable() -> list[str]:
    """The registered models whose runs export: those whose adapter declares a ``lora_format``."""
    return [name for name in models.names() if models.get(name).lora_format]


def _load_run(run_dir: Path):
    """The run's config and its last checkpoint's state, or a one-line RunError naming what is missing or wrong."""
    from flowzoo.benchmark.run.runner import load_trained_run

    if run_dir.is_dir() and (run_dir / "config.yaml").is_file():
        from flowzoo.benchmark.run.loading import load_config
        name = load_config(run_dir / "config.yaml").model.name
        if name not in models.REGISTRY or not models.get(name).lora_format:
            raise RunError(f"run {str(run_dir)!r} is a {name!r} run, which trains no LoRA and has no diffusers "
                           f"format; export takes runs of {', '.join(exportable())}")
    config, state, _ = load_trained_run(run_dir, "nothing to export")
    return config, state


def _model_card(run_dir: Path, config, state: dict) -> str:
    from flowzoo.benchmark.config.schema import resolved_dict

    from flowzoo.benchmark.run.runner import finished_summary

    summary = finished_summary(run_dir, config)  # done.json of this config's run (not of an edited config.yaml's)
    status = "finished run" if summary is not None else "last checkpoint of an unfinished run"
    if summary is not None:
        metrics = {k: v for k, v in summary.items() if k != "config_digest"}
    else:
        row = state["rows"][-1] if state["rows"] else {}
        metrics = {k: v for k, v in row.items() if isinstance(v, (int, float, str)) and v == v}
    full = config.model.args.get("finetune") == "full"
    load = models.get(config.model.name).export_load_hint(full, WEIGHTS_NAME)
    return (
        f"# FlowZoo LoRA: {config.algorithm_name} on {config.model.name}\n\n"
        f"Exported by `flowzoo export` from `{run_dir}` ({status}, step {state['step']} of {config.train.steps}).\n\n"
        f"Load: `{load}`\n\n"
        f"## Final metrics\n\n```json\n{json.dumps(metrics, indent=2, default=str)}\n```\n\n"
        f"## Config\n\n```yaml\n{yaml.safe_dump(resolved_dict(config), sort_keys=False)}```\n"
    )


def export(run_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write ``out/pytorch_lora_weights.safetensors`` and ``out/README.md`` for the run in ``run_dir``."""
    import diffusers
    from peft.utils import get_peft_model_state_dict

    from flowzoo.algorithms.engine.ema import load_average

    from flowzoo.models.shipped import refuse_shipped

    run_dir, out = Path(run_dir), Path(out)
    refuse_shipped(out, "--out")
    config, state = _load_run(run_dir)
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {str(out)!r} is a file, not a directory")
    model_cls = models.get(config.model.name)
    model = model_cls(**{**config.model.args, "device": "cpu"})  # export needs no accelerator
    model.load_trainable_state_dict(state["algorithm"]["model"])
    load_average(model, state["algorithm"])  # with algorithm.ema on, the moving average the run evaluates with
    transformers = model.exported_transformers()
    if getattr(model, "finetune", "lora") == "full":  # every weight trained: the whole transformer(s)
        with staged_directory(out) as staging:
            for component, transformer in transformers.items():
                transformer.save_pretrained(staging / component)
            atomic_write_text(staging / "README.md", _model_card(run_dir, config, state))
        return out
    pipeline = getattr(diffusers, model_cls.lora_format)

    with staged_directory(out) as staging:  # all or nothing: no half-written --out folder
        for component, transformer in transformers.items():
            lora = {k: v.detach().contiguous() for k, v in get_peft_model_state_dict(transformer).items()}
            metadata = transformer.peft_config["default"].to_dict()
            name = weights_name(component)
            pipeline.save_lora_weights(staging, transformer_lora_layers=lora, weight_name=name,
                                       transformer_lora_adapter_metadata=metadata)
            os.chmod(staging / name, 0o666 & ~_UMASK)  # safetensors writes 0600; give it open()'s mode
        atomic_write_text(staging / "README.md", _model_card(run_dir, config, state))
    return out


def weights_name(component: str) -> str:
    """The LoRA file of a pipeline component: ``pytorch_lora_weights.safetensors`` for ``transformer`` (what
    ``load_lora_weights(DIR)`` finds by itself), ``pytorch_lora_weights_<component>.safetensors`` for another (Wan2.2's
    ``transformer_2``: a name diffusers' own guess never picks, loaded with ``weight_name=``)."""
    if component == "transformer":
        return WEIGHTS_NAME
    return WEIGHTS_NAME.replace(".safetensors", f"_{component}.safetensors")


DESCRIPTION = ("Writes DIR/pytorch_lora_weights.safetensors and a model card (DIR/README.md) with the run's "
               "config and final metrics.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo export``'s arguments."""
    parser.add_argument("run_dir", help="run directory of an sd3, wan or tiny run (its config.yaml and checkpoint.pt)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for pytorch_lora_weights.safetensors and README.md")


def run(args: argparse.Namespace) -> int:
    """``flowzoo export``: what it wrote (a full fine-tuning: its whole transformer)."""
    out = export(Path(args.run_dir), Path(args.out))
    what = "transformer" if (Path(out) / "transformer").is_dir() else "LoRA"
    print(f"{what} written to {out}")
    return 0
