"""One training run: the loop, evaluation, checkpoint/resume and logging into a run directory.

A run directory holds ``config.yaml`` (fully resolved), ``metrics.csv`` (one row per training step plus the step-0
evaluation), ``checkpoint.pt`` (everything a resume needs), ``samples/step_N.png`` and, once finished, ``done.json``.
Every file is written atomically. A killed run restarts from its last checkpoint and, because all randomness is
derived from (seed, iteration), produces the same metrics as an uninterrupted run (except wall-clock columns).
The experiment is built and checked (``benchmark.run.experiment.build``) before the run directory is created; a fresh
run that fails before its first checkpoint removes what it created, so that a corrected rerun is not refused as a
run of another config.

Under ``accelerate launch`` / ``torchrun`` (``algorithms/engine/distributed.py``) every process runs this loop on its shard
of each batch; the main process alone takes the run-directory lock and writes files, evaluation is sharded over the
processes and gathered, and a global batch that does not split evenly over the processes is refused before any work.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import yaml
from tqdm.auto import tqdm

from flowzoo.algorithms.engine.distributed import SingleProcess, from_environment
from flowzoo.algorithms.engine.rollout import sample_generators, sample_ode
from flowzoo.benchmark.run import experiment
from flowzoo.benchmark.measures.diversity import feature_spread, per_prompt_spread
from flowzoo.benchmark.run.checkpoints import check_seal, config_digest, prompts_digest, run_identity, seal
from flowzoo.benchmark.config.schema import (
    OPTIONAL_STORED_KEYS, ExperimentConfig, declared_secrets, read_stored_config, resolved_dict,
)
from flowzoo.benchmark.config.inert import check_trains_something
from flowzoo.benchmark.run.machine import machine_record
from flowzoo.benchmark.run.memory import fit_run
from flowzoo.benchmark.measures.divergence import DivergenceGuard, nonfinite_parameters
from flowzoo.benchmark.run.sample_pictures import save_samples
from flowzoo.benchmark.run.tracking import Trackers, check_tracker_environment
from flowzoo.rewards.pool import RewardPool
from flowzoo.errors import ConfigError, FlowZooError, RunError, os_error_line
from flowzoo.io import atomic_torch_save, atomic_write, atomic_write_text, exclusive_lock

#: leading metrics.csv columns (the contract); the rest follow in the order they first appear
LEADING_COLUMNS = ["step", "nfe", "wall_s", "reward_mean", "reward_std", "eval_reward", "clip_frac", "approx_kl", "kl"]
#: the largest evaluation noise (bytes) a run keeps between its evaluations instead of drawing it again
EVAL_NOISE_CACHE_BYTES = 64 * 2**20
#: metrics.csv is rewritten at every evaluation and checkpoint and at the end, and otherwise at most this often
#: (seconds): rewriting the whole file after every step of a fast toy run cost ~7% of its time
METRICS_WRITE_INTERVAL_S = 5.0
#: columns that measure time, and so differ between otherwise identical runs
TIMING_COLUMNS = ["wall_s", "t_sampling", "t_reward", "t_training", "t_eval"]


def metrics_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for column in LEADING_COLUMNS:
        if column not in frame:
            frame[column] = np.nan
    rest = [c for c in frame.columns if c not in LEADING_COLUMNS]
    return frame[LEADING_COLUMNS + rest]


def is_finished(run_dir: Path, config: ExperimentConfig) -> bool:
    """A run is finished when ``done.json`` exists, its config is the one asked for, and ``done.json`` was written by
    a run of that config (its ``config_digest``, the checkpoint seal's: an edited config.yaml does not turn another
    config's finished run into this one's). A run that is not finished by this test resumes from its checkpoint,
    whose seal refuses one of another config, or re-writes done.json if its last step is done."""
    return _same_config(run_dir, config) and finished_summary(run_dir, config) is not None


def finished_summary(run_dir: Path, config: ExperimentConfig) -> dict | None:
    """``done.json`` of the run of ``config`` in ``run_dir``, or None: no done.json, an unreadable one, or one written
    by a run of another config. A done.json without a digest (written before digests) is taken as it is."""
    try:
        summary = json.loads((run_dir / "done.json").read_text())
    except (OSError, ValueError):  # missing, unreadable, not JSON (a ValueError)
        return None
    if not isinstance(summary, dict):
        return None
    digest = summary.get("config_digest")
    return summary if digest is None or digest == config_digest(config) else None


def holds_other_config(run_dir: Path, config: ExperimentConfig) -> bool:
    """``run_dir`` holds a run (its config.yaml) of another config than ``config``; the leftovers of a fresh run
    killed before its first checkpoint hold nothing to keep (:func:`killed_before_checkpoint`) and are no run."""
    return ((run_dir / "config.yaml").is_file() and not _same_config(run_dir, config)
            and not killed_before_checkpoint(run_dir))


#: what a fresh run writes before its first checkpoint (besides its .lock): removed when the run directory is reused
FRESH_RUN_FILES = ("config.yaml", "metrics.csv", "samples")


def killed_before_checkpoint(run_dir: Path) -> bool:
    """``run_dir`` holds only what a fresh run writes before its first checkpoint, left by a kill (SIGKILL, a power
    cut) that gave it no chance to remove it: the runner's ``.lock``, a ``config.yaml`` that is a resolved config
    (every top-level key of one, as only the runner writes it), and no ``checkpoint.pt`` or ``done.json``."""
    from dataclasses import fields

    if not (run_dir / ".lock").is_file() or (run_dir / "checkpoint.pt").exists() or (run_dir / "done.json").exists():
        return False
    try:
        stored = read_stored_config(run_dir / "config.yaml")
    except ConfigError:
        return False
    names = {f.name for f in fields(ExperimentConfig)}
    return set(stored) - set(OPTIONAL_STORED_KEYS) == names - set(OPTIONAL_STORED_KEYS) and set(stored) <= names


def _same_config(run_dir: Path, config: ExperimentConfig) -> bool:
    if not (run_dir / "config.yaml").is_file():
        return False
    try:
        stored = read_stored_config(run_dir / "config.yaml")
    except ConfigError:  # an unreadable config.yaml (or one past a config's bounds) is no config of ours
        return False
    wanted = resolved_dict(config)
    declared = declared_secrets(config)  # a key is no part of the experiment: literal, *** or from the environment
    return run_identity(stored, declared) == run_identity(wanted, declared)


class Runner:
    """Trains one algorithm on one task for ``config.train.steps`` iterations in ``run_dir``."""

    def __init__(self, config: ExperimentConfig, progress: bool = True, dist: SingleProcess | None = None,
                 on_evaluation: Callable[[list[dict]], None] | None = None):
        """``on_evaluation(rows)``: called with the run's metric rows so far (a resumed run's included) after the
        first evaluation or the resume, and after every evaluation (``flowzoo tune`` reports them to its pruner); an
        exception it raises stops the run there, its last checkpoint kept."""
        self.on_evaluation = on_evaluation
        self.config = config
        self.run_dir = config.resolved_run_dir()
        self.progress = progress
        self.dist = from_environment() if dist is None else dist
        self._eval_noise: dict[int, torch.Tensor] = {}  # sample count -> kept noise (_evaluation_noise)
        self._metrics_written = -math.inf  # time.monotonic() of the last metrics.csv write (_write_metrics)

    # ---- building -------------------------------------------------------------------------------------------
    def build(self) -> None:
        """The experiment (``benchmark.run.experiment.build``: every check, nothing written) and its parts."""
        built = experiment.build(self.config, self.dist)
        self.experiment = built
        self.model, self.reward, self.algorithm = built.model, built.reward, built.algorithm
        self.train_prompts, self.eval_prompts = built.train_prompts, built.eval_prompts
        self.eval_sampler, self.own_sampler = built.eval_sampler, built.own_sampler
        self.gold, self.unseen_prompts, self.features = built.gold, built.unseen_prompts, built.features

    # ---- evaluation -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """Mean reward of deterministic ODE samples on the held-out prompts, with the same noise every time, drawn by
        the evaluation protocol's sampler (``train.eval_sampler``, benchmark/measures/evaluation.py):
        ``{"eval_reward": mean score, "eval/<component>": mean of each of the reward's components}`` (for example
        ``eval/strict_accuracy`` of the GenEval rewards), ``eval_spread`` (with 2 or more samples per prompt: the mean
        over prompts of the mean pairwise distance of each prompt's samples, benchmark/measures/diversity.py),
        with ``train.spread_features`` the same on CLIP image embeddings (mean cosine distance) as
        ``eval_spread_features``,
        with ``train.gold`` the gold measure of the same samples as ``eval_gold`` (a judge, higher is better) or
        ``eval_gold_distance`` (a distance, lower is better; benchmark/measures/gold.py), with
        ``prompts.unseen`` the mean reward of the prompts never trained on as ``eval_unseen_reward`` (same sampler,
        same samples per prompt, noise from the same seed), and with ``train.eval_own`` the algorithm's own sampler's
        mean as ``eval_own_reward``.

        Each process samples a contiguous shard of the evaluation samples; scores (and samples) are gathered.
        Samples go in chunks of ``train.eval_batch`` (default: the model's ``default_eval_batch``); each chunk is scored in a background thread while the next one
        is sampled (a reward failure is raised with the reward's name and cause)."""
        cfg = self.config
        n = cfg.train.eval_samples_per_prompt
        prompts = [p for p, _ in self.eval_prompts for _ in range(n)]
        metadata = [m for _, m in self.eval_prompts for _ in range(n)]
        scores, outputs, samples = self._score_samples(prompts, metadata, self.eval_sampler)
        local = torch.cat(samples) if samples else torch.zeros(0)
        result = {"eval_reward": float(scores.mean())}
        sums = [(f"eval/{name}", float(v.float().sum()), len(v)) for o in outputs for name, v in o.components.items()]
        if self.gold is not None and not self.gold.needs_groups:  # a judge per sample: on this process's shard
            shard = self.dist.shard(len(prompts), even=False)
            gold = self.gold.scores(local, prompts[shard.start:shard.stop], metadata[shard.start:shard.stop])
            sums.append((self.gold.column, float(gold.sum()), len(gold)))
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # column -> [sum, count] over processes
        for part in self.dist.all_gather_object(sums):  # one collective, whatever each process holds
            for name, total, count in part:
                totals[name][0] += total
                totals[name][1] += count
        result.update({name: total / count for name, (total, count) in totals.items() if count})
        if cfg.train.save_samples or n >= 2:  # every process gathers (a collective either way)
            samples = self.dist.cat(local)
        if n >= 2:  # the variety of each prompt's samples (benchmark/measures/diversity.py): 0 when collapsed
            result["eval_spread"] = sum(per_prompt_spread(samples, n)) / len(self.eval_prompts)
        if self.features is not None:  # each process embeds its shard; every process reads every prompt's embeddings
            embedded = self.features.embed(local) if len(local) else local.new_zeros(0, 0)
            result["eval_spread_features"] = feature_spread(self.dist.cat(embedded), n)
        if self.gold is not None and self.gold.needs_groups:  # every process holds every prompt's samples (n >= 2)
            result[self.gold.column] = self.gold.measure(samples, metadata, n)
        if cfg.train.save_samples:
            if self.dist.is_main:
                save_samples(samples, self.model.sample_kind, self.run_dir / "samples" / f"step_{step}.png", prompts,
                             rewards=scores.tolist())
        if self.unseen_prompts:  # prompts never trained on: same sampler, samples per prompt and noise seed
            unseen = [p for p, _ in self.unseen_prompts for _ in range(n)]
            unseen_meta = [m for _, m in self.unseen_prompts for _ in range(n)]
            result["eval_unseen_reward"] = float(self._score_samples(unseen, unseen_meta, self.eval_sampler)[0].mean())
        if self.own_sampler is not None:  # the algorithm's own evaluation: an extra column, same noise and prompts
            result["eval_own_reward"] = float(self._score_samples(prompts, metadata, self.own_sampler)[0].mean())
        self.algorithm.check_lockstep(f"the evaluation at step {step}")
        return result

    def _score_samples(self, prompts: list[str], metadata: list, sampler) -> tuple[torch.Tensor, list, list]:
        """Deterministic ODE samples of ``prompts`` with ``sampler`` (its grid and CFG scale) from the evaluation
        noise, scored: every process's scores gathered, this process's reward outputs and decoded samples."""
        noise = self._evaluation_noise(len(prompts))
        pending, samples = [], []
        chunk = self.config.train.eval_batch or self.model.default_eval_batch
        shard = self.dist.shard(len(prompts), even=False)
        starts = range(shard.start, shard.stop, chunk)
        # with algorithm.ema on, the moving average of the weights samples (as released Flow-GRPO evaluates); an
        # evaluation's network calls are not a run's NFE
        with self.algorithm.evaluation_weights(), RewardPool(self.reward) as pool, self.model.uncounted(), \
                self.algorithm.lockstep_phase("evaluation"):
            # a sharded transformer's calls are collectives: a process with fewer chunks samples one discarded sample
            # per missing chunk, so that every process makes as many calls (algorithms/engine/lockstep.py)
            self.algorithm.padding_samples(len(starts), prompts, metadata, sampler.sigmas, sampler.guidance)
            for start in starts:
                sl = slice(start, min(start + chunk, shard.stop))
                cond = self.model.encode(prompts[sl], metadata[sl])
                x1 = noise[sl] if isinstance(noise, torch.Tensor) else self.model.initial_noise(noise[sl])
                x0 = sample_ode(self.model, cond, sampler.sigmas, x1, sampler.guidance)
                decoded = self.model.decode(x0)
                pending.append(pool.submit(decoded, prompts[sl], metadata[sl]))
                samples.append(decoded.cpu())
            outputs = [future.result() for future in pending]
        scores = self.dist.cat(torch.cat([o.score for o in outputs]) if outputs else torch.zeros(0))
        return scores, outputs, samples

    def _evaluation_noise(self, count: int) -> torch.Tensor | list[torch.Generator]:
        """The evaluation's initial noise, the same at every evaluation (``train.eval_seed``): drawn once and kept
        when it is small (EVAL_NOISE_CACHE_BYTES; the toy tier's 2048 points are 16 KiB), else the generators that
        draw it chunk by chunk. Either way each sample's noise comes from its own generator, so the samples are the
        same."""
        if count in self._eval_noise:
            return self._eval_noise[count]
        generators = sample_generators(self.config.train.eval_seed, count=count)
        per_sample = math.prod(self.model.latent_shape) * torch.finfo(self.model.latent_dtype).bits // 8
        if count * per_sample > EVAL_NOISE_CACHE_BYTES:
            return generators
        self._eval_noise[count] = self.model.initial_noise(generators)
        return self._eval_noise[count]

    # ---- the loop -------------------------------------------------------------------------------------------
    def _checkpoint(self, step: int, rows: list[dict], wall_s: float, nfe: int) -> None:
        if self.model.sharded:  # every process gathers the full state with the others (collectives); rank 0 writes
            algorithm_state = self.algorithm.state_dict()
            self._write_sharding(step)
        elif not self.dist.is_main:
            return
        else:
            algorithm_state = self.algorithm.state_dict()
        if not self.dist.is_main:
            return
        state = {"step": step, "algorithm": algorithm_state, "rows": rows, "wall_s": wall_s, "nfe": nfe,
                 "prompts": self._prompts_digest()}
        atomic_torch_save(seal(state, self.config), self.run_dir / "checkpoint.pt")  # bound to this config

    def _prompts_digest(self) -> str:
        return prompts_digest(self.train_prompts, self.eval_prompts, self.unseen_prompts or [])

    def _write_sharding(self, step: int) -> None:
        """``sharding.json``: what each process holds of the sharded model and its optimizer state (elements of its
        local shards, measured), written with every checkpoint of a sharded run."""
        from flowzoo.models.sharding import local_numel, optimizer_state_tensors

        params = self.model.trainable_parameters()
        moments = optimizer_state_tensors(self.algorithm.optimizer)
        every = [p for module in self.model.fsdp_modules() for p in module.parameters()]
        mine = {"rank": self.dist.rank, "trainable_parameters": local_numel(params),
                "optimizer_state": local_numel(moments), "sharded_module_parameters": local_numel(every)}
        ranks = self.dist.all_gather_object(mine)
        if not self.dist.is_main:
            return
        record = {**self.experiment.sharding, "step": step,
                  "totals": {"trainable_parameters": sum(p.numel() for p in params),
                             "optimizer_state": sum(t.numel() for t in moments),
                             "sharded_module_parameters": sum(p.numel() for p in every)},
                  "ranks": ranks}
        atomic_write_text(self.run_dir / "sharding.json", json.dumps(record, indent=2) + "\n")

    def _load_checkpoint(self, path: Path) -> dict[str, Any]:
        """The saved state, or a RunError that says the file is corrupt and what to do."""
        try:
            # onto the host, whatever device wrote it (a checkpoint of cuda:3 resumes on cuda:0 or a CPU-only machine);
            # each part's load_state_dict then puts it on the run's device (weights, optimizer state, EMA/old-policy
            # copies), while generator states and the replay buffer stay on the host, where they belong
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a truncated zip, pickle garbage, ...
            raise RunError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}); delete it to restart "
                           f"the run from step 0") from None
        if isinstance(state, dict) and {"settings", "nets", "ema"} <= set(state):  # not ours to delete
            raise RunError(f"{path} is a `flowzoo pretrain` checkpoint, not a training run's; choose another run_dir")
        if not isinstance(state, dict):
            raise RunError(f"checkpoint {path} holds a {type(state).__name__}, not a training run's state; delete it "
                           f"to restart the run from step 0")
        missing = {"step", "algorithm", "rows", "wall_s", "nfe"} - set(state)
        if missing:
            raise RunError(f"checkpoint {path} lacks {sorted(missing)}; delete it to restart the run from step 0")
        check_seal(state, self.config, path)
        if not 0 <= state["step"] <= self.config.train.steps or len(state["rows"]) != state["step"] + 1:
            raise RunError(f"checkpoint {path} is inconsistent (step {state['step']}, {len(state['rows'])} metric "
                           f"rows, run of {self.config.train.steps} steps); delete it to restart the run")
        return state

    def _write_metrics(self, rows: list[dict], due: bool = True) -> None:
        """Rewrite metrics.csv from ``rows``; when not ``due`` (a plain training step), only if the last write is
        METRICS_WRITE_INTERVAL_S old (a reader watching the run sees it move; the checkpoint holds the rows)."""
        if not self.dist.is_main:
            return
        now = time.monotonic()
        if not due and now - self._metrics_written < METRICS_WRITE_INTERVAL_S:
            return
        self._metrics_written = now
        frame = metrics_frame(rows)
        atomic_write(self.run_dir / "metrics.csv", lambda f: frame.to_csv(f, index=False))

    def run(self) -> Path:
        cfg = self.config
        run_dir = self.run_dir
        if holds_other_config(run_dir, cfg):
            raise ConfigError(f"run directory {run_dir} holds a run of a different config; choose another run_dir")
        if is_finished(run_dir, cfg):
            return run_dir
        check_trains_something(cfg, cfg.algorithm_config())  # training only: eval and export of such a config work
        check_tracker_environment(cfg.train.trackers)  # installed, its server up: only training logs
        # the memory estimate against the device, before any weight loads (benchmark/run/memory.py): a run
        # that cannot fit is refused in one line; reuse_rollout_graph auto falls back to the recompute update where
        # only that fits (an execution key). On the CPU without a budget nothing is checked or changed
        self.config, note = fit_run(cfg, self.dist.world_size)
        if note and self.dist.is_main:
            print(note, flush=True)
        cfg = self.config
        self.build()
        created = _Created(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        # one writer per run directory: the main process (a failure there ends the launch, as torchrun stops the rest)
        lock = exclusive_lock(run_dir / ".lock", what=f"run {run_dir}")
        with lock if self.dist.is_main else contextlib.nullcontext():
            self._resumable = False
            try:
                return self._run_locked()
            except BaseException:
                # a fresh run that fails before its first checkpoint holds nothing to resume: leave the directory as
                # it was, so that the corrected rerun is not refused as another config
                if self.dist.is_main and not self._resumable:
                    created.remove()
                raise

    def _run_locked(self) -> Path:
        cfg, run_dir = self.config, self.run_dir
        if is_finished(run_dir, cfg):  # another process finished it while we waited to start
            self._resumable = True
            return run_dir
        state = self._saved_state()  # refused before config.yaml
        self._resumable = state is not None
        if self.dist.is_main and killed_before_checkpoint(run_dir):  # we hold the lock: nobody else writes here
            _remove_fresh_run_files(run_dir)
        if self.dist.is_main:
            atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(resolved_dict(cfg), sort_keys=False))
        guard = DivergenceGuard(self.algorithm.config)  # a non-finite step stops the run in one line
        start, rows, wall_s, nfe = self._resume_or_evaluate(state, guard)
        if self.on_evaluation is not None:
            self.on_evaluation(rows)
        trackers = None
        if cfg.train.trackers and self.dist.is_main:
            run_name = f"{cfg.task}/{cfg.algorithm_name}/s{cfg.seed}"
            trackers = Trackers(cfg.train.trackers, run_name, run_dir, resolved_dict(cfg), resumed_at=start)
            trackers.replay(rows)  # a resumed run's history, to the trackers that do not keep it
        wall_s, nfe = self._train(start, rows, wall_s, nfe, guard, trackers)
        if trackers:
            trackers.finish()
        self._write_done(rows, wall_s, nfe)
        return run_dir

    def _saved_state(self) -> dict[str, Any] | None:
        """The run's checkpoint (None: there is none), refused in one line when it was written on other prompts."""
        checkpoint = self.run_dir / "checkpoint.pt"
        state = self._load_checkpoint(checkpoint) if checkpoint.is_file() else None
        if state is not None and state.get("prompts", self._prompts_digest()) != self._prompts_digest():
            raise RunError(f"checkpoint {checkpoint} was written on other prompts than prompts.train / prompts.test "
                           f"(and the evaluation's) now hold: a prompt file or dataset was replaced since; restore it, "
                           f"or delete the checkpoint to restart the run from step 0")
        return state

    def _resume_or_evaluate(self, state: dict[str, Any] | None, guard: DivergenceGuard
                            ) -> tuple[int, list[dict], float, int]:
        """(step, metric rows, wall_s, nfe) the run starts from: the checkpoint's ``state`` loaded, or, for a fresh
        run, the step-0 evaluation (written to metrics.csv)."""
        if state is not None:
            self.algorithm.load_state_dict(state["algorithm"])
            if nonfinite_parameters(self.model.trainable_parameters()):
                raise RunError(f"checkpoint {self.run_dir / 'checkpoint.pt'} holds non-finite parameters; delete it to "
                               f"restart the run from step 0")
            guard.saved(state["step"])
            return state["step"], state["rows"], state["wall_s"], state["nfe"]
        t0 = time.perf_counter()
        with guard.during(0):
            evaluation = self.evaluate(0)
        rows = [{"step": 0, "nfe": 0, "wall_s": 0.0, **evaluation, "t_eval": time.perf_counter() - t0}]
        self._write_metrics(rows)
        return 0, rows, 0.0, 0

    def _train(self, start: int, rows: list[dict], wall_s: float, nfe: int, guard: DivergenceGuard,
               trackers: Trackers | None) -> tuple[float, int]:
        """Training steps ``start + 1`` to ``train.steps``, each appended to ``rows`` (with its evaluation when one is
        due), written, tracked and checkpointed as the config says; returns the run's wall_s and nfe."""
        cfg = self.config
        bar = tqdm(total=cfg.train.steps, initial=start, desc=f"{cfg.task}/{cfg.algorithm_name}/s{cfg.seed}",
                   disable=not self.progress or not self.dist.is_main, dynamic_ncols=True)
        try:  # the bar is closed on an error too, so the error's one line starts a line of its own
            for step in range(start + 1, cfg.train.steps + 1):
                t0 = time.perf_counter()
                with guard.during(step):
                    stats = self.algorithm.train_step(step)
                guard.check(step, stats, self.model.trainable_parameters())
                wall_s += time.perf_counter() - t0
                nfe += stats.nfe
                row = {"step": step, "nfe": nfe, "wall_s": wall_s, **stats.row()}
                last = step == cfg.train.steps
                if last or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                    t0 = time.perf_counter()
                    with guard.during(step):
                        row.update(self.evaluate(step))
                    row["t_eval"] = time.perf_counter() - t0
                rows.append(row)
                checkpoint = last or bool(cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0)
                self._write_metrics(rows, due=checkpoint or "eval_reward" in row)
                if self.on_evaluation is not None and "eval_reward" in row:
                    self.on_evaluation(rows)
                if trackers:
                    trackers.log(row, step)
                if checkpoint:
                    self._checkpoint(step, rows, wall_s, nfe)
                    self._resumable = True
                    guard.saved(step)
                bar.update(1)
                postfix = {"reward": f"{stats.reward_mean:.3f}"}
                evals = [r["eval_reward"] for r in rows if "eval_reward" in r]
                postfix["eval"] = f"{evals[-1]:.3f}"
                bar.set_postfix(postfix)
        finally:
            bar.close()
        return wall_s, nfe

    def _write_done(self, rows: list[dict], wall_s: float, nfe: int) -> None:
        """``done.json`` (the main process writes it), then a barrier: the run is finished for every process once it
        exists."""
        cfg = self.config
        summary = {
            "steps": cfg.train.steps,
            "eval_reward_initial": rows[0].get("eval_reward"),
            "eval_reward_final": rows[-1].get("eval_reward"),
            "nfe": nfe,
            "wall_s": wall_s,
            "config_digest": config_digest(cfg),  # binds done.json to the config (is_finished)
            "machine": machine_record(),  # float results differ across CPUs: a page names each run's machine
        }
        if self.dist.is_main:
            atomic_write_text(self.run_dir / "done.json", json.dumps(summary, indent=2) + "\n")
        self.dist.barrier()


def _remove_fresh_run_files(run_dir: Path) -> None:
    """The files of a fresh run killed before its first checkpoint (:data:`FRESH_RUN_FILES`), so that a new run in
    the directory starts clean (no sample grid or metrics row of the killed config survives)."""
    for name in FRESH_RUN_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


class _Created:
    """What a run invocation adds to the file system: ``run_dir`` and its missing parents, or (when ``run_dir``
    exists) the entries it adds there. :meth:`remove` takes them away again."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.before = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else None
        self.parents = [p for p in (run_dir, *run_dir.parents) if not p.exists()]  # deepest first

    def remove(self) -> None:
        if self.before is None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            for parent in self.parents[1:]:
                with contextlib.suppress(OSError):  # not empty: someone else wrote there meanwhile
                    parent.rmdir()
            return
        for path in self.run_dir.iterdir():
            if path.name not in self.before:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)


def load_trained_run(run_dir: Path, no_checkpoint_hint: str) -> tuple[ExperimentConfig, dict[str, Any], Path]:
    """(config, last checkpoint's state, checkpoint path) of a run directory, for commands that read a trained run
    (``flowzoo eval``, ``flowzoo export``). The checkpoint goes through the runner's sealed loader (a corrupt one, or
    one of another config, is refused); a missing directory, config.yaml or checkpoint is a one-line RunError (the
    last one ends with ``no_checkpoint_hint``). Nothing is written."""
    from flowzoo.benchmark.run.loading import load_config
    if not run_dir.is_dir():
        raise RunError(f"run directory {str(run_dir)!r} does not exist")
    if not (run_dir / "config.yaml").is_file():
        raise RunError(f"{str(run_dir)!r} is not a run directory (it has no config.yaml)")
    checkpoint = run_dir / "checkpoint.pt"
    if not checkpoint.is_file():
        raise RunError(f"run {str(run_dir)!r} has no checkpoint.pt yet (it is written every train.checkpoint_every "
                       f"steps and at the end); {no_checkpoint_hint}")
    # a run trained sharded (model.args.fsdp) is read by one process, from the checkpoint's full weights
    config = experiment.without_sharding(load_config(run_dir / "config.yaml"))
    loader = Runner(config, progress=False, dist=SingleProcess())
    loader.run_dir = run_dir  # the run as found here, even if it was moved since it was trained
    return config, loader._load_checkpoint(checkpoint), checkpoint


def train(config: ExperimentConfig, progress: bool = True, dist: SingleProcess | None = None) -> Path:
    """One run; ``dist``: the data-parallel context (default: joined from the launcher's environment)."""
    return Runner(config, progress=progress, dist=dist).run()


def run_quietly(config: ExperimentConfig) -> tuple[str, str | None]:
    """Train ``config`` without a progress bar, as a grid's worker or job does: (run directory, None) when it
    finished, or (run directory, the error: a user error's one line, else the traceback). Other runs go on."""
    try:
        train(config, progress=False)
        return str(config.resolved_run_dir()), None
    except FlowZooError as error:
        return str(config.resolved_run_dir()), str(error)
    except Exception as error:  # an OS error naming its path (a full disk) is one line too
        return str(config.resolved_run_dir()), os_error_line(error) or traceback.format_exc()
