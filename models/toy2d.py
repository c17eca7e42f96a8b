"""The toy tier: a class-conditioned flow on R^2 that pretrains in seconds on the CPU.

Data: 8 Gaussian modes (std 0.25) on a circle of radius 2. Class c owns modes 2c (weight 0.8) and 2c + 1 (weight
0.2). Rewards (``rewards/toy.py``) ask for the minority mode (``toy_mode``, dense; the base model scores ~0.2) or for
a small disc just outside it (``toy_target``, sparse; the base model succeeds in a few percent of samples), so RL has
to move probability mass the pretrained model rarely puts there.

The velocity field is an MLP on (x, sigma features, class embedding); class dropout during pretraining gives an
unconditional model for CFG. "Fine-tuning" is full fine-tuning of the MLP; the reference policy is a frozen copy of
the pretrained weights. Pretraining is deterministic given its seed and memoised per process.

Many-condition variant (model arg ``classes: K`` with 8 <= K <= 1024, prompt source ``toy2d`` with ``prompts.classes: K``):
class c has one Gaussian mode (std 0.25) at angle 2 pi c / K on the circle of radius 2, and its own small target disc
(radius 0.2) 0.6 away from that mode in a direction of its own (angle 2 pi frac(c phi), phi the golden-ratio
conjugate, so neighbouring classes point in unrelated directions and each class has to be learned from its own
successes). An exact mode would hit the disc with probability 2.3% per sample; ``toy_target`` is the binary success
and ``toy_mode`` the dense Gaussian score around the same disc centre. The default ``classes: 4`` is the 8-mode tier
above, unchanged.

Model arg ``dtype`` (``float32``, the default, or ``float64``) is the network's dtype: pretraining always runs in
float32 (memoised), and a float64 model holds those weights upcast; ``tests/test_device_placement.py`` trains every
algorithm with it to check that nothing computes in float32 where the contract does not say so.

Layouts of the many-condition variant (model arg and prompt option ``layout``, the same in both):

* ``overlapping`` (default; the first OP-GRPO study's task): radius 2, mode std 0.25. With 64 classes the modes sit
  0.196 apart, closer than one std, so neighbouring conditions overlap and a policy update for one class moves its
  neighbours (Flow-GRPO's success plateaus near 10%).
  The target disc sits 2.4 mode stds from the mode with radius 0.8 stds (0.6 and 0.2).
* ``separable`` (the replicated study's task): radius 4, mode std 0.075. With 64 classes the modes sit 0.39 apart
  (5.2 stds), so the pretrained model puts nearly all of a class's samples nearest its own mode and each condition is
  learned on its own. The target disc sits 3.2 stds (0.24) from the mode with radius 1.5 stds (0.1125): the base
  model (ODE, 20 steps) succeeds in ~3% of samples, and a policy that moves its mode onto the disc succeeds in most,
  so the sparse reward can climb well above its base (Flow-GRPO: 3.3% -> ~0.57 in 300 steps at lr 1e-4, seed 0;
  docs/op_grpo.md). At lr 1e-3, the first layout's rate, one update of these sharp modes destroys the policy
  (approx. KL 0.13 at step 1, success -> 0).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn

from flowzoo.errors import ConfigError
from flowzoo.io import atomic_torch_save
from flowzoo.ranges import AT_LEAST_1, NON_NEGATIVE
from flowzoo.models import register
from flowzoo.models.base import Condition, FlowModel
from flowzoo.models.footprint import Arch, Footprint

NUM_CLASSES = 4
RADIUS = 2.0
MODE_STD = 0.25
MAJORITY_WEIGHT = 0.8
HARD_TARGET_RADIUS = 2.4  # the sparse target sits 0.4 (1.6 std) outside the minority mode
HARD_TARGET_SIZE = 0.3
MIN_MANY_CLASSES = 8  # ``classes`` other than NUM_CLASSES selects the many-condition layout, from this many classes
# the most classes (ours): the studies use 64; at 1024 neighbouring modes of the separable layout sit 0.025 apart, a
# third of a mode std, so more classes only cost memory (a class embedding and a prompt each; 2**31 never ended)
MAX_MANY_CLASSES = 1024
DTYPES = {"float32": torch.float32, "float64": torch.float64}  # the network's dtype (model arg ``dtype``)
GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class Layout:
    """Where the many-condition variant's class modes lie (on a circle of ``radius``, each with std ``mode_std``) and
    where each class's target disc is: ``offset_stds`` mode stds from its mode, ``size_stds`` mode stds in radius."""

    radius: float
    mode_std: float
    offset_stds: float = 2.4
    size_stds: float = 0.8

    @property
    def target_offset(self) -> float:
        return self.offset_stds * self.mode_std

    @property
    def target_size(self) -> float:
        return self.size_stds * self.mode_std


LAYOUTS = {"overlapping": Layout(RADIUS, MODE_STD), "separable": Layout(4.0, 0.075, 3.2, 1.5)}
DEFAULT_LAYOUT = "overlapping"
MANY_TARGET_OFFSET = LAYOUTS[DEFAULT_LAYOUT].target_offset  # 0.6
MANY_TARGET_SIZE = LAYOUTS[DEFAULT_LAYOUT].target_size  # 0.2


def check_layout(layout) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ConfigError(f"toy2d: layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
    return layout


def check_classes(classes) -> int:
    valid = isinstance(classes, int) and not isinstance(classes, bool)
    if not valid or (classes != NUM_CLASSES and not MIN_MANY_CLASSES <= classes <= MAX_MANY_CLASSES):
        raise ConfigError(f"toy2d: classes must be {NUM_CLASSES} (the 8-mode tier) or an int in [{MIN_MANY_CLASSES}, "
                          f"{MAX_MANY_CLASSES}] (the many-condition layout), got {classes!r}")
    return classes


def check_classes_argument(value, where: str) -> None:
    """``argument_ranges`` check of ``model.args.classes``: :func:`check_classes`' message under ``where``."""
    try:
        check_classes(value)
    except ConfigError as error:
        raise ConfigError(f"{where}: {str(error).removeprefix('toy2d: ')}") from None


def many_center(c: int, classes: int, layout: str = DEFAULT_LAYOUT) -> tuple[float, float]:
    angle, radius = 2 * math.pi * c / classes, LAYOUTS[layout].radius
    return (radius * math.cos(angle), radius * math.sin(angle))


def many_target(c: int, classes: int, layout: str = DEFAULT_LAYOUT) -> list[float]:
    cx, cy = many_center(c, classes, layout)
    angle, offset = 2 * math.pi * ((c * GOLDEN) % 1.0), LAYOUTS[layout].target_offset
    return [cx + offset * math.cos(angle), cy + offset * math.sin(angle)]


def mode_center(mode: int) -> tuple[float, float]:
    angle = 2 * math.pi * mode / (2 * NUM_CLASSES)
    return (RADIUS * math.cos(angle), RADIUS * math.sin(angle))


def class_metadata(c: int, classes: int = NUM_CLASSES, layout: str = DEFAULT_LAYOUT) -> dict:
    """The prompt metadata of class c: where its rewards' targets are."""
    if classes != NUM_CLASSES:
        target = many_target(c, check_classes(classes), check_layout(layout))
        meta = {"class": c, "classes": classes, "mode_target": target, "hard_target": target,
                "hard_radius": LAYOUTS[layout].target_size}
        return meta if layout == DEFAULT_LAYOUT else {**meta, "layout": layout}
    angle = 2 * math.pi * (2 * c + 1) / (2 * NUM_CLASSES)
    return {
        "class": c,
        "mode_target": list(mode_center(2 * c + 1)),
        "hard_target": [HARD_TARGET_RADIUS * math.cos(angle), HARD_TARGET_RADIUS * math.sin(angle)],
        "hard_radius": HARD_TARGET_SIZE,
    }


def mode_std_of(metadata: dict) -> float:
    """The std of the Gaussian mode of the class whose prompt metadata this is: its layout's (many-condition
    variant), or the 8-mode tier's ``MODE_STD``."""
    if metadata.get("classes", NUM_CLASSES) == NUM_CLASSES:
        return MODE_STD
    return LAYOUTS[metadata.get("layout", DEFAULT_LAYOUT)].mode_std


def prompt_set(classes: int = NUM_CLASSES, layout: str = DEFAULT_LAYOUT) -> list[tuple[str, dict]]:
    """The toy tier's prompts ("class 0" .. "class K-1") with their metadata. Training and evaluation share them;
    evaluation uses fixed noise seeds instead of held-out prompts."""
    check_many_layout(classes, layout)
    return [(f"class {c}", class_metadata(c, classes, layout)) for c in range(check_classes(classes))]


def check_many_layout(classes: int, layout: str) -> None:
    """A layout other than the default needs the many-condition variant (the 8-mode tier has one layout)."""
    check_layout(layout)
    if layout != DEFAULT_LAYOUT and classes == NUM_CLASSES:
        raise ConfigError(f"toy2d: layout {layout!r} needs the many-condition variant (classes >= {MIN_MANY_CLASSES}),"
                          f" got classes: {classes}")


def sample_data(n: int, generator: torch.Generator, num_classes: int = NUM_CLASSES, layout: str = DEFAULT_LAYOUT
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """n points of the data distribution and their classes."""
    if num_classes != NUM_CLASSES:
        classes = torch.randint(0, num_classes, (n,), generator=generator)
        centers = torch.tensor([many_center(c, num_classes, layout) for c in range(num_classes)])[classes]
        return centers + LAYOUTS[layout].mode_std * torch.randn(n, 2, generator=generator), classes
    classes = torch.randint(0, NUM_CLASSES, (n,), generator=generator)
    minority = torch.rand(n, generator=generator) > MAJORITY_WEIGHT
    modes = 2 * classes + minority.long()
    centers = torch.tensor([mode_center(m) for m in range(2 * NUM_CLASSES)])[modes]
    return centers + MODE_STD * torch.randn(n, 2, generator=generator), classes


class VelocityMLP(nn.Module):
    def __init__(self, hidden: int = 128, layers: int = 3, num_classes: int = NUM_CLASSES, frequencies: int = 8):
        super().__init__()
        self.frequencies = frequencies
        self.embed = nn.Embedding(num_classes + 1, 32)  # the last id is the null class (CFG)
        dims = [2 + 2 * frequencies + 1 + 32] + [hidden] * layers
        blocks: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            blocks += [nn.Linear(a, b), nn.SiLU()]
        self.body = nn.Sequential(*blocks, nn.Linear(hidden, 2))

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        k = torch.arange(1, self.frequencies + 1, dtype=x.dtype, device=x.device)
        phase = math.pi * sigma[:, None] * k
        features = torch.cat([x, sigma[:, None], phase.sin(), phase.cos(), self.embed(classes)], dim=1)
        return self.body(features)


_PRETRAINED: dict[tuple, dict[str, torch.Tensor]] = {}
#: where pretrained toy bases are kept between processes (a run, a bench worker, a test session): the environment's
#: FLOWZOO_CACHE_DIR, else $XDG_CACHE_HOME/flowzoo, else ~/.cache/flowzoo; FLOWZOO_CACHE_DIR=off disables it
CACHE_ENV = "FLOWZOO_CACHE_DIR"


def cache_dir() -> Path | None:
    """The directory of the on-disk pretraining cache, or None when it is switched off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "none") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flowzoo"


def cache_path(key: tuple) -> Path | None:
    """The cache file of the pretraining ``key``: named by a digest of the key, the torch version (another torch may
    round differently) and this file's text (the data, network and pretraining it defines), so a file can only hold
    the weights its name promises."""
    root = cache_dir()
    if root is None:
        return None
    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    text = json.dumps({"key": list(key), "torch": torch.__version__, "source": source})
    return root / f"toy2d-{hashlib.sha256(text.encode()).hexdigest()[:20]}.pt"


def _load_cached(path: Path | None, key: tuple) -> dict[str, torch.Tensor] | None:
    """The cached weights of ``key``, or None: no file, or one that is unreadable or not of this key (a damaged
    file is ignored and rewritten, never trusted)."""
    if path is None or not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # truncated, garbage: rebuilt below
        return None
    if not isinstance(saved, dict) or saved.get("key") != list(key) or not isinstance(saved.get("state"), dict):
        return None
    return saved["state"]


def _store_cached(path: Path | None, key: tuple, state: dict[str, torch.Tensor]) -> None:
    """Best effort: a cache that cannot be written (read-only home, full disk) costs the next process a rebuild,
    nothing else."""
    if path is None:
        return
    try:
        atomic_torch_save({"key": list(key), "state": state}, path)
    except OSError:
        pass


def pretrain(
    hidden: int = 128, layers: int = 3, steps: int = 1500, batch: int = 256, lr: float = 3e-3, seed: int = 0,
    cond_dropout: float = 0.1, classes: int = NUM_CLASSES, layout: str = DEFAULT_LAYOUT,
) -> VelocityMLP:
    """Rectified-flow pretraining: sigma ~ U(0, 1), x_s = (1 - s) x0 + s eps, regress v = eps - x0.

    Deterministic given its arguments (one thread, seeded), so the result is memoised per process and cached on
    disk (:func:`cache_dir`): a run loads the base model its config names instead of spending ~8 s rebuilding it.
    The cached tensors are the ones a rebuild computes (tests/test_toy_cache.py)."""
    key = (hidden, layers, steps, batch, lr, seed, cond_dropout, classes, layout)
    net = VelocityMLP(hidden, layers, classes)
    if key not in _PRETRAINED:
        path = cache_path(key)
        state = _load_cached(path, key)
        if state is None:
            state = _pretrain_state(key)
            _store_cached(path, key, state)
        _PRETRAINED[key] = state
    net.load_state_dict(_PRETRAINED[key])
    return net


def _pretrain_state(key: tuple) -> dict[str, torch.Tensor]:
    """The pretraining itself (see :func:`pretrain`): the trained network's state dict."""
    hidden, layers, steps, batch, lr, seed, cond_dropout, classes, layout = key
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: extra threads only add synchronisation (and stall on a busy CPU)
    # the global generator seeds the initial weights; forked so that a rebuild and a cache hit leave it alike
    try:
        with torch.random.fork_rng(devices=[]):
            gen = torch.Generator().manual_seed(seed)
            torch.manual_seed(seed)
            net = VelocityMLP(hidden, layers, classes)
            opt = torch.optim.Adam(net.parameters(), lr=lr)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
            for _ in range(steps):
                x0, labels = sample_data(batch, gen, classes, layout)
                eps = torch.randn(batch, 2, generator=gen)
                sigma = torch.rand(batch, generator=gen)
                drop = torch.rand(batch, generator=gen) < cond_dropout
                labels = torch.where(drop, torch.full_like(labels, classes), labels)
                x = (1 - sigma[:, None]) * x0 + sigma[:, None] * eps
                loss = ((net(x, sigma, labels) - (eps - x0)) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


@register("toy2d")
class Toy2DModel(FlowModel):
    sample_kind = "points"
    default_guidance = 1.0
    default_shift = 1.0
    default_num_steps = 10
    default_eval_num_steps = 20
    default_eval_batch = 8192  # 2-D points: a whole evaluation in one chunk (2.7x faster than 64 a chunk, measured)
    preferred_threads = 1  # the MLP is too small to gain from intra-op threads
    fused_update = True  # per-call overhead is the whole cost of a 2-D MLP's update (docs/perf.md, "The toy tier")
    argument_ranges = {"hidden": AT_LEAST_1, "layers": AT_LEAST_1, "pretrain_steps": NON_NEGATIVE,
                       "pretrain_seed": NON_NEGATIVE, "classes": check_classes_argument}

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        """The velocity MLP (:class:`VelocityMLP`: inputs 2 + 16 Fourier + 1 + a 32-wide class embedding) on 2-D
        points."""
        hidden, layers = int(args.get("hidden", 128)), int(args.get("layers", 3))
        params = (51 * hidden + hidden) + (layers - 1) * (hidden * hidden + hidden) + 2 * hidden + 2 + 64 * 32
        return Footprint(Arch("toy2d", transformer_params=params, hidden=hidden, blocks=layers, text_width=0,
                              text_encoder_params=0, vae_params=0, vae_channels=0, activation=3.0,
                              source="models/toy2d.py VelocityMLP"), 1, 0, 2, 0)

    def __init__(self, hidden: int = 128, layers: int = 3, pretrain_steps: int = 1500, pretrain_seed: int = 0,
                 classes: int = NUM_CLASSES, layout: str = DEFAULT_LAYOUT, dtype: str = "float32"):
        super().__init__()
        if pretrain_steps < 0:
            raise ConfigError(f"model.pretrain_steps must be >= 0, got {pretrain_steps}")
        if dtype not in DTYPES:
            raise ConfigError(f"toy2d: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        # the network's dtype (float64: the dtype test of tests/test_device_placement.py); pretraining is float32
        self.classes = check_classes(classes)
        check_many_layout(classes, layout)
        self.layout = layout
        self.dtype = DTYPES[dtype]
        self.net = pretrain(hidden, layers, pretrain_steps, seed=pretrain_seed, classes=classes, layout=layout)
        self.net.to(device=self.device, dtype=self.dtype)
        self.ref_net = copy.deepcopy(self.net).requires_grad_(False)
        self._active = self.net

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return (2,)

    def encode(self, prompts: Sequence[str], metadata: Sequence[dict] | None = None) -> Condition:
        classes = []
        for prompt in prompts:
            name, _, idx = prompt.partition(" ")
            if name != "class" or not idx.isdigit() or int(idx) >= self.classes:
                valid = f"'class 0' .. 'class {self.classes - 1}'"
                raise ConfigError(f"toy2d: unknown prompt {prompt!r}; valid: {valid}")
            classes.append(int(idx))
        for m in metadata or ():
            if m.get("classes", NUM_CLASSES) != self.classes:  # targets laid out for another class count
                raise ConfigError(f"toy2d: prompt metadata for {m.get('classes', NUM_CLASSES)} classes, but the model "
                                  f"has classes: {self.classes}; set prompts.classes to model.args.classes")
            if m.get("layout", DEFAULT_LAYOUT) != self.layout:
                raise ConfigError(f"toy2d: prompt metadata for layout {m.get('layout', DEFAULT_LAYOUT)!r}, but the "
                                  f"model has layout {self.layout!r}; set prompts.layout to model.args.layout")
        return Condition({"class": torch.tensor(classes, dtype=torch.long, device=self.device)})

    def null_condition(self, n: int) -> Condition:
        return Condition({"class": torch.full((n,), self.classes, dtype=torch.long, device=self.device)})

    def predict(self, x: torch.Tensor, sigma: torch.Tensor, cond: Condition) -> torch.Tensor:
        return self._active(x.to(self.dtype), sigma.to(device=x.device, dtype=self.dtype), cond.tensors["class"])

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """The points themselves, in float32 (what the toy rewards score)."""
        return x0.float()

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.net.parameters())

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        self._active = self.ref_net
        try:
            yield
        finally:
            self._active = self.net

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.net.load_state_dict(state)
