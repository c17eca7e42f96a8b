"""``flowzoo pretrain tiny``: pretrain the tiny tier on synthetic data (models/tiny_pretrain.py), resumable; ``--data
shapes_edit`` pretrains the edit tier (models/tiny_edit.py), from text-to-image weights with ``--init``."""

from __future__ import annotations

import argparse

from flowzoo.command_line import MAX_BATCH, MAX_THREADS, at_most

DESCRIPTION = ("Trains the tiny text-to-image model from scratch, or the tiny edit model (--data shapes_edit, from "
               "text-to-image weights with --init); the shipped weights are replaced only when --out names them.")
#: ``--data`` choices (models.tiny_pretrain.PRETRAIN_DATA, written here so the parser stays cheap to build)
DATA_CHOICES = ("shapes", "glyphs", "shapes_edit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("model", choices=["tiny"], help="the model to pretrain")
    add("--data", choices=DATA_CHOICES, default="shapes", help="synthetic data set (shapes_edit: edit triples of "
        "shape scenes, for the edit model)")
    add("--init", default=None, help="--data shapes_edit: start from this tiny text-to-image weights file (e.g. "
        "models/weights/tiny_shapes.safetensors; every weight copied, the source channels' weights zero)")
    add("--steps", type=int, default=100_000, help="stop after this many optimizer steps")
    add("--minutes", type=float, default=None, help="stop after this much training wall time (default: no limit)")
    add("--batch", type=at_most(MAX_BATCH), default=32, help="images per optimizer step")
    add("--lr", type=float, default=5e-4, help="learning rate")
    add("--ema", type=float, default=0.998, help="decay of the parameter average that is shipped")
    add("--seed", type=int, default=0, help="random seed")
    add("--threads", type=at_most(MAX_THREADS), default=2, help="torch threads")
    add("--out", default=None, help="weights file (default: <run-dir>/tiny_<data>.safetensors; the shipped "
        "models/weights/tiny_<data>.safetensors is replaced only when named here)")
    add("--run-dir", default=None, help="checkpoint directory (default: runs/pretrain_tiny_<data>)")
    add("--quiet", action="store_true", help="no progress bar")


def pretrain_command(args: argparse.Namespace) -> str:
    """The pretrain command with every option spelled out (what the weights' record stores)."""
    options = ["data", "init", "steps", "minutes", "batch", "lr", "ema", "seed", "threads", "out", "run_dir"]
    words = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in options if getattr(args, name) is not None]
    return " ".join(["flowzoo pretrain", args.model, *words])


def run(args: argparse.Namespace) -> int:
    from flowzoo.models.tiny_pretrain import pretrain

    out = pretrain(
        args.data, out=args.out, run_dir=args.run_dir, steps=args.steps, minutes=args.minutes, batch=args.batch,
        lr=args.lr, ema=args.ema, seed=args.seed, threads=args.threads, init=args.init, progress=not args.quiet,
        command=pretrain_command(args),
    )
    print(f"weights written to {out}")
    return 0
