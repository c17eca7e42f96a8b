"""``flowzoo eval CONFIG_OR_RUN [--steps N] [--samples K] [--out FILE] [--paired-with FILE] [key=value ...]``: the
runner's evaluation.

* A run directory: its ``config.yaml`` rebuilds the experiment and its ``checkpoint.pt`` (the final one of a finished
  run, else the latest) is loaded through the runner's checkpoint loader, which refuses a corrupt checkpoint or one
  written by another config. The evaluation is the run's own (same held-out prompts, noise, ODE steps, guidance), so
  without ``--steps``/``--samples`` it repeats the ``eval_reward`` the run logged at that step.
* A config file (with optional ``key=value`` overrides): its untrained model, i.e. the run's step-0 evaluation.

``--steps N`` sets the ODE steps (``train.eval_num_steps``), ``--samples K`` the samples per held-out prompt
(``train.eval_samples_per_prompt``). The evaluation is :meth:`benchmark.run.runner.Runner.evaluate`: deterministic ODE
samples from the fixed noise stream ``train.eval_seed``, scored by the config's reward. The result (one JSON line on
stdout, and in ``--out FILE``) holds ``eval_reward``, every ``eval/<component>`` and, when the prompts carry a
``tag`` (the tiny tier's GenEval prompts: colors, counting, two_object, position), the same means per tag, and
``eval_reward_se`` / ``eval_reward_ci95``: the mean's standard error clustered by prompt and its 95% interval with
Student's t quantile on C - 1 degrees of freedom for C prompts (the usual small-sample correction of a clustered
standard error, Cameron & Miller 2015, sec. VI; 1.97 at 256 prompts, 3.18 at 4) (the evaluation noise is fixed, so
this is the uncertainty of the held-out sample, not of training). ``--out`` also
keeps every sample's condition and score (``samples``); ``--paired-with FILE`` pairs this evaluation with such a file
of the same prompts, samples and steps (e.g. the base model's, then a trained run's: the same noise, so sample i of one
is sample i of the other) and adds ``paired``: the mean per-sample difference with its prompt-clustered 95% interval
(for prompts as a sample of a larger set), tighter than two unpaired intervals because each prompt's own difficulty
cancels, and ``ci95_fixed_conditions``: the interval for these prompts as fixed (a task of a few chosen prompts, whose
samples differ only in their noise), from the within-prompt spread of the differences. Nothing is written into the run
directory: an ``--out`` inside any run directory, or the config file evaluated, is refused before the evaluation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from flowzoo.algorithms.engine.distributed import SingleProcess
from flowzoo.command_line import MAX_BATCH, MAX_SAMPLING_STEPS, at_most
from flowzoo.errors import ConfigError
from flowzoo.io import atomic_write_text


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom (NaN below 1)."""
    if df < 1:
        return math.nan
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, df))


def clustered_interval(conditions: Sequence[str], values: Sequence[float]) -> tuple[float, float, list[float]]:
    """The mean, its condition-clustered standard error (:func:`clustered_mean`) and its 95% interval on Student's t
    with C - 1 degrees of freedom for C conditions."""
    mean, se = clustered_mean(conditions, values)
    half = t_quantile(len(set(conditions)) - 1) * se
    return mean, se, [mean - half, mean + half]


def fixed_conditions_interval(conditions: Sequence[str], values: Sequence[float]) -> tuple[float, list[float]]:
    """The standard error of the mean of ``values`` with the conditions held fixed (strata: each condition's share
    n_c / N of the mean and the sample variance of its own values), ``sqrt(sum_c (n_c / N)^2 s_c^2 / n_c)``, and its
    95% interval on Student's t with N - C degrees of freedom. NaN when a condition has fewer than two values."""
    groups: dict[str, list[float]] = defaultdict(list)
    for condition, value in zip(conditions, values):
        groups[condition].append(value)
    n = len(values)
    if not n or min(len(g) for g in groups.values()) < 2:
        return math.nan, [math.nan, math.nan]
    mean = sum(values) / n
    variance = 0.0
    for group in groups.values():
        m = sum(group) / len(group)
        variance += (len(group) / n) ** 2 * sum((v - m) ** 2 for v in group) / (len(group) - 1) / len(group)
    se = math.sqrt(variance)
    half = t_quantile(n - len(groups)) * se
    return se, [mean - half, mean + half]


def clustered_mean(conditions: Sequence[str], values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error clustered by condition (each distinct condition one cluster):
    the cluster-robust (Liang-Zeger sandwich) variance of a mean, ``C / (C - 1) * sum_c (sum_{i in c} (v_i -
    mean))^2 / N^2`` over C conditions and N values. (NaN, NaN) without values; the SE is NaN with fewer than two
    conditions."""
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    sums: dict[str, float] = defaultdict(float)
    for condition, value in zip(conditions, values):
        sums[condition] += value - mean
    clusters = len(sums)
    if clusters < 2:
        return mean, math.nan
    return mean, math.sqrt(clusters / (clusters - 1) * sum(v * v for v in sums.values())) / len(values)


class _TagRecorder:
    """The reward, recording each scored batch's output with its metadata (for the per-tag means)."""

    def __init__(self, reward):
        self.reward = reward
        self.batches: list[tuple[object, list[dict]]] = []
        self.prompts: list[str] = []

    def __getattr__(self, name):
        return getattr(self.reward, name)

    def __call__(self, samples, prompts, metadata):
        out = self.reward(samples, prompts, metadata)
        from flowzoo.source_images import portable_condition_key

        rows = list(metadata or [{} for _ in prompts])
        self.batches.append((out, rows))
        self.prompts += [portable_condition_key(prompt, meta) for prompt, meta in zip(prompts, rows)]
        return out

    def interval(self) -> dict[str, float]:
        """The mean score's standard error clustered by condition, and its 95% interval (t on C - 1 degrees of
        freedom, :func:`clustered_interval`).

        Samples of one condition (its repeats in the prompt list and its samples per prompt) are correlated, so the
        standard error treats each distinct condition as one cluster (the prompt text, joined by its source image for
        an edit prompt: ``flowzoo.source_images.portable_condition_key``; one instruction on two sources is two
        clusters): the cluster-robust variance of a mean (:func:`clustered_mean`). NaN with fewer than two distinct
        prompts."""
        _, se, ci = clustered_interval(self.prompts, self.samples()["scores"])
        return {"eval_reward_se": se, "eval_reward_ci95": ci}

    def samples(self) -> dict[str, list]:
        """Every scored sample in evaluation order: its condition
        (:func:`flowzoo.source_images.portable_condition_key`: a source image file by its bytes' digest, so a file
        pairs across checkouts and holds no paths) and its score; what ``--out`` keeps so that another evaluation
        can be paired with it (``--paired-with``)."""
        return {"conditions": list(self.prompts),
                "scores": [float(v) for out, _ in self.batches for v in out.score.tolist()]}

    def by_tag(self) -> dict[str, dict[str, float]]:
        """{tag: {"eval_reward": mean score, "eval/<component>": mean}} when the samples carry two or more tags."""
        totals: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for out, metadata in self.batches:
            columns = {"eval_reward": out.score, **{f"eval/{k}": v for k, v in out.components.items()}}
            for column, values in columns.items():
                for value, meta in zip(values.tolist(), metadata):
                    totals[meta.get("tag")][column].append(float(value))
        if None in totals or len(totals) < 2:
            return {}
        return {tag: {c: sum(v) / len(v) for c, v in cols.items()} for tag, cols in sorted(totals.items())}


def paired_difference(samples: dict[str, list], other: dict, where: str) -> dict:
    """This evaluation minus ``other`` (an ``--out`` record of the same prompts, samples per prompt, steps and
    evaluation noise: the samples pair one to one), with the standard error of the mean difference clustered by
    condition as :meth:`_TagRecorder.interval` clusters scores (``se``, ``ci95``, over ``clusters`` conditions), and
    with the conditions held fixed (``se_fixed_conditions``, ``ci95_fixed_conditions``:
    :func:`fixed_conditions_interval`), the interval for a claim about these prompts only. Pairing removes the prompts' own difficulty from the
    uncertainty, so a small change of a model is measurable where two unpaired intervals overlap. One-line
    ConfigError naming ``where`` when ``other`` keeps no samples or they do not pair."""
    kept = kept_samples(other, where)
    if kept.get("conditions") != samples["conditions"]:
        n, m = len(samples["conditions"]), len(kept.get("conditions") or [])
        raise ConfigError(f"{where}: its samples do not pair with these ({m} vs {n} samples, or other prompts or "
                          "order): evaluate both with the same prompts, --samples and --steps")
    diffs = [a - b for a, b in zip(samples["scores"], kept["scores"])]
    mean, se, ci = clustered_interval(samples["conditions"], diffs)
    fixed_se, fixed_ci = fixed_conditions_interval(samples["conditions"], diffs)
    return {"with": where.removeprefix("--paired-with "), "diff": mean, "se": se, "ci95": ci,
            "clusters": len(set(samples["conditions"])), "se_fixed_conditions": fixed_se,
            "ci95_fixed_conditions": fixed_ci, "better": sum(d > 0 for d in diffs),
            "worse": sum(d < 0 for d in diffs), "samples": len(diffs)}


def kept_samples(record: object, where: str) -> dict[str, list]:
    """The per-sample scores an ``--out`` record keeps; one-line ConfigError naming ``where`` when it keeps none."""
    kept = record.get("samples") if isinstance(record, dict) else None
    if not isinstance(kept, dict) or not isinstance(kept.get("scores"), list):
        raise ConfigError(f"{where}: keeps no per-sample scores; write it with `flowzoo eval ... --out FILE` (this "
                          "version) to pair with it")
    return kept


#: what makes a folder a run directory for ``--out``: its config.yaml and one file training writes beside it
RUN_FILES = ("metrics.csv", "done.json", "checkpoint.pt")


def run_directory_above(path: Path) -> Path | None:
    """The run directory (config.yaml and one of :data:`RUN_FILES`) that holds ``path``, at any depth, or None."""
    for folder in path.resolve().parents:
        if (folder / "config.yaml").is_file() and any((folder / name).exists() for name in RUN_FILES):
            return folder
    return None


def check_out_file(out: Path, target: Path | None = None) -> Path:
    """``--out FILE`` can be written (checked before the evaluation, which may take minutes): a file path in an
    existing, writable directory, outside the shipped weights, outside every run directory (the evaluated run's and
    any other's: a run's files are its own) and not the config file it evaluates."""
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(out, "--out")
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(f"--out {str(out)!r}: need a file path in an existing directory")
    if target is not None and target.is_file() and out.exists() and out.resolve() == target.resolve():
        raise ConfigError(f"--out {str(out)!r} is the file it evaluates; give another path")
    run = run_directory_above(out)
    if run is not None:
        raise ConfigError(f"--out {str(out)!r} is inside the run directory {str(run)!r}: a run's files are its own "
                          f"(eval writes nothing into a run); give a path outside it")
    if not os.access(out.parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ConfigError(f"--out {str(out)!r}: {'the file' if out.exists() else 'its directory'} is not writable "
                          f"(permissions or a read-only file system)")
    return out


def _target(path: Path, overrides: Sequence[str]):
    """(config, checkpoint state or None, checkpoint path or None) of a run directory or a config file."""
    from flowzoo.benchmark.run.run_source import load_run
    from flowzoo.benchmark.run.runner import load_trained_run
    from flowzoo.benchmark.run.suite import parse_cell_ref

    if path.is_dir():
        if overrides:
            raise ConfigError(f"key=value overrides ({' '.join(overrides)}) apply to a config file; a run is evaluated "
                              f"as it was trained (change --steps/--samples, or evaluate its config.yaml)")
        return load_trained_run(path, f"evaluate {str(path / 'config.yaml')!r} for the untrained model")
    if not path.is_file() and parse_cell_ref(str(path)) is None:
        raise ConfigError(f"{str(path)!r} does not exist; give a config file, a run directory or a suite's cell "
                          f"SUITE:TASK/ALGORITHM")
    return load_run(str(path), overrides)[0], None, None


def evaluate(
    target: str | Path, steps: int | None = None, samples: int | None = None, out: str | Path | None = None,
    overrides: Sequence[str] = (), paired_with: str | Path | None = None,
) -> dict:
    """Evaluate a run's checkpoint or a config's untrained model (module docstring); returns the result record (the
    ``--out`` file's, which also keeps every sample's score under ``samples``). ``paired_with``: an earlier ``--out``
    file of the same evaluation; the record then holds ``paired``, this minus that (:func:`paired_difference`)."""
    from flowzoo.benchmark.run.runner import Runner, finished_summary

    for flag, value in (("--steps", steps), ("--samples", samples)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    if out is not None:
        out = check_out_file(Path(out), Path(target))
    other = None
    if paired_with is not None:
        try:
            other = json.loads(Path(paired_with).read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(f"--paired-with {str(paired_with)!r}: not a readable `flowzoo eval --out` file "
                              f"({error.__class__.__name__})") from None
        kept_samples(other, f"--paired-with {paired_with}")  # before the evaluation: a file that cannot pair at all
    path = Path(target)
    config, state, checkpoint = _target(path, overrides)
    train = dataclasses.replace(
        config.train, save_samples=False,
        eval_num_steps=config.train.eval_num_steps if steps is None else steps,
        eval_samples_per_prompt=config.train.eval_samples_per_prompt if samples is None else samples,
    )
    runner = Runner(dataclasses.replace(config, train=train), progress=False, dist=SingleProcess())
    runner.build()
    step = 0
    if state is not None:
        runner.algorithm.load_state_dict(state["algorithm"])
        step = state["step"]
    recorder = _TagRecorder(runner.reward)
    runner.reward = recorder
    t0 = time.perf_counter()
    result = runner.evaluate(step)
    record = {
        "source": str(path),
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "step": step,
        "finished": finished_summary(path, config) is not None if checkpoint is not None else None,
        "model": config.model.name,
        "algorithm": config.algorithm_name,
        "reward": config.reward,
        "eval_sampler": runner.eval_sampler.label,
        "guidance": runner.eval_sampler.effective_guidance(runner.model),
        "shift": runner.eval_sampler.shift,
        "num_steps": runner.eval_sampler.num_steps,
        "prompts": len(runner.eval_prompts),
        "samples_per_prompt": train.eval_samples_per_prompt,
        **result,
        **recorder.interval(),
        "eval_s": round(time.perf_counter() - t0, 2),
    }
    by_tag = recorder.by_tag()
    if by_tag:
        record["by_tag"] = by_tag
    kept = recorder.samples()
    if other is not None:
        record["paired"] = paired_difference(kept, other, f"--paired-with {paired_with}")
    record["samples"] = kept
    if out is not None:
        atomic_write_text(out, json.dumps(record, indent=2) + "\n")
    return record


DESCRIPTION = ("A run directory: its last checkpoint (the final one of a finished run) under its own config. A "
               "config:\nits untrained model. Prints one JSON line (eval_reward, eval/<component>, per-tag means); "
               "writes\nnothing into the run.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo eval``'s arguments."""
    parser.add_argument("target", metavar="CONFIG_OR_RUN", help="a run directory, a YAML config or a suite's cell "
                        "SUITE:TASK/ALGORITHM")
    parser.add_argument("overrides", nargs="*", default=[],
                        help="key=value overrides of a config, e.g. algorithm.guidance=3")
    parser.add_argument("--steps", type=at_most(MAX_SAMPLING_STEPS), default=None, metavar="N",
                        help="ODE steps (default: the config's train.eval_num_steps)")
    parser.add_argument("--samples", type=at_most(MAX_BATCH), default=None, metavar="K",
                        help="samples per held-out prompt (default: the config's train.eval_samples_per_prompt)")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the result as JSON to FILE, with "
                        "every sample's score (what --paired-with reads)")
    parser.add_argument("--paired-with", default=None, metavar="FILE", help="an earlier --out FILE of the same "
                        "prompts, samples and steps (e.g. the base model's): adds `paired`, this minus that per "
                        "sample, its mean with a 95%% interval clustered by prompt")


def run(args: argparse.Namespace) -> int:
    """``flowzoo eval``: the record as one JSON line."""
    record = evaluate(args.target, args.steps, args.samples, args.out, args.overrides, args.paired_with)
    print(json.dumps({k: v for k, v in record.items() if k != "samples"}))
    return 0
