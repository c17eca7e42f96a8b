"""What the diffusers-backed adapters (``sd3``, ``wan``, ``flux``, ``qwen_image``) share: local-directory checks,
dtype/device resolution, peft LoRA on the transformer, the reference (adapter disabled), the per-prompt embedding
cache, autocast, the pipeline's own sigma schedule, and one constructor the adapters hand their shared arguments.

diffusers, transformers and peft are imported inside functions so that ``import models`` stays cheap.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar, Iterator, Literal, Mapping, Sequence, get_args

import torch

from flowzoo.errors import ConfigError
from flowzoo.ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE
from flowzoo.models.base import Condition, FlowModel, at_least_float32

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: compute dtypes that run under autocast (the rest run in their own precision)
AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)

#: the attention projections a LoRA adapts (input q/k/v, output, and the joint-attention text-stream ones)
ATTENTION_PROJECTIONS = (
    "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
)
#: SD3's LoRA targets as the released SD3 trainers list them: Flow-GRPO scripts/train_sd3.py:419-433, DiffusionNFT
#: scripts/train_nft_sd3.py:420-431, AWM scripts/train_sd3_awm.py:612-637 (``attn.to_q`` ... ``attn.to_add_out``;
#: LoraConfig(r=32, lora_alpha=64, init_lora_weights="gaussian")). peft matches a target by name suffix, so the
#: ``attn.`` prefix keeps SD3.5's second self-attention (``attn2`` of the dual-attention layers) frozen, as released:
#: on SD3.5-Medium 191 wrapped modules, 18,776,064 LoRA parameters at rank 32 (tests/test_lora_targets.py).
SD3_LORA_TARGETS = tuple(f"attn.{name}" for name in ATTENTION_PROJECTIONS)
#: Wan's LoRA targets: Flow-GRPO's Wan trainer (scripts/train_wan2_1.py) lists the unprefixed names, so both the
#: self-attention (``attn1``) and the cross-attention (``attn2``) of every block are adapted
WAN_LORA_TARGETS = ATTENTION_PROJECTIONS


#: how transformer calls made without autograd run (model arg ``no_grad_path``; :class:`PlainTransformer`):
#: ``peft`` through the peft-adapted transformer (the gradient path), ``merged`` through a peft-free copy whose
#: weights are the base weights plus the LoRA delta, ``compiled`` through that copy under ``torch.compile``
NoGradPath = Literal["peft", "merged", "compiled"]
NO_GRAD_PATHS: tuple[str, ...] = get_args(NoGradPath)
#: what RL trains (model arg ``finetune``): a peft LoRA on ``lora_targets`` (the reference policy: the adapter
#: disabled), or every weight of the transformer (``full``; the reference policy: a frozen copy of the starting
#: transformer, sharded like it under FSDP)
Finetune = Literal["lora", "full"]
FINETUNES: tuple[str, ...] = get_args(Finetune)


def check_finetune(value: str, model: str) -> str:
    if value not in FINETUNES:
        raise ConfigError(f"model {model!r}: unknown finetune {value!r}; valid: {', '.join(FINETUNES)}")
    return value


def check_no_grad_path(value: str, model: str) -> str:
    if value not in NO_GRAD_PATHS:
        raise ConfigError(f"model {model!r}: unknown no_grad_path {value!r}; valid: {', '.join(NO_GRAD_PATHS)}")
    return value


def check_dtype_argument(value, where: str) -> None:
    """``argument_ranges`` check of a pipeline adapter's ``dtype`` / ``vae_dtype`` argument (one of :data:`DTYPES`)."""
    if value not in DTYPES:
        raise ConfigError(f"{where}: unknown dtype {value!r}; valid: {', '.join(DTYPES)}")


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_pipeline_dir(path: str | os.PathLike | None, env_var: str, model: str, pipeline_class: str = "") -> Path:
    """The local diffusers pipeline directory, checked before anything is loaded.

    ``path`` falls back to the environment variable ``env_var``. Fails with a ConfigError naming the path and the
    first missing piece: the directory, ``model_index.json``, or a component folder (with its config / tokenizer
    files) that ``model_index.json`` lists; or, with ``pipeline_class``, a pipeline of another class
    (``model_index.json``'s ``_class_name``), naming the adapter that loads it.
    """
    raw = path if path not in (None, "") else os.environ.get(env_var)
    if not raw:
        raise ConfigError(f"model {model!r} needs a local diffusers directory: set path=... or {env_var}")
    root = Path(raw).expanduser()
    if not root.is_dir():
        raise ConfigError(f"model {model!r}: weights directory {str(root)!r} does not exist (path=... or {env_var})")
    index = root / "model_index.json"
    if not index.is_file():
        raise ConfigError(f"model {model!r}: {str(root)!r} is not a diffusers pipeline: missing model_index.json")
    try:
        components = json.loads(index.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"model {model!r}: {str(index)!r} is not valid JSON ({err})") from None
    found = components.get("_class_name") if isinstance(components, dict) else None
    if pipeline_class and isinstance(found, str) and found != pipeline_class:
        from flowzoo import models

        other = [n for n in models.names() if getattr(models.get(n), "pipeline_class", "") == found]
        hint = f"; the adapter for it: {other[0]}" if other else ""
        raise ConfigError(f"model {model!r}: {str(root)!r} holds a {found} (model_index.json _class_name), not the "
                          f"{pipeline_class} this adapter loads{hint}")
    for name, spec in components.items():
        # entries like "vae": ["diffusers", "AutoencoderKL"]; optional ones are [null, null]
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        folder = root / name
        if not folder.is_dir():
            raise ConfigError(f"model {model!r}: {str(root)!r} is incomplete: missing component folder {name!r}")
        if not any(folder.glob("*config.json")):
            raise ConfigError(
                f"model {model!r}: component {name!r} in {str(root)!r} is incomplete: no config file in {str(folder)!r}"
            )
    return root


def cfg_split_pays(device_type: str, transformer_parameters: int) -> bool:
    """``cfg_batch: auto``'s rule (``DiffusersFlowModel.split_cfg_pays``): split the detached unconditional branch
    into its own call only on the CPU and from ``DiffusersFlowModel.cfg_split_min_params`` parameters; a function of
    the device and the size alone, so the paper models' choice is stated without building them."""
    return device_type == "cpu" and transformer_parameters >= DiffusersFlowModel.cfg_split_min_params


class PlainTransformer:
    """A peft-free copy of a LoRA-adapted diffusers transformer, for calls made without autograd.

    Its weights are the peft model's base weights with each active adapter's delta merged in (``W + scaling B A``,
    peft's ``get_delta_weight``), or the plain base weights while the adapters are disabled (the reference). They are
    recomputed from the peft model whenever one of its parameters' version counters moved (every in-place write
    bumps it: optimizer steps, ``copy_`` in load_trainable_state_dict and in the EMA / old-policy swaps) or the
    adapters were switched; the peft model's weights are only read, never merged into in place (unmerging drifts).
    A refresh copies every weight once (cheap for the tiny tier, ~2x the transformer's memory and a full copy per
    optimizer step for SD3/Wan, which is why they keep the peft path). ``compile``: the copy runs under
    ``torch.compile(dynamic=False)``, one graph per batch shape (a dynamic-shape compile was measured no faster than
    the uncompiled copy, docs/tiny.md "Speed").
    """

    def __init__(self, transformer: torch.nn.Module, compile: bool = False) -> None:
        base = {k.replace(".base_layer.", "."): v for k, v in transformer.state_dict().items() if "lora_" not in k}
        weight = next(iter(base.values()))
        self.module = type(transformer).from_config(transformer.config)
        self.module.load_state_dict(base)
        # torch's own to(): diffusers' override (0.42) warns on stderr about a dtype cast of its float32-module list
        torch.nn.Module.to(self.module.requires_grad_(False).eval(), device=weight.device, dtype=weight.dtype)
        plain = dict(self.module.named_parameters())
        # (copy's parameter, source parameter) for every weight; (copy's weight, peft layer) for every LoRA layer
        self.pairs = [(plain[k.replace(".base_layer.", ".")], p) for k, p in transformer.named_parameters()
                      if "lora_" not in k]
        modules = dict(self.module.named_modules())
        self.lora = [(modules[name].weight, layer) for name, layer in transformer.named_modules()
                     if hasattr(layer, "get_delta_weight")]
        self.sources = list(transformer.parameters())
        self.key: tuple | None = None
        self.refreshes = 0
        self.call = torch.compile(self.module, dynamic=False) if compile else self.module

    def _key(self) -> tuple:
        layer = self.lora[0][1] if self.lora else None
        disabled = bool(layer is not None and layer.disable_adapters)
        active = tuple(layer.active_adapters) if layer is not None else ()
        return (disabled, active, tuple(p._version for p in self.sources))

    @torch.no_grad()
    def refresh(self) -> torch.nn.Module:
        """The module to call, its weights brought up to date with the peft model first if that changed."""
        key = self._key()
        if key != self.key:
            for mine, theirs in self.pairs:
                mine.copy_(theirs)
            if not key[0]:
                for weight, layer in self.lora:
                    if layer.merged:
                        raise RuntimeError("PlainTransformer: the peft model's adapter is merged in place")
                    for adapter in layer.active_adapters:
                        weight.add_(layer.get_delta_weight(adapter).to(weight.dtype))
            self.key = key
            self.refreshes += 1
        return self.call


#: the dtype full fine-tuning trains the transformer's weights in (``master_weights``): ``float32`` (master weights,
#: the half-precision compute under autocast) or ``model`` (the base's own dtype, e.g. bf16 weights updated in bf16)
MASTER_WEIGHTS = ("float32", "model")
#: the LoRA's initialisation (``lora_init``) -> peft's ``init_lora_weights``: ``gaussian`` (A ~ N(0, 1/r), B = 0; the
#: Flow-GRPO trainers, e.g. scripts/train_sd3.py's LoraConfig) or ``kaiming`` (peft's default, True: A Kaiming-uniform,
#: B = 0; DanceGRPO's FLUX LoRA, fastvideo/train_grpo_flux_lora.py:659-664 at 15cc71d). B = 0 either way, so the model
#: starts as the base; the first updates differ.
LORA_INITS = {"gaussian": "gaussian", "kaiming": True}


class DiffusersFlowModel(FlowModel):
    """A FlowModel around a diffusers pipeline whose ``transformer`` predicts the flow velocity ``noise - x0``.

    Subclasses set ``pipeline_class``/``env_var`` and implement ``_encode_prompts`` (uncached, batch-first tensors)
    and ``_transformer_forward``; the base does loading, freezing, LoRA, caching, reference, autocast and dtypes.
    A subclass's constructor writes its whole signature (its own defaults: the config checks read them) and hands
    this constructor its arguments in one call, ``super().__init__(path, **shared_arguments(locals()))``.
    """

    pipeline_class: ClassVar[str] = ""  # name of the diffusers pipeline class
    env_var: ClassVar[str] = ""
    #: the LoRA's initialisation and full fine-tuning's weight dtype (LORA_INITS, MASTER_WEIGHTS); the constructor's
    #: arguments set them per instance, an adapter built another way (the tiny tier, benchmark/perf) keeps these
    lora_init: str = "gaussian"
    master_weights: str = "float32"
    #: the ranges of the constructor arguments every pipeline adapter shares; a subclass adds its own as
    #: ``argument_ranges = {**DiffusersFlowModel.argument_ranges, ...}``
    argument_ranges: ClassVar[dict] = {"dtype": check_dtype_argument, "lora_rank": AT_LEAST_1, "lora_alpha": POSITIVE,
                                       "cache_size": NON_NEGATIVE, "max_sequence_length": AT_LEAST_1}
    #: the empty negative prompt of the Flow-GRPO recipes (``compute_text_embeddings([""], ...)``)
    negative_prompt: ClassVar[str] = ""
    #: the LoRA targets when the config names none (per model, as its released trainers list them)
    default_lora_targets: ClassVar[tuple[str, ...]] = ()
    #: FSDP2 shards the transformer block by block (``models/sharding.py``); ``shard_blocks`` None: every block list
    #: of the transformer (an adapter names its own where it knows them)
    shardable: ClassVar[bool] = True
    shard_blocks: ClassVar[tuple[str, ...] | None] = None
    #: what RL trains (:data:`Finetune`), set by the constructor
    finetune: str = "lora"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.lora_format is None and cls.pipeline_class:  # export writes its pipeline's own LoRA format
            cls.lora_format = cls.pipeline_class

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        lora_rank: int = 32,
        lora_alpha: float = 64,
        lora_targets: Sequence[str] | None = None,
        dtype: str = "float32",
        device: str | torch.device | None = None,
        gradient_checkpointing: bool = False,
        max_sequence_length: int = 256,
        component_dtypes: dict[str, str] | None = None,
        cache_size: int = 1024,
        finetune: Finetune = "lora",
        lora_init: str = "gaussian",
        master_weights: str = "float32",
    ) -> None:
        super().__init__()
        check_finetune(finetune, self.name)
        if master_weights not in MASTER_WEIGHTS:
            raise ConfigError(f"{self.name} master_weights must be one of {', '.join(MASTER_WEIGHTS)}, got "
                              f"{master_weights!r}")
        self.master_weights = master_weights
        if lora_init not in LORA_INITS:
            raise ConfigError(f"{self.name} lora_init must be one of {', '.join(LORA_INITS)}, got {lora_init!r}")
        self.lora_init = lora_init
        root = check_pipeline_dir(path, self.env_var, self.name, self.pipeline_class)
        self.path = root
        self.dtype = resolve_dtype(dtype)
        self.device = resolve_device(device)
        self.max_sequence_length = int(max_sequence_length)
        if int(lora_rank) <= 0:
            raise ConfigError(f"lora_rank must be a positive integer, got {lora_rank!r}")

        import diffusers

        pipe_cls = getattr(diffusers, self.pipeline_class)
        try:
            self.pipe = pipe_cls.from_pretrained(str(root), dtype=self.dtype, **self._pipeline_components(root))
        except (OSError, ValueError) as err:  # e.g. a component folder without its weights file
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"model {self.name!r}: cannot load {str(root)!r}: {first}") from None
        self.pipe.set_progress_bar_config(disable=True)
        for name, dt in (component_dtypes or {}).items():  # e.g. the Wan VAE in float32, as the recipes do
            getattr(self.pipe, name).to(dtype=resolve_dtype(dt))
        for module in self.pipe.components.values():
            if isinstance(module, torch.nn.Module):
                module.requires_grad_(False)
                module.eval()
                module.to(self.device)
        self.transformer = self.pipe.transformer
        self.num_train_timesteps = int(self.pipe.scheduler.config.get("num_train_timesteps", 1000))

        self._setup_training(finetune, int(lora_rank), float(lora_alpha), lora_targets or self.default_lora_targets)
        if gradient_checkpointing:
            self.transformer.enable_gradient_checkpointing(self._checkpointing_func())
        # prompt -> embeddings, least recently used evicted first (an SD3 prompt is ~205 x 4096 values)
        # prompt -> (its tensors, its host values: _host_values)
        self._cache: OrderedDict[str, tuple[dict[str, torch.Tensor], dict]] = OrderedDict()
        self.cache_size = int(cache_size)

    def _pipeline_components(self, root: Path) -> dict[str, Any]:
        """Components the adapter builds itself and hands to the pipeline's ``from_pretrained`` (none by default)."""
        return {}

    # ---- what trains: LoRA or every weight ---------------------------------------------------------------
    def _setup_training(self, finetune: str, rank: int, alpha: float, targets: Sequence[str]) -> None:
        """A LoRA on ``targets`` (``finetune: lora``), or every transformer weight trainable with a frozen copy of the
        starting transformer as the reference policy (``full``)."""
        self.finetune = check_finetune(finetune, self.name)
        self._policy_transformer = self.transformer
        self._reference_transformer = None
        if finetune == "lora":
            self._lora_names = self._add_lora(rank, alpha, targets, self.lora_init)
            return
        import copy

        self._lora_names = []
        self._reference_transformer = copy.deepcopy(self.transformer).requires_grad_(False).eval()
        for param in self.transformer.parameters():
            # full fine-tuning keeps float32 master weights (master_weights: float32; autocast runs the half-precision
            # matmuls): at lr 1e-5 most AdamW updates to a bf16 weight round away (tests/test_master_weights.py).
            # master_weights: model trains the base's own dtype, where a recipe cites a release that does so
            if self.master_weights == "float32" and param.dtype in AUTOCAST_DTYPES:
                param.data = param.data.float()
            param.requires_grad_(True)

    def _trained_transformer(self) -> torch.nn.Module:
        """The transformer RL trains (``self.transformer``, except inside a full fine-tuning's ``reference()``; an
        adapter built without ``_setup_training``, as benchmark/perf's, has only ``self.transformer``)."""
        policy = self.__dict__.get("_policy_transformer")
        return self.transformer if policy is None else policy

    def fsdp_modules(self) -> list[torch.nn.Module]:
        reference = self.__dict__.get("_reference_transformer")
        return [self._trained_transformer()] + ([reference] if reference is not None else [])

    def _add_lora(self, rank: int, alpha: float, targets: Sequence[str], init: str = "gaussian") -> list[str]:
        from peft import LoraConfig

        config = LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=LORA_INITS[init],
                            target_modules=list(targets))
        try:
            self.transformer.add_adapter(config)
        except ValueError as err:  # peft: "Target modules {...} not found in the base model"
            raise ConfigError(f"lora_targets {list(targets)!r} match no module of the transformer: {err}") from None
        names = []
        for name, param in self.transformer.named_parameters():
            if "lora_" in name:
                # adapters train in float32 whatever the half-precision base dtype (autocast casts them per matmul);
                # a float64 model's adapters are float64
                param.data = param.data.to(device=self.device, dtype=self.latent_dtype)
                param.requires_grad_(True)
                names.append(name)
        return names

    def _lora_params(self) -> dict[str, torch.nn.Parameter]:
        """The trainable parameters by name: the LoRA's, or (``finetune: full``) every weight of the transformer."""
        params = dict(self._trained_transformer().named_parameters())
        if self.finetune == "full":
            return params
        return {name: params[name] for name in self._lora_names}

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return list(self._lora_params().values())

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Full tensors by name (a sharded model gathers each: every process must call it)."""
        from flowzoo.models.sharding import full_tensor

        return {name: full_tensor(p.detach()).clone() for name, p in self._lora_params().items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load full tensors (a sharded model keeps this process's shard of each)."""
        from flowzoo.models.sharding import like

        params = self._lora_params()
        missing, unexpected = set(params) - set(state), set(state) - set(params)
        if missing or unexpected:
            what = "LoRA" if self.finetune == "lora" else "full fine-tuning"
            raise ConfigError(
                f"{what} state does not match model {self.name!r}: missing {sorted(missing)[:3]}, "
                f"unexpected {sorted(unexpected)[:3]}"
            )
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(like(state[name], p))

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """The frozen base transformer: the LoRA adapter disabled (diffusers ``disable_adapters``), or under
        ``finetune: full`` the frozen copy of the starting transformer in ``self.transformer``'s place."""
        if self.finetune == "full":
            self.transformer = self._reference_transformer
            try:
                yield
            finally:
                self.transformer = self._policy_transformer
            return
        params = self.trainable_parameters()
        flags = [p.requires_grad for p in params]
        self.transformer.disable_adapters()
        try:
            yield
        finally:
            self.transformer.enable_adapters()
            for p, flag in zip(params, flags):  # peft toggles requires_grad; restore what it was
                p.requires_grad_(flag)

    # ---- the no-grad path ----------------------------------------------------------------------------------
    #: how calls made without autograd run (:data:`NoGradPath`); the adapters that offer the choice set it per
    #: instance, the default is the peft transformer (sd3 / wan: merging a billion-parameter copy every step does not pay)
    no_grad_path: str = "peft"

    def network(self) -> torch.nn.Module:
        """The transformer a call made now runs: the peft one with autograd on or under ``no_grad_path: peft``,
        else the up-to-date :class:`PlainTransformer` (merged weights, or base weights inside ``reference()``)."""
        if self.no_grad_path == "peft" or torch.is_grad_enabled() or self.finetune == "full" or self.sharded:
            # nothing to merge in a full fine-tuning; a sharded transformer's weights exist whole only inside its calls
            return self.transformer
        if getattr(self, "_plain", None) is None:
            self._plain = PlainTransformer(self.transformer, self.no_grad_path == "compiled")
        return self._plain.refresh()

    # ---- conditioning -------------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Batch-first conditioning tensors of ``prompts`` (each adapter calls its pipeline's text encoders)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _encode_prompts")

    def _host_values(self, tensors: dict[str, torch.Tensor]) -> dict[str, list]:
        """Per-prompt values of a batch of encoded prompts that the condition keeps on the host
        (:attr:`Condition.host`), read once when the prompts are encoded: none by default."""
        return {}

    def encode(self, prompts: Sequence[str], metadata: Sequence[dict] | None = None) -> Condition:
        """Text embeddings per prompt, computed once per distinct prompt string and then served from an LRU cache
        of ``cache_size`` prompts (the empty negative prompt is never evicted), with their host values."""
        prompts = [str(p) for p in prompts]
        missing = list(dict.fromkeys(p for p in prompts if p not in self._cache))
        if missing:
            with torch.no_grad():
                tensors = self._encode_prompts(missing)
            host = self._host_values(tensors)
            for i, prompt in enumerate(missing):
                self._cache[prompt] = ({k: v[i].detach() for k, v in tensors.items()},
                                       {k: v[i] for k, v in host.items()})
        rows = [self._cache[p] for p in prompts]
        for prompt in dict.fromkeys(prompts):
            self._cache.move_to_end(prompt)
        while len(self._cache) > max(self.cache_size, 1):
            oldest = next(k for k in self._cache if k != self.negative_prompt)
            del self._cache[oldest]
        return Condition.stack(rows)

    def null_condition(self, n: int) -> Condition:
        return self.encode([self.negative_prompt]).repeat_interleave(n)

    # ---- network evaluation -------------------------------------------------------------------------------
    #: ``cfg_batch: auto`` splits the detached unconditional CFG branch into its own no_grad call on the CPU from this
    #: many transformer parameters on: there a call's arithmetic is its cost, and the backward of B rows it saves
    #: outweighs the extra call. Measured on the CPU (docs/perf.md): the tiny tier (1.7 M) trains 2.3x faster split,
    #: the perf pipeline (0.02 M) is faster batched.
    cfg_split_min_params: ClassVar[int] = 1_000_000

    def split_cfg_pays(self) -> bool:
        """On an accelerator never: the released loops' one batched call on 2 B rows (unconditional half detached) is
        what a GPU runs fastest at the recipes' 4-9 samples per call, where its time follows the number of calls (the
        first GPU run, docs/perf.md: the split update was 1.38x the released loop on an H200 at 4 samples); no GPU
        measurement has shown the split form paying at any rows per call. On the CPU: from ``cfg_split_min_params``."""
        return cfg_split_pays(self.device.type, self.transformer_parameters())

    def transformer_parameters(self) -> int:
        """The transformer's parameter count (counted once)."""
        if not hasattr(self, "_transformer_params"):
            self._transformer_params = sum(p.numel() for p in self.transformer.parameters())
        return self._transformer_params

    def _autocast(self):
        if self.dtype not in AUTOCAST_DTYPES:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    #: the scaled-dot-product-attention backends the transformer may use (``torch.nn.attention.SDPBackend`` names), or
    #: None for torch's own choice; an adapter narrows it where a backend was seen to fail on its shapes
    attention_backends: ClassVar[tuple[str, ...] | None] = None

    def _attention(self):
        if self.attention_backends is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # the backward pass runs the kernel the forward picked, so the forward's choice holds for the update too
        return sdpa_kernel([getattr(SDPBackend, name) for name in self.attention_backends])

    def _checkpointing_func(self):
        """diffusers' gradient-checkpointing function (None: its own), or, when the adapter narrows the attention
        backends, the same non-reentrant checkpoint whose recomputation in the backward pass runs under them too
        (the forward's context has ended by then, and a recomputed forward would pick torch's backend again)."""
        if self.attention_backends is None:
            return None
        from torch.utils.checkpoint import checkpoint

        def func(module, *args):
            return checkpoint(module.__call__, *args, use_reentrant=False,
                              context_fn=lambda: (contextlib.nullcontext(), self._attention()))

        return func

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        """One transformer call as the adapter's pipeline makes it (argument names differ between SD3 and Wan)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _transformer_forward")

    def predict(self, x: torch.Tensor, sigma: torch.Tensor, cond: Condition) -> torch.Tensor:
        """One transformer call; its output is the velocity ``noise - x0``.

        The pipelines feed ``timestep = sigma * num_train_timesteps`` and step with FlowMatchEulerDiscreteScheduler,
        ``prev = sample + (sigma_next - sigma) * model_output``: exactly the FlowModel convention, so no sign flip.
        """
        if sigma.dim() == 0:
            sigma = sigma.expand(x.shape[0])
        timestep = (sigma.to(device=self.device, dtype=torch.float32) * self.num_train_timesteps)
        x = x.to(device=self.device, dtype=self.transformer.dtype)
        cond = Condition({k: v.to(device=self.device, dtype=self.transformer.dtype) if v.is_floating_point() else v
                          for k, v in cond.tensors.items()}, cond.host)
        with self._autocast(), self._attention():
            out = self._transformer_forward(x, timestep, cond)
        return at_least_float32(out)  # a half-precision output upcast for the sampler; float64 stays float64

    # ---- helpers ------------------------------------------------------------------------------------------
    @staticmethod
    def _to_unit_range(samples: torch.Tensor) -> torch.Tensor:
        """VAE output in [-1, 1] -> [0, 1] (diffusers' VaeImageProcessor ``denormalize``)."""
        return (samples.float() / 2 + 0.5).clamp(0, 1)

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return f"{type(self).__name__}(path={str(self.path)!r}, dtype={self.dtype}, device={self.device})"


#: the keyword arguments of :class:`DiffusersFlowModel`'s constructor, which every adapter passes on
SHARED_ARGUMENTS = tuple(name for name, parameter in inspect.signature(DiffusersFlowModel.__init__).parameters.items()
                         if parameter.kind is inspect.Parameter.KEYWORD_ONLY)


def shared_arguments(values: Mapping[str, Any]) -> dict[str, Any]:
    """The base constructor's keyword arguments among ``values``, an adapter constructor's ``locals()``: its own
    arguments (resolution, frames, ...) and ``self`` are left out, so the adapter passes the shared ones on in one
    call whatever order and defaults its signature gives them."""
    return {name: values[name] for name in SHARED_ARGUMENTS if name in values}
