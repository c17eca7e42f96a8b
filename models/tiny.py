"""The tiny text-to-image tier: a pixel-space diffusers ``SD3Transformer2DModel`` (small config) conditioned by a
small ``CLIPTextModel`` over a word vocabulary, pretrained by ``flowzoo pretrain tiny`` on synthetic shapes or glyph
images (``models/tiny_data.py``; choices in docs/tiny.md).

* Latents are the images themselves in [-1, 1] ([3, 32, 32] for ``shapes``, [3, 16, 48] for ``glyphs``);
  ``decode`` maps them to [0, 1].
* The transformer is called as SD3's pipeline calls it (``timestep = 1000 * sigma``, output = velocity
  ``noise - x0``), with the CLIP last hidden states as ``encoder_hidden_states`` and its pooled output as
  ``pooled_projections``; CFG uses the empty prompt, which pretraining drops to with probability 0.1.
* RL trains a peft LoRA on SD3.5's projection names (``SD3_LORA_TARGETS``); the reference policy is the same
  transformer with the adapter disabled. LoRA, reference, the prompt-embedding cache and ``predict`` are
  ``DiffusersFlowModel``'s: only loading differs (a shipped safetensors file instead of a pipeline directory).
* ``no_grad_path`` (default ``merged``): calls made without autograd (rollout steps, evaluation, the detached CFG
  branch) run a peft-free copy of the transformer whose weights are base + LoRA, refreshed when the LoRA moved
  (``PlainTransformer``); ``peft`` is the previous path, ``compiled`` the copy under torch.compile (docs/tiny.md,
  Speed). Calls with autograd always run the peft transformer.

Weights: ``models/weights/tiny_<data>.safetensors`` (transformer + text encoder, the architecture in the file's
metadata; written by ``models/tiny_pretrain.py``). ``weights=None`` builds a randomly initialised model of ``arch``
(tests).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE
from flowzoo.streams import TINY_LORA_INIT_OFFSET, TINY_TEXT_INIT_OFFSET, TINY_TRANSFORMER_INIT_OFFSET
from flowzoo.models import register
from flowzoo.models.base import Condition, FlowModel
from flowzoo.models.diffusers_common import (SD3_LORA_TARGETS, DiffusersFlowModel, Finetune, NoGradPath,
                                     check_finetune, check_no_grad_path, resolve_device)
from flowzoo.models.footprint import Arch, Footprint
from flowzoo.models.tiny_data import DATASETS, image_shape
from flowzoo.models.tiny_text import WordTokenizer, build_text_encoder

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
#: the networks' dtype (model arg ``dtype``): float32, or float64 for tests/test_device_placement.py's dtype test
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def shipped_weights(data: str) -> Path:
    return WEIGHTS_DIR / f"tiny_{data}.safetensors"


@dataclass(frozen=True)
class TinyArch:
    """Sizes of the tiny networks (defaults: the shipped models). ``source_channels``: the source image's channels
    concatenated to the noisy image at the transformer's input (0: text-to-image; 3: the edit tier,
    ``models/tiny_edit.py``, whose tokenizer also knows the edit instructions' words)."""

    data: str = "shapes"
    patch_size: int = 4
    layers: int = 5
    heads: int = 3
    head_dim: int = 32
    text_width: int = 64
    text_layers: int = 2
    text_heads: int = 2
    source_channels: int = 0

    def __post_init__(self) -> None:
        if self.data not in DATASETS:
            raise ConfigError(f"tiny: unknown data {self.data!r}; known: {', '.join(DATASETS)}")
        for f in fields(self):  # every other field is a size: a torch error (or an empty network) otherwise
            value, least = getattr(self, f.name), 0 if f.name == "source_channels" else 1
            if f.name != "data" and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ConfigError(f"tiny: arch.{f.name} must be an integer >= {least}, got {value!r}")
        _, height, width = image_shape(self.data)
        if height % self.patch_size or width % self.patch_size:
            raise ConfigError(f"tiny: patch_size {self.patch_size} does not divide the {height}x{width} images")

    @classmethod
    def from_dict(cls, values: dict) -> "TinyArch":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"tiny: unknown arch keys {sorted(unknown)}; valid: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict:
        """The fields as a weights file and a pretrain checkpoint record them; a text-to-image arch leaves out its
        ``source_channels`` 0, so its files and checkpoints are the ones written before the field existed."""
        values = asdict(self)
        if not self.source_channels:
            del values["source_channels"]
        return values


def tokenizer_of(arch: TinyArch) -> WordTokenizer:
    """The tiny tier's word vocabulary; an edit arch's adds the instruction words after it (every earlier word keeps
    its id, so a text-to-image text encoder's embeddings carry over, ``models/tiny_edit.py``)."""
    if not arch.source_channels:
        return WordTokenizer()
    from flowzoo.models.tiny_edit_data import instruction_vocabulary

    return WordTokenizer(instruction_vocabulary())


def build_networks(arch: TinyArch, seed: int = 0):
    """(tokenizer, text encoder, transformer), randomly initialised from ``seed``."""
    from diffusers import SD3Transformer2DModel

    tokenizer = tokenizer_of(arch)
    text_encoder = build_text_encoder(tokenizer, arch.text_width, arch.text_layers, arch.text_heads,
                                      seed + TINY_TEXT_INIT_OFFSET)
    channels, height, width = image_shape(arch.data)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + TINY_TRANSFORMER_INIT_OFFSET)
        transformer = SD3Transformer2DModel(
            sample_size=max(height, width),
            patch_size=arch.patch_size,
            in_channels=channels + arch.source_channels,
            out_channels=channels,
            num_layers=arch.layers,
            attention_head_dim=arch.head_dim,
            num_attention_heads=arch.heads,
            joint_attention_dim=arch.text_width,
            caption_projection_dim=arch.heads * arch.head_dim,
            pooled_projection_dim=arch.text_width,
            pos_embed_max_size=max(height, width) // arch.patch_size,
        )
    return tokenizer, text_encoder, transformer


def text_embeddings(tokenizer: WordTokenizer, text_encoder, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
    """CLIP last hidden states [B, L, D] and pooled output [B, D] (gradients flow if enabled: pretraining)."""
    tokens = tokenizer(list(prompts))
    device = next(text_encoder.parameters()).device
    out = text_encoder(input_ids=tokens["input_ids"].to(device), attention_mask=tokens["attention_mask"].to(device))
    return {"prompt_embeds": out.last_hidden_state, "pooled_prompt_embeds": out.pooler_output}


def transformer_velocity(transformer, x: torch.Tensor, timestep: torch.Tensor, embeds: dict[str, torch.Tensor]):
    return transformer(
        hidden_states=x,
        timestep=timestep,
        encoder_hidden_states=embeds["prompt_embeds"],
        pooled_projections=embeds["pooled_prompt_embeds"],
        return_dict=False,
    )[0]


def save_weights(path: str | Path, arch: TinyArch, transformer, text_encoder, extra: dict | None = None) -> None:
    """Transformer + text encoder weights as one safetensors file, the architecture in its metadata (atomic)."""
    from safetensors.torch import save

    from flowzoo.io import atomic_write

    # a transformer with a peft adapter stores its base weights under ``.base_layer.``: save only the base model
    tensors = {f"transformer.{k.replace('.base_layer.', '.')}": v.detach().contiguous()
               for k, v in transformer.state_dict().items() if "lora_" not in k}
    tensors.update({f"text_encoder.{k}": v.detach().contiguous() for k, v in text_encoder.state_dict().items()})
    metadata = {"arch": json.dumps(arch.to_dict()), **{k: json.dumps(v) for k, v in (extra or {}).items()}}
    blob = save(tensors, metadata=metadata)
    atomic_write(path, lambda f: f.write(blob), mode="wb")


def read_weights(path: str | Path) -> tuple[TinyArch, dict[str, torch.Tensor], dict]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"tiny: weights file {str(path)!r} does not exist")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "arch" not in metadata:
        raise ConfigError(f"tiny: {str(path)!r} has no 'arch' metadata; was it written by flowzoo pretrain tiny?")
    info = {k: json.loads(v) for k, v in metadata.items() if k != "arch"}
    return TinyArch.from_dict(json.loads(metadata["arch"])), load_file(str(path)), info


def load_networks(transformer, text_encoder, tensors: dict[str, torch.Tensor]) -> None:
    for prefix, module in (("transformer.", transformer), ("text_encoder.", text_encoder)):
        state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ConfigError(f"tiny: weights do not fit the {prefix[:-1]}: missing {missing[:3]}, unexpected {unexpected[:3]}")


@register("tiny")
class TinyModel(DiffusersFlowModel):
    """The tiny tier (module docstring). ``weights``: "auto" = the shipped file of ``data``, a path, or None for a
    random model of ``arch`` (a dict of :class:`TinyArch` fields)."""

    sample_kind = "image"
    default_guidance = 4.5  # base-model sweep on the 256 eval prompts: 3.0 -> 0.341, 4.5 -> 0.370, 6.0 -> 0.396
    default_shift = 1.0
    default_num_steps = 10
    default_eval_num_steps = 10
    negative_prompt = ""
    default_lora_targets = SD3_LORA_TARGETS  # an SD3 transformer without dual attention: every attention projection
    shard_blocks = ("transformer_blocks",)  # SD3Transformer2DModel's joint blocks (FSDP2, models/sharding.py)

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        """Its SD3 transformer and CLIP text encoder at its ``arch``, counted by formula (a joint block holds 36 d^2:
        two streams' attention 8 d^2, MLPs 16 d^2, adaLN 12 d^2); pixel space, no VAE; SD3.5's activation
        coefficient."""
        from flowzoo.models.sd3 import SD35_MEDIUM_ARCH
        from flowzoo.models.tiny_text import MAX_LENGTH

        arch = TinyArch.from_dict(dict(args.get("arch") or {}, data=args.get("data", "shapes"),
                                       source_channels=cls.source_channels))
        d, w = arch.heads * arch.head_dim, arch.text_width
        channels, height, width = image_shape(arch.data)
        patches = d * arch.patch_size ** 2 * (2 * channels + arch.source_channels)  # the input and output projections
        transformer = 36 * d * d * arch.layers + 2 * d * (w + 256) + 2 * d * d + patches
        described = Arch("tiny", transformer_params=transformer, hidden=d, blocks=arch.layers, text_width=w,
                         text_encoder_params=8 * w * w * arch.text_layers + 100 * w, vae_params=0, vae_channels=0,
                         lora_widths={"default": 16 * d * arch.layers}, activation=SD35_MEDIUM_ARCH.activation,
                         source="models/tiny.py TinyArch")
        return Footprint(described, (height // arch.patch_size) * (width // arch.patch_size) + MAX_LENGTH, MAX_LENGTH,
                         channels * height * width, height * width)
    # its own dtypes (float32, float64) and arguments: not the pipeline adapters' ranges
    argument_ranges = {"lora_rank": AT_LEAST_1, "lora_alpha": POSITIVE, "seed": NON_NEGATIVE,
                       "cache_size": NON_NEGATIVE}
    # no diffusers pipeline, but an SD3 transformer: its LoRA file has StableDiffusion3Pipeline's layout
    lora_format = "StableDiffusion3Pipeline"
    transformer_class = "SD3Transformer2DModel"
    #: the source image's channels at the transformer's input (``TinyArch.source_channels``): 0, text-to-image
    source_channels: int = 0

    @classmethod
    def weights_file(cls, data: str) -> Path:
        """The shipped weights ``weights: auto`` loads."""
        return shipped_weights(data)

    @classmethod
    def pretrain_hint(cls, data: str) -> str:
        """The command that writes :meth:`weights_file`."""
        return f"flowzoo pretrain tiny --data {data}"

    def __init__(
        self,
        data: str = "shapes",
        weights: str | None = "auto",
        arch: dict | None = None,
        *,
        lora_rank: int = 8,
        lora_alpha: float = 16,
        lora_targets: Sequence[str] | None = None,
        seed: int = 0,
        device: str | None = "cpu",
        cache_size: int = 4096,
        dtype: str = "float32",
        no_grad_path: NoGradPath = "merged",
        finetune: Finetune = "lora",
    ) -> None:
        FlowModel.__init__(self)  # DiffusersFlowModel.__init__ loads a pipeline directory; the tiny tier has none
        if data not in DATASETS:
            raise ConfigError(f"tiny: unknown data {data!r}; known: {', '.join(DATASETS)}")
        if dtype not in DTYPES:
            raise ConfigError(f"tiny: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if int(lora_rank) <= 0:
            raise ConfigError(f"lora_rank must be a positive integer, got {lora_rank!r}")
        self.no_grad_path = check_no_grad_path(no_grad_path, "tiny")  # docs/tiny.md, Speed
        check_finetune(finetune, "tiny")
        self.device = resolve_device(device)
        self.dtype = DTYPES[dtype]  # the networks' dtype (float64: the dtype test); the shipped weights are float32
        self.num_train_timesteps = 1000
        tensors = None
        if weights is None:
            self.arch = TinyArch.from_dict({"data": data, "source_channels": self.source_channels, **(arch or {})})
            self.path = None
            self.weights_info: dict = {}
        else:
            self.path = self.weights_file(data) if weights == "auto" else Path(weights)
            if weights == "auto" and not self.path.is_file():
                raise ConfigError(
                    f"{self.name}: no shipped weights for data {data!r} at {str(self.path)!r}; "
                    f"run `{self.pretrain_hint(data)}` or pass weights=null for a random model"
                )
            self.arch, tensors, self.weights_info = read_weights(self.path)
            if self.arch.data != data:
                raise ConfigError(f"tiny: {str(self.path)!r} holds a {self.arch.data!r} model, not {data!r}")
            if arch and TinyArch.from_dict({**asdict(self.arch), **arch}) != self.arch:
                raise ConfigError(f"tiny: arch {arch} conflicts with the weights' arch {asdict(self.arch)}")
        self._check_kind()
        self.tokenizer, self.text_encoder, self.transformer = build_networks(self.arch, seed)
        if tensors is not None:
            load_networks(self.transformer, self.text_encoder, tensors)
        for module in (self.text_encoder, self.transformer):
            # torch's own to(): diffusers' override (0.42) warns on stderr about a dtype cast of its (empty) list of
            # float32 modules, a line a one-line CLI error must not carry; the tiny networks keep no module apart
            torch.nn.Module.to(module.requires_grad_(False).eval(), device=self.device, dtype=self.dtype)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + TINY_LORA_INIT_OFFSET)  # peft's gaussian init of LoRA A draws from the global generator
            # finetune: full trains every transformer weight instead (its reference: a frozen copy)
            self._setup_training(finetune, int(lora_rank), float(lora_alpha), lora_targets or self.default_lora_targets)
        self._cache: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()
        self.cache_size = int(cache_size)

    def _check_kind(self) -> None:
        """The arch is this model's kind: text-to-image (no source channels) for ``tiny``, an edit arch for
        ``tiny_edit`` (a one-line ConfigError naming the other model)."""
        if self.arch.source_channels == self.source_channels:
            return
        channels = self.arch.source_channels
        held = "an edit" if channels else "a text-to-image"
        where = f"{str(self.path)!r} holds" if self.path else f"arch.source_channels {channels} makes"
        other = "tiny_edit" if self.arch.source_channels else "tiny"
        raise ConfigError(f"{self.name}: {where} {held} model (source_channels {self.arch.source_channels}); model "
                          f"{self.name!r} takes source_channels {self.source_channels}: use model {other!r}")

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return image_shape(self.arch.data)

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        return text_embeddings(self.tokenizer, self.text_encoder, prompts)

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        return transformer_velocity(self.network(), x, timestep, cond.tensors)

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Pixel space: [-1, 1] -> [0, 1]."""
        return self._to_unit_range(x0)

    @classmethod
    def export_load_hint(cls, full: bool, weights_name: str) -> str:
        if full:
            return super().export_load_hint(full, weights_name)
        # no pipeline to load it into: the transformer loads the LoRA itself
        return f'transformer.load_lora_adapter("DIR", weight_name="{weights_name}", prefix="transformer")'

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return f"TinyModel(arch={self.arch}, weights={str(self.path) if self.path else None!r})"
