"""Pretraining of the tiny tier by rectified flow: ``flowzoo pretrain tiny --data shapes|glyphs|shapes_edit``.

Objective (Liu et al. 2022, "Flow straight and fast"; SD3, Esser et al. 2024, eq. 1-3 and sec. 3.1):
``x_sigma = (1 - sigma) x0 + sigma noise``, regress the network output on ``v = noise - x0`` (MSE), with
``sigma = sigmoid(n), n ~ N(0, 1)`` (SD3's logit-normal sampling, m = 0, s = 1). Prompts are replaced by the empty
prompt with probability ``cond_dropout`` so that the same network gives the unconditional velocity for CFG.
The transformer and the text encoder train jointly from scratch; the shipped weights are an exponential moving
average of the parameters (decay ``ema``).

``shapes_edit`` trains the edit tier (``models/tiny_edit.py``) on the edit triples of ``models/tiny_edit_data.py``:
``x0`` is the target image, the source image (in [-1, 1]) is concatenated to ``x_sigma`` along the channels, the
instruction is the prompt, and ``cond_dropout`` drops the instruction only (the source stays: CFG's unconditional
branch). ``init`` starts it from a tiny text-to-image weights file instead of from scratch
(``models.tiny_edit.init_from_text_to_image``: the network starts as that model); the checkpoint records the file's
digest, so a resumed run refuses another file.

Batch ``k`` holds the data samples ``k*B .. (k+1)*B - 1`` of the stream ``data_seed`` and noise/sigma/dropout from a
generator seeded by ``(seed, k)``, so a resumed run continues exactly. The run directory holds ``checkpoint.pt``
(written atomically every ``checkpoint_minutes``) and ``pretrain.json`` (command, seed, steps, wall time); the
EMA weights are exported to ``out`` (atomically) at every checkpoint and at the end.

``out`` defaults to ``<run_dir>/tiny_<data>.safetensors`` (a run uses them with ``model.args.weights=...``). The
shipped weights (``models/weights/``) are replaced only when ``out`` names one of them explicitly, and never by a run
that trained no step (its weights would be the random initialisation).
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from flowzoo.errors import ConfigError
from flowzoo.io import atomic_torch_save, atomic_write_text, file_digest
from flowzoo.streams import TINY_PRETRAIN_BATCH
from flowzoo.models.shipped import refuse_shipped
from flowzoo.models.tiny import TinyArch, build_networks, save_weights, shipped_weights, text_embeddings, transformer_velocity
from flowzoo.models.tiny_data import DATASETS, PRETRAIN_DATA_SEED, sample_batch
from flowzoo.models.tiny_edit import EDIT_DATA, edit_arch, init_from_text_to_image
from flowzoo.models.tiny_edit_data import edit_batch

#: what ``--data`` takes: the text-to-image data sets and the edit tier's
PRETRAIN_DATA = (*DATASETS, *EDIT_DATA)


def step_generator(seed: int, step: int) -> torch.Generator:
    state = np.random.SeedSequence([seed, step, TINY_PRETRAIN_BATCH]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state >> 1))


def training_batch(data: str, start: int, count: int) -> tuple[torch.Tensor, list[str], torch.Tensor | None]:
    """Images in [0, 1], prompts and (``shapes_edit``) source images in [0, 1] of the pretraining samples ``start ..
    start + count - 1`` (the stream ``PRETRAIN_DATA_SEED``); an edit's image is its target, its prompt the
    instruction."""
    if data in EDIT_DATA:
        sources, targets, instructions, _ = edit_batch(PRETRAIN_DATA_SEED, start, count)
        return targets, instructions, sources
    images, prompts, _ = sample_batch(data, PRETRAIN_DATA_SEED, start, count)
    return images, prompts, None


def flow_matching_loss(tokenizer, text_encoder, transformer, images, prompts, generator, cond_dropout: float,
                       sources: torch.Tensor | None = None):
    """Rectified-flow MSE on one batch of images in [0, 1] (module docstring); ``sources`` (in [0, 1]) are
    concatenated to the noisy images, never dropped."""
    x0 = images * 2 - 1
    batch = x0.shape[0]
    noise = torch.randn(x0.shape, generator=generator)
    sigma = torch.sigmoid(torch.randn(batch, generator=generator))
    drop = torch.rand(batch, generator=generator) < cond_dropout
    prompts = ["" if d else p for p, d in zip(prompts, drop.tolist())]
    s = sigma.view(-1, 1, 1, 1)
    x = (1 - s) * x0 + s * noise
    if sources is not None:
        x = torch.cat([x, sources * 2 - 1], dim=1)
    v = transformer_velocity(transformer, x, sigma * 1000, text_embeddings(tokenizer, text_encoder, prompts))
    return ((v - (noise - x0)) ** 2).mean()


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    for e, p in zip(ema.parameters(), model.parameters()):
        e.lerp_(p, 1 - decay)


#: the settings ``flowzoo pretrain`` takes as options (an error names them as the user spelled them)
CLI_OPTIONS = ("steps", "minutes", "batch", "lr", "ema", "seed", "threads")


def check_settings(**values) -> None:
    """Every pretrain option in its range, before anything is built or written (one line naming the option)."""
    rules = {  # option -> (accepts the value, the valid range in words)
        "steps": (lambda v: v >= 1, "an integer >= 1"), "batch": (lambda v: v >= 1, "an integer >= 1"),
        "warmup": (lambda v: v >= 0, "an integer >= 0"), "seed": (lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)"),
        "threads": (lambda v: v >= 1, "an integer >= 1"),
        "minutes": (lambda v: v >= 0, "a finite number >= 0"),
        "checkpoint_minutes": (lambda v: v >= 0, "a finite number >= 0"),
        "lr": (lambda v: v > 0, "a finite number > 0"),
        "ema": (lambda v: 0 <= v < 1, "a decay in [0, 1)"),  # 1 never moves the average off the random init
        "cond_dropout": (lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
    }
    for name, value in values.items():
        if value is None and name in ("minutes", "threads"):
            continue  # no time limit / torch's default threads
        accepts, valid = rules[name]
        integer = valid.startswith("an integer")
        typed = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not typed or not math.isfinite(value) or not accepts(value):
            option = f"--{name}" if name in CLI_OPTIONS else name
            raise ConfigError(f"pretrain: {option} must be {valid}, got {value!r}")


def check_outputs(run_dir: Path, out: Path) -> bool:
    """Refuse outputs that would land in the shipped weights directory (only ``out`` naming a shipped weights file
    exactly may replace it) or in a directory that holds something else than a pretrain run (a training run's);
    returns whether ``out`` is a shipped weights file."""
    for path, option in ((run_dir, "--run-dir"), (out, "--out")):
        if "\x00" in str(path):
            raise ConfigError(f"pretrain: {option} {str(path)!r}: a path cannot hold a NUL byte")
    shipped_files = {shipped_weights(name).resolve() for name in PRETRAIN_DATA}
    shipped = out.resolve() in shipped_files
    refuse_shipped(run_dir, "pretrain: --run-dir")
    if not shipped:
        refuse_shipped(out, "pretrain: --out", "choose another path (a shipped weights file is replaced only when "
                                               "--out names it exactly: tiny_shapes/tiny_glyphs/tiny_shapes_edit"
                                               ".safetensors)")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"pretrain: --run-dir {str(run_dir)!r} is a file, not a directory")
    if (run_dir / "config.yaml").is_file() or (run_dir / "done.json").is_file():
        raise ConfigError(f"pretrain: --run-dir {str(run_dir)!r} holds a training run (config.yaml); choose another "
                          f"directory for the pretrain checkpoint")
    if out.is_dir():
        raise ConfigError(f"pretrain: --out {str(out)!r} is a directory; give a .safetensors file path")
    return shipped


def read_checkpoint(path: Path) -> dict:
    """A pretrain checkpoint, or a one-line error: a corrupt file, or one that is not a pretrain checkpoint (a
    training run's ``checkpoint.pt``)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)  # load_state_dict puts it on the device
    except Exception as e:  # a truncated zip, pickle garbage, ...
        raise ConfigError(f"pretrain: checkpoint {path} is corrupt or truncated ({type(e).__name__}); delete it to "
                          f"restart the pretraining from step 0") from None
    keys = {"settings", "nets", "ema", "optimizer", "schedule", "step", "wall_s", "losses"}
    if not isinstance(state, dict) or not keys <= set(state):
        raise ConfigError(f"pretrain: {path} is not a pretrain checkpoint (a training run's?); choose another "
                          f"--run-dir")
    return state


def pretrain_arch(data: str, arch: dict | None, init: Path | None) -> TinyArch:
    """The networks a pretraining of ``data`` builds: ``arch``'s sizes (an edit model's: those of its ``init`` file,
    ``models.tiny_edit.edit_arch``); ``init`` for anything but an edit model is a one-line ConfigError."""
    if data not in PRETRAIN_DATA:
        raise ConfigError(f"pretrain: unknown --data {data!r}; known: {', '.join(PRETRAIN_DATA)}")
    if data in EDIT_DATA:
        return edit_arch(data, arch, init)
    if init is not None:
        raise ConfigError(f"pretrain: --init starts an edit model from text-to-image weights; it needs --data "
                          f"{' or '.join(EDIT_DATA)}, not {data!r}")
    return TinyArch.from_dict({**(arch or {}), "data": data, "source_channels": 0})


class _Pretraining:
    """One pretraining run's state: the networks (trained jointly), their EMA copy, the optimizer and its warmup
    schedule, the steps done, the training wall time and the loss curve; resumed from and saved to
    ``<run_dir>/checkpoint.pt``, with the EMA weights exported to ``out`` and ``pretrain.json`` beside it."""

    def __init__(self, arch: TinyArch, settings: dict, run_dir: Path, out: Path, shipped: bool,
                 command: str | None, init: Path | None = None):
        self.arch, self.settings, self.run_dir, self.out, self.shipped = arch, settings, run_dir, out, shipped
        self.command = command
        self.tokenizer, text_encoder, transformer = build_networks(arch, settings["seed"])
        if init is not None:  # an edit model starting from text-to-image weights (module docstring)
            init_from_text_to_image(transformer, text_encoder, arch, init)
        self.nets = torch.nn.ModuleDict({"transformer": transformer, "text_encoder": text_encoder}).train()
        self.ema_nets = copy.deepcopy(self.nets).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.nets.parameters(), lr=settings["lr"], betas=(0.9, 0.99),
                                           weight_decay=0.0)
        warmup = settings["warmup"]
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: min(1.0, (k + 1) / max(warmup, 1)))
        self.checkpoint = run_dir / "checkpoint.pt"
        self.step, self.wall_s, self.losses = 0, 0.0, []

    def resume(self) -> None:
        """Continue from the run directory's checkpoint, if there is one (refused when written with other settings)."""
        if not self.checkpoint.is_file():
            return
        state = read_checkpoint(self.checkpoint)
        if state["settings"] != self.settings:
            raise ConfigError(f"pretrain: {self.checkpoint} was written with other settings {state['settings']}")
        self.nets.load_state_dict(state["nets"])
        self.ema_nets.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.step, self.wall_s, self.losses = state["step"], state["wall_s"], state["losses"]

    def train_step(self) -> torch.Tensor:
        """One optimizer step on batch ``step`` (module docstring), the EMA moved after it; returns the loss."""
        cfg, nets = self.settings, self.nets
        images, prompts, sources = training_batch(cfg["data"], self.step * cfg["batch"], cfg["batch"])
        loss = flow_matching_loss(self.tokenizer, nets["text_encoder"], nets["transformer"], images, prompts,
                                  step_generator(cfg["seed"], self.step), cfg["cond_dropout"], sources)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(nets.parameters(), 1.0)
        self.optimizer.step()
        self.schedule.step()
        ema_update(self.ema_nets, nets, cfg["ema"])
        self.step += 1
        return loss

    def save(self) -> None:
        """The checkpoint, the EMA weights at ``out`` (never untrained ones over the shipped weights) and
        ``pretrain.json``, each written atomically."""
        step, losses = self.step, self.losses
        atomic_torch_save({"settings": self.settings, "nets": self.nets.state_dict(),
                           "ema": self.ema_nets.state_dict(), "optimizer": self.optimizer.state_dict(),
                           "schedule": self.schedule.state_dict(), "step": step, "wall_s": self.wall_s,
                           "losses": losses}, self.checkpoint)
        record = {"command": self.command or " ".join(sys.argv), "settings": self.settings, "steps_done": step,
                  "wall_s": round(self.wall_s, 1), "final_loss_ema": losses[-1] if losses else None,
                  "threads": torch.get_num_threads()}
        if step > 0 or not self.shipped:  # untrained weights never replace the shipped ones
            save_weights(self.out, self.arch, self.ema_nets["transformer"], self.ema_nets["text_encoder"],
                         {"pretrain": record})
        atomic_write_text(self.run_dir / "pretrain.json", json.dumps(record, indent=2) + "\n")


def pretrain(
    data: str = "shapes",
    *,
    out: str | Path | None = None,
    run_dir: str | Path | None = None,
    steps: int = 100_000,
    minutes: float | None = None,
    batch: int = 32,
    lr: float = 5e-4,
    warmup: int = 200,
    ema: float = 0.998,
    cond_dropout: float = 0.1,
    seed: int = 0,
    threads: int | None = 2,
    checkpoint_minutes: float = 2.0,
    arch: dict | None = None,
    init: str | Path | None = None,
    progress: bool = True,
    command: str | None = None,
) -> Path:
    """Train (or resume) until ``steps`` optimizer steps or ``minutes`` of training wall time; returns ``out``.
    ``init``: the text-to-image weights an edit model (``data`` shapes_edit) starts from (module docstring)."""
    from tqdm.auto import tqdm

    check_settings(steps=steps, minutes=minutes, batch=batch, lr=lr, warmup=warmup, ema=ema,
                   cond_dropout=cond_dropout, seed=seed, threads=threads, checkpoint_minutes=checkpoint_minutes)
    init = None if init is None else Path(init)
    arch_cfg = pretrain_arch(data, arch, init)
    run_dir = Path(run_dir) if run_dir else Path("runs") / f"pretrain_tiny_{data}"
    out = Path(out) if out else run_dir / f"tiny_{data}.safetensors"
    shipped = check_outputs(run_dir, out)
    if shipped and minutes == 0:
        raise ConfigError(f"pretrain: --minutes 0 trains nothing; it would replace the shipped weights {out} with "
                          f"untrained ones")
    if threads:
        torch.set_num_threads(int(threads))
    settings = dict(data=data, batch=batch, lr=lr, warmup=warmup, ema=ema, cond_dropout=cond_dropout,
                    seed=seed, data_seed=PRETRAIN_DATA_SEED, arch=arch_cfg.to_dict(),
                    **({} if init is None else {"init": file_digest(init)}))
    run = _Pretraining(arch_cfg, settings, run_dir, out, shipped, command, init)
    run.resume()

    budget_s = None if minutes is None else 60.0 * minutes
    bar = tqdm(total=steps, initial=run.step, desc=f"pretrain tiny/{data}", disable=not progress, dynamic_ncols=True)
    last_save, loss_avg = time.perf_counter(), (run.losses[-1] if run.losses else None)
    while run.step < steps and (budget_s is None or run.wall_s < budget_s):
        t0 = time.perf_counter()
        loss = run.train_step()
        run.wall_s += time.perf_counter() - t0
        loss_value = float(loss.detach())
        loss_avg = loss_value if loss_avg is None else 0.98 * loss_avg + 0.02 * loss_value
        if run.step % 50 == 0:
            run.losses.append(round(loss_avg, 5))
        bar.update(1)
        bar.set_postfix(loss=f"{loss_avg:.4f}", min=f"{run.wall_s / 60:.1f}")
        if time.perf_counter() - last_save > 60 * checkpoint_minutes:
            run.save()
            last_save = time.perf_counter()
    bar.close()
    run.save()
    return out
