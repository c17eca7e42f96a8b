"""``flowzoo perf``: the timing of one Flow-GRPO iteration against the released-style loop (``measure``), or with
``--gpu-check`` the GPU path's check (``gpu``)."""

from __future__ import annotations

import argparse
import sys

from flowzoo.benchmark.config.argument_ranges import check_device
from flowzoo.benchmark.perf.measure import format_result, load_model, parse_overrides, run as time_iteration
from flowzoo.command_line import MAX_BATCH, MAX_LORA_RANK, MAX_REPEATS, at_most
from flowzoo.errors import ConfigError

DESCRIPTION = ("Interleaved medians, phase split, peak memory and a gradient check (exit 1 if the gradients "
               "differ by more than 1e-5).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("overrides", nargs="*", default=[], help="algorithm key=value overrides, e.g. reuse_rollout_graph=true")
    add("--model-path", default=None, help="SD3 diffusers directory (default: a tiny random pipeline)")
    add("--device", default="cpu", help="torch device")
    add("--lora-rank", type=at_most(MAX_LORA_RANK), default=32, help="LoRA rank (32 is the released recipe)")
    add("--repeats", type=at_most(MAX_REPEATS), default=None,
        help="interleaved repetitions per variant (default 5; 3 with --gpu-check)")
    add("--prompts", type=at_most(MAX_BATCH), default=1, help="prompts per iteration, group_size samples each")
    add("--gpu-check", action="store_true", help="SD3.5-Medium-, FLUX.1-dev- and Qwen-Image-sized random "
        "transformers against the released step structures, sized for one H100 80 GB in 8 minutes (docs/perf.md); "
        "needs --device cuda")
    add("--plan", action="store_true", help="with --gpu-check: list its variants, expected memory and H100 seconds "
        "and the time budget, and run nothing (works on the CPU)")
    add("--wheels", default=None, metavar="DIR", help="with --gpu-check on a machine without a package registry: "
        "install DIR's wheels (e.g. diffusers) into a temporary folder first, offline")
    add("--precision", action="store_true", help="per trained step, how far the update's recomputed log-probs drift "
        "from the rollout's in float32, bfloat16 and float16 (docs/perf.md)")


def run(args: argparse.Namespace) -> int:
    """Exit 1 when the gradients differ by more than 1e-5 (relative)."""
    from flowzoo.benchmark.perf import gpu_plan

    if args.repeats is None:
        args.repeats = gpu_plan.REPEATS if args.gpu_check else 5
    for option, value in (("--repeats", args.repeats), ("--prompts", args.prompts), ("--lora-rank", args.lora_rank)):
        if value < 1:
            raise ConfigError(f"perf: {option} {value} must be >= 1")
    check_device(args.device, "perf: --device")
    for option, value in (("--plan", args.plan), ("--wheels", args.wheels)):
        if value and not args.gpu_check:
            raise ConfigError(f"perf: {option} belongs to the GPU check; use it with --gpu-check")
    overrides = parse_overrides(args.overrides)
    if args.gpu_check and args.plan:
        print(gpu_plan.format_plan())
        return 0
    if args.gpu_check:
        if args.wheels is not None:
            from flowzoo.benchmark.perf.offline import install_wheels

            print(f"installed offline into {install_wheels(args.wheels)}", flush=True)
        from flowzoo.benchmark.perf import gpu

        gpu.main(args.device, overrides, repeats=args.repeats)
        return 0
    if args.precision:
        from flowzoo.benchmark.perf.precision import format_drift, measure

        print(format_drift(measure(args.model_path, args.device, args.lora_rank, prompts=args.prompts,
                                   overrides=overrides)))
        return 0
    model = load_model(args.model_path, args.device, args.lora_rank)
    result = time_iteration(model, overrides, repeats=args.repeats, prompts_per_step=args.prompts, device=args.device)
    print(format_result(result, args.device))
    rel = result["grad_rel_diff"]
    if rel is not None and not rel < 1e-5:
        print(f"flowzoo: error: gradients differ by {rel:.2e} (> 1e-5)", file=sys.stderr)
        return 1
    return 0
