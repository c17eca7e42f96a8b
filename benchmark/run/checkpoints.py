"""A run's checkpoint is bound to its config and to its own contents.

``seal(state, config)`` adds ``state["seal"] = {"config": ..., "payload": ...}``: a SHA-256 of the run's identity
(the resolved config without ``run_dir`` and without secrets, as ``config.yaml`` compares) and a SHA-256 over every
tensor's bytes and every plain value of the state. ``check_seal`` refuses, in one line, a checkpoint written by
another config (e.g. its ``config.yaml`` was deleted and the run resumed with another seed or lr) or one whose
contents changed after writing (flipped bits). A checkpoint without a seal (written before seals existed) is
accepted as it is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from flowzoo.errors import RunError
from flowzoo.secrets import without_secrets


#: algorithm keys that choose how an iteration is computed, not what it computes (gradients equal to float rounding,
#: tests/test_perf_gradient.py; ``rollout_batch``, samples per rollout, decode and reward call: the same samples,
#: rewards and update to float rounding, tests/test_sample_batches.py): a run made with other values, or before they
#: existed, is the same run
EXECUTION_KEYS = ("cfg_batch", "reuse_rollout_graph", "rollout_batch")
#: model args that choose how the network is evaluated, not what it computes (the tiny tier's ``no_grad_path``: the
#: same samples to float rounding, tests/test_tiny_fast_path.py; ``fsdp``: FSDP2 sharding, tests/test_fsdp.py): a run
#: made with another value is the same run
MODEL_EXECUTION_ARGS = ("no_grad_path", "fsdp")  # fsdp: sharding over the processes (same results to float rounding)
#: ``train.eval_batch`` chooses how an evaluation is chunked (memory), not what it samples (each sample's own noise;
#: scores equal to float rounding): every value stands in a run's identity as 64, the value every run recorded before
#: the default became the model's choice (null), so their digests and checkpoint seals stand
EVAL_BATCH_IDENTITY = 64
#: algorithm keys that belong to a run's identity only when their switch (the first) is on: a run with the switch
#: off is the run it was before the keys existed (the weight EMA, algorithm.ema)
SWITCHED_KEYS = (("ema", "ema_decay", "ema_every"),)
#: algorithm keys added after runs were made, at the value every run had before: a run's identity leaves them out at
#: that value, so a config.yaml written before the key existed is the same run
ADDED_KEYS = {"minibatch_order": "shuffled"}


def run_identity(resolved: dict, declared_secrets: set[tuple]) -> dict:
    """What makes two runs the same run: the resolved config without its directory, its ``recipe`` note (where a
    tuned recipe's values came from; the values themselves are in its sections), its secrets and its torch thread
    count (``train.threads``: how the run is executed, e.g. 1 per worker of a multi-worker bench, not what it
    computes), so a grid run with ``--workers 2`` is recognised as finished by a rerun with any ``--workers``, and
    with ``train.eval_batch`` as ``EVAL_BATCH_IDENTITY`` whatever its value;
    without an unset ``train.prompt_sampler``, ``train.gold`` or ``train.spread_features``, ``prompts.tags``,
    ``prompts.dataset``,
    ``prompts.validation``, ``prompts.unseen`` or ``prompts.unseen_every``, or
    ``prompts.eval_split`` at ``test``; without the evaluation protocol's keys where the pipeline's and the
    algorithm's evaluation samplers are one (:func:`_one_evaluation_sampler`); without the algorithm's
    ``EXECUTION_KEYS``, its ``ADDED_KEYS`` at their former value and the model's ``MODEL_EXECUTION_ARGS``; and without ``SWITCHED_KEYS`` whose switch is off."""
    resolved = dict(resolved)
    resolved.pop("run_dir", None)
    resolved.pop("recipe", None)  # where the values came from (a tuned file), not what they are: a note
    resolved.pop("use_recipe", None)  # how the keys were resolved; the keys themselves are the identity
    if isinstance(resolved.get("train"), dict):  # and an unset prompt sampler: the run it was before samplers existed
        resolved["train"] = {k: (EVAL_BATCH_IDENTITY if k == "eval_batch" else v)
                             for k, v in resolved["train"].items()
                             if k != "threads" and not (k in ("prompt_sampler", "gold", "spread_features") and v is None)}
    if isinstance(resolved.get("prompts"), dict):  # unset prompt tags: the run it was before tags existed
        resolved["prompts"] = {k: v for k, v in resolved["prompts"].items()
                               if not (k in ("tags", "dataset", "validation", "unseen", "unseen_every") and v is None)
                               and not (k == "eval_split" and v == "test")}
    model = resolved.get("model")
    if isinstance(model, dict) and isinstance(model.get("args"), dict):  # how the network runs, not what it computes
        resolved["model"] = {**model, "args": {k: v for k, v in model["args"].items() if k not in MODEL_EXECUTION_ARGS}}
    if isinstance(resolved.get("train"), dict) and _one_evaluation_sampler(resolved):
        resolved["train"] = {k: v for k, v in resolved["train"].items() if k not in EVAL_PROTOCOL_KEYS}
    if isinstance(resolved.get("algorithm"), dict):  # how the update is computed, not what (same gradients)
        algorithm = {k: v for k, v in resolved["algorithm"].items()
                     if k not in EXECUTION_KEYS and not (k in ADDED_KEYS and v == ADDED_KEYS[k])}
        for group in SWITCHED_KEYS:
            if not algorithm.get(group[0]):
                algorithm = {k: v for k, v in algorithm.items() if k not in group}
        resolved["algorithm"] = algorithm
    return without_secrets(resolved, declared_secrets)


#: the evaluation protocol's keys (benchmark/measures/evaluation.py), no part of a run's identity where the
#: protocols draw the same samples: the run it was before they existed
EVAL_PROTOCOL_KEYS = ("eval_sampler", "eval_guidance", "eval_shift", "eval_own")


def _one_evaluation_sampler(resolved: dict) -> bool:
    """The pipeline's and the algorithm's evaluation samplers are one: the algorithm keeps the model's shift and CFG
    scale (both unset), the protocol names no other, and no extra evaluation is asked for."""
    train, algorithm = resolved["train"], resolved.get("algorithm") or {}
    return (algorithm.get("guidance") is None and algorithm.get("shift") is None and train.get("eval_guidance") is None
            and train.get("eval_shift") is None and not train.get("eval_own"))


def config_digest(config) -> str:
    from flowzoo.benchmark.config.schema import declared_secrets, resolved_dict

    identity = run_identity(resolved_dict(config), declared_secrets(config))
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def _feed(digest: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        digest.update(b"{")
        for key in sorted(obj, key=repr):
            digest.update(repr(key).encode())
            _feed(digest, obj[key])
        digest.update(b"}")
    elif isinstance(obj, (list, tuple)):
        digest.update(b"[")
        for item in obj:
            _feed(digest, item)
        digest.update(b"]")
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        digest.update(repr(obj).encode())
    else:  # an object without a stable byte form: its type only
        digest.update(type(obj).__qualname__.encode())


def payload_digest(state: dict) -> str:
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in state.items() if k != "seal"})
    return digest.hexdigest()


def prompts_digest(*prompt_sets) -> str:
    """A SHA-256 of the prompts a run trains and evaluates on (each ``(prompt, metadata)`` in order): a checkpoint
    stores it, so a resume on a prompt file or dataset replaced since (the same path in the config, other data) is
    refused."""
    text = json.dumps([[[p, m] for p, m in prompts] for prompts in prompt_sets], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(state: dict, config) -> dict:
    state["seal"] = {"config": config_digest(config), "payload": payload_digest(state)}
    return state


def check_seal(state: dict, config, path: Path) -> None:
    """Raise :class:`RunError` if the checkpoint at ``path`` belongs to another config or its contents changed."""
    stamp = state.get("seal")
    if stamp is None:
        return
    if stamp.get("config") != config_digest(config):
        raise RunError(f"checkpoint {path} was written by a run of another config; choose another run_dir (or delete "
                       f"the checkpoint to start this config from step 0)")
    if stamp.get("payload") != payload_digest(state):
        raise RunError(f"checkpoint {path} is corrupt: its contents do not match the checksum written with them; "
                       f"delete it to restart the run from step 0")
