"""Base-model scores of the tiny tier: deterministic ODE samples of the 256 held-out prompts, scored by the task's
reward, exactly as ``Runner.evaluate`` does (same noise seeds), plus per-tag strict accuracy.

    python -m benchmark.tiny_eval --data shapes [--weights PATH] [--checkpoint RUN/checkpoint.pt] [--guidance 3 4]
                                  [--steps 10] [--out record.json] [--grid samples.png]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from algorithms.rollout import sample_generators, sample_ode
from algorithms.sde import sigma_schedule
from flowzoo.io import atomic_write_text

REWARD_OF_DATA = {"shapes": "shapes_geneval", "glyphs": "ocr"}
EVAL_SEED = 12345  # TrainSection.eval_seed's default: the runner's evaluation noise


@torch.no_grad()
def evaluate(model, reward, prompts: list[tuple[str, dict]], num_steps: int = 10, guidance: float | None = None,
             samples_per_prompt: int = 1, seed: int = EVAL_SEED, chunk: int = 128) -> dict:
    texts = [p for p, _ in prompts for _ in range(samples_per_prompt)]
    metadata = [m for _, m in prompts for _ in range(samples_per_prompt)]
    generators = sample_generators(seed, count=len(texts))
    sigmas = sigma_schedule(num_steps, model.default_shift)
    scores, components, images = [], defaultdict(list), []
    for start in range(0, len(texts), chunk):
        sl = slice(start, start + chunk)
        x = sample_ode(model, model.encode(texts[sl], metadata[sl]), sigmas, model.initial_noise(generators[sl]), guidance)
        decoded = model.decode(x)
        out = reward(decoded, texts[sl], metadata[sl])
        scores.append(out.score)
        images.append(decoded)
        for name, values in out.components.items():
            components[name].append(values)
    score = torch.cat(scores)
    record = {"samples": len(texts), "num_steps": num_steps, "guidance": model.default_guidance if guidance is None else guidance,
              "score": round(float(score.mean()), 4)}
    for name, values in components.items():
        values = torch.cat(values)
        record[name] = round(float(values.mean()), 4)
        by_tag = defaultdict(list)
        for value, meta in zip(values.tolist(), metadata):
            by_tag[meta.get("tag", "all")].append(value)
        if len(by_tag) > 1:
            record[f"{name}_by_tag"] = {tag: round(sum(v) / len(v), 4) for tag, v in sorted(by_tag.items())}
    record["images"] = torch.cat(images)
    return record


def main(argv: list[str] | None = None) -> None:
    import models
    import rewards
    from benchmark.config import PromptSection
    from benchmark.prompts import load_prompts
    from benchmark.samples import save_samples

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", choices=list(REWARD_OF_DATA), default="shapes")
    p.add_argument("--weights", default="auto")
    p.add_argument("--guidance", type=float, nargs="+", default=[None])
    p.add_argument("--checkpoint", default=None, help="a run's checkpoint.pt: evaluate its trained LoRA")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON record (default: print only)")
    p.add_argument("--grid", default=None, help="PNG of the first 64 samples")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = models.get("tiny")(data=args.data, weights=args.weights)
    if args.checkpoint:
        model.load_trainable_state_dict(torch.load(args.checkpoint, weights_only=False)["algorithm"]["model"])
    reward = rewards.build(REWARD_OF_DATA[args.data], {"ocr": {"upscale": 2, "pad": 4}} if args.data == "glyphs" else None)
    _, eval_prompts = load_prompts(PromptSection(source=f"tiny_{args.data}"))
    results = []
    for guidance in args.guidance:
        t0 = time.perf_counter()
        record = evaluate(model, reward, eval_prompts, args.steps, guidance)
        images = record.pop("images")
        record["eval_s"] = round(time.perf_counter() - t0, 1)
        record["weights"] = str(model.path)
        record["pretrain_steps"] = model.weights_info.get("pretrain", {}).get("steps_done")
        record["checkpoint"] = args.checkpoint
        print(json.dumps(record), flush=True)
        results.append(record)
        if args.grid:
            save_samples(images[:64], "image", Path(args.grid), [p for p, _ in eval_prompts[:64]])
    if args.out:
        atomic_write_text(args.out, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
