"""``flowzoo perf``: the timing of one Flow-GRPO iteration against the released-style loop (``measure``), or with
``--gpu-check`` the GPU path's check (``gpu``)."""

from __future__ import annotations

import sys

from flowzoo.benchmark.config.argument_ranges import check_device
from flowzoo.benchmark.perf.measure import format_result, load_model, parse_overrides, run
from flowzoo.errors import ConfigError


def command(args) -> int:
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
    result = run(model, overrides, repeats=args.repeats, prompts_per_step=args.prompts, device=args.device)
    print(format_result(result, args.device))
    rel = result["grad_rel_diff"]
    if rel is not None and not rel < 1e-5:
        print(f"flowzoo: error: gradients differ by {rel:.2e} (> 1e-5)", file=sys.stderr)
        return 1
    return 0
