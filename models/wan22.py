"""Wan2.2 text-to-video (diffusers ``WanPipeline``) as a FlowModel: the two-expert A14B and the TI2V-5B, each with a
peft LoRA on every transformer it samples with.

What differs from Wan2.1 (models/wan.py, whose prompt encoding, CFG and decoding this adapter keeps), as diffusers
0.42.1 pipelines/wan/pipeline_wan.py runs it:

* **Two experts (Wan2.2-T2V-A14B).** The directory holds ``transformer`` (the high-noise expert) and
  ``transformer_2`` (the low-noise one) and ``model_index.json`` a ``boundary_ratio`` (0.875 for T2V-A14B). At each
  step the pipeline calls ``transformer`` when ``t >= boundary_ratio * num_train_timesteps`` and ``transformer_2``
  below (pipeline_wan.py:585-604), where ``t`` is the step's timestep; here ``t = sigma * num_train_timesteps``,
  the timestep this adapter feeds the network, so each row of a call goes to the expert the pipeline would use at
  its sigma. The high-noise expert guides with ``guidance_scale`` (``algorithm.guidance``), the low-noise one with
  ``guidance_scale_2`` (the ``guidance_2`` argument; the release's pair is 4.0 / 3.0, Wan-Video/Wan2.2
  wan/configs/wan_t2v_A14B.py ``sample_guide_scale = (3.0, 4.0)  # low noise, high noise``); as in the pipeline,
  CFG runs at all only when ``guidance_scale`` is not 1. Wan2.2 ships a ``UniPCMultistepScheduler`` whose timesteps
  are ``int64`` (truncated ``sigma * 1000``): with an integer boundary (875, 900) truncation never moves a step
  across it, and like the wan adapter this one feeds the network the untruncated ``sigma * 1000``.
* **TI2V-5B.** One transformer (48 latent channels) and the Wan2.2 VAE (``AutoencoderKLWan`` with ``z_dim`` 48,
  ``is_residual``, ``patch_size`` 2: 16x spatial compression), ``expand_timesteps: true``: the pipeline hands the
  transformer one timestep per latent token (pipeline_wan.py:607-611; its text-to-video mask is all ones, so every
  token has the step's ``t``), which this adapter does too. Its latent shape and decoding follow the directory's
  VAE config as the wan adapter's do. Its image-to-video mode (the first frame's latents, WanImageToVideoPipeline)
  is not offered.

**What trains.** A LoRA on each expert (``lora_targets`` on both; Flow-Factory's Wan2.2 LoRA recipe trains both,
``target_components: ['transformer', 'transformer_2']``, rank 64, alpha 128: X-GenGroup/Flow-Factory
examples/grpo/lora/wan22/t2v.yaml), or under ``finetune: full`` every weight of both with a frozen copy of each as
the reference. The trainable state names the low-noise expert's tensors ``transformer_2.<name>``; ``flowzoo
export`` writes one LoRA file per expert (``exported_transformers``), the second loaded with ``load_lora_weights(DIR,
weight_name="pytorch_lora_weights_transformer_2.safetensors", load_into_transformer_2=True)``.

**Sharding.** Both experts are sharded (``fsdp_modules``). Every FSDP call is a collective, and which expert a row
needs depends on its sigma, which AWM and DiffusionNFT draw per row: so a sharded model calls both experts in every
``predict``, an expert with no rows of its own on one row whose output is added times zero (its forward and backward
still run, carrying no gradient), so every process makes the same calls whatever sigmas it holds.

Recipe defaults: Flow-Factory's Wan2.2 T2V LoRA recipe (the file above: 10 training steps, CFG 4.0 / 3.0,
rank 64 / alpha 128, one sample per call, 5 frames at 480 x 480); evaluation at the release's 40 steps and its
sigma shift 12.0 (wan_t2v_A14B.py ``sample_shift``, ``sample_steps``) on Wan's UniPC flow-sigma grid. The TI2V-5B's
release values differ (shift 5.0, 50 steps, CFG 5.0: wan_ti2v_5B.py): set ``algorithm.shift`` / ``guidance`` /
``train.eval_num_steps`` for it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator, Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.ranges import POSITIVE
from flowzoo.models import register
from flowzoo.models.base import Condition
from flowzoo.models.diffusers_common import Finetune, shared_arguments
from flowzoo.models.footprint import Arch, Footprint
from flowzoo.models.wan import WAN_ARCHES, WanModel

#: the pipeline component of the low-noise expert, and the prefix of its tensors' names in the trainable state
LOW_NOISE = "transformer_2"
#: the attributes ``DiffusersFlowModel`` keeps per transformer (its training set-up, reference and caches); the
#: low-noise expert keeps its own set, swapped in while it runs (``Wan22Model._low_noise``)
PER_EXPERT = ("transformer", "_policy_transformer", "_reference_transformer", "_lora_names", "_plain",
              "_transformer_params")

_A14B = WAN_ARCHES[40]
#: Wan2.2's two shapes as the memory estimate reads them (counts checked by tests/test_memory_estimate.py against the
#: transformers built on the meta device). A14B: two Wan2.1-14B-shaped experts, both resident, one active per call
#: (hidden and blocks are one expert's), a LoRA on each; the Wan2.1 VAE. TI2V-5B: one transformer and the Wan2.2 VAE
#: (diffusers scripts/convert_wan_to_diffusers.py ``vae22_diffusers_config``: base_dim 160, decoder_base_dim 256,
#: z_dim 48, patch_size 2), whose decoder's widest full-resolution stage is 512 channels at half the pixels (it
#: unpatchifies 2 x 2 last): 128 per output pixel. The activation coefficient is SD3's (no Wan figure was measured).
WAN22_ARCHES = {
    "A14B": Arch("Wan2.2-T2V-A14B", transformer_params=2 * _A14B.transformer_params, hidden=5120, blocks=40,
                 text_width=4096, text_encoder_params=_A14B.text_encoder_params, vae_params=_A14B.vae_params,
                 vae_channels=_A14B.vae_channels, lora_widths={"default": 2 * _A14B.lora_widths["default"]},
                 activation=27.0,
                 source="Wan-Video/Wan2.2 wan/configs/wan_t2v_A14B.py (two experts: dim 5120, ffn 13824, 40 heads, "
                        "40 layers each); Wan-AI/Wan2.2-T2V-A14B-Diffusers"),
    "TI2V-5B": Arch("Wan2.2-TI2V-5B", transformer_params=4_999_787_712, hidden=3072, blocks=30, text_width=4096,
                    text_encoder_params=_A14B.text_encoder_params, vae_params=704_688_668, vae_channels=128,
                    lora_widths={"default": 1_474_560}, activation=27.0,
                    source="Wan-Video/Wan2.2 wan/configs/wan_ti2v_5B.py (dim 3072, ffn 14336, 24 heads, 30 layers, "
                           "48 latent channels); Wan-AI/Wan2.2-TI2V-5B-Diffusers"),
}


def directory_shape(path: str | os.PathLike | None) -> str:
    """``A14B`` or ``TI2V-5B``: the shape of the pipeline directory at ``path`` (its ``model_index.json`` lists a
    ``transformer_2``, or its transformer has 48 input channels), A14B when it is not on this machine."""
    try:
        root = Path(path) if path else None
        index = json.loads((root / "model_index.json").read_text()) if root else {}
        config = json.loads((root / "transformer" / "config.json").read_text()) if root else {}
    except (OSError, ValueError):
        return "A14B"
    second = index.get(LOW_NOISE)
    if isinstance(second, list) and any(second):
        return "A14B"
    return "TI2V-5B" if config.get("in_channels") == 48 else "A14B"


@register("wan22")
class Wan22Model(WanModel):
    """Wan2.2 text-to-video (WanPipeline): the A14B's high/low-noise experts switched at the boundary, or the TI2V-5B;
    LoRA on each expert."""

    default_guidance = 4.0  # the high-noise expert's (guidance_scale); the low-noise one's is the guidance_2 argument
    default_shift = 12.0
    default_num_steps = 10
    default_eval_num_steps = 40
    # samples per training-rollout call, decode and reward call: Flow-Factory's Wan2.2 recipe, per_device_batch_size 1
    default_rollout_batch = 1
    env_var = "FLOWZOO_WAN22_PATH"
    argument_ranges = {**WanModel.argument_ranges, "guidance_2": POSITIVE}
    architecture = WAN22_ARCHES["A14B"]
    #: the low-noise expert's per-transformer state while the high-noise one's is on the instance (None: one
    #: transformer), and whether the low-noise expert's state is the one swapped in
    _second: dict | None = None
    _in_low: bool = False
    #: the sigmas of the rows of the ``velocity`` call in progress, which ``guide`` reads (None outside one)
    _guided_sigma: torch.Tensor | None = None

    @classmethod
    def footprint(cls, args: dict) -> Footprint:
        """The shape of the directory when it is on this machine (else the A14B); text enters by cross-attention;
        the VAE decodes one latent frame (4 frames) at a time."""
        shape = directory_shape(args.get("path") or os.environ.get(cls.env_var))
        arch = WAN22_ARCHES[shape]
        spatial, channels = (16, 48) if shape == "TI2V-5B" else (8, 16)
        frames, height, width = int(args["frames"]), int(args["height"]), int(args["width"])
        latent_frames = (frames - 1) // 4 + 1
        return Footprint(arch, latent_frames * (height // (2 * spatial)) * (width // (2 * spatial)),
                         int(args["max_sequence_length"]),
                         channels * latent_frames * (height // spatial) * (width // spatial), 4 * height * width)

    @classmethod
    def export_load_hint(cls, full: bool, weights_name: str) -> str:
        if full:
            return ('WanPipeline.from_pretrained(BASE, transformer=WanTransformer3DModel.from_pretrained('
                    '"DIR/transformer"), transformer_2=WanTransformer3DModel.from_pretrained("DIR/transformer_2")) '
                    '(a TI2V-5B run: transformer only)')
        return ('pipe = WanPipeline.from_pretrained(BASE); pipe.load_lora_weights("DIR"); and for the A14B\'s '
                'low-noise expert pipe.load_lora_weights("DIR", weight_name='
                '"pytorch_lora_weights_transformer_2.safetensors", load_into_transformer_2=True)')

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        frames: int = 5,
        height: int = 480,
        width: int = 480,
        guidance_2: float = 3.0,
        lora_rank: int = 64,
        lora_alpha: float = 128,
        lora_targets: Sequence[str] | None = None,
        dtype: str = "float32",
        vae_dtype: str = "float32",
        device: str | torch.device | None = None,
        gradient_checkpointing: bool = False,
        cache_size: int = 1024,
        max_sequence_length: int = 512,
        finetune: Finetune = "lora",
        lora_init: str = "gaussian",
        master_weights: str = "float32",
    ) -> None:
        self.guidance_2 = float(guidance_2)
        super().__init__(path, frames=frames, height=height, width=width, vae_dtype=vae_dtype,
                         **shared_arguments(locals()))
        if gradient_checkpointing and self._second is not None:
            with self._low_noise():
                self.transformer.enable_gradient_checkpointing(self._checkpointing_func())

    def _check_generation(self) -> None:
        """A second expert needs the boundary that chooses it (the pipeline would never call it without one)."""
        if self._second is None and getattr(self.pipe, LOW_NOISE, None) is not None:
            raise ConfigError(f"model 'wan22': {str(self.path)!r} has a {LOW_NOISE} but no boundary_ratio in "
                              f"model_index.json, so WanPipeline never calls it")

    # ---- the experts ----------------------------------------------------------------------------------------
    @property
    def boundary_timestep(self) -> float | None:
        """``boundary_ratio * num_train_timesteps`` (pipeline_wan.py:586), or None with one transformer."""
        ratio = self.pipe.config.get("boundary_ratio")
        return None if self._second is None or ratio is None else ratio * self.num_train_timesteps

    def high_noise(self, sigma: torch.Tensor) -> torch.Tensor:
        """Per row, whether the pipeline calls the high-noise expert (``transformer``) at ``sigma``: ``t >=
        boundary`` with ``t`` the timestep ``predict`` feeds the network (float32 ``sigma * num_train_timesteps``)."""
        timestep = sigma.to(dtype=torch.float32) * self.num_train_timesteps
        boundary = self.boundary_timestep
        return torch.ones_like(timestep, dtype=torch.bool) if boundary is None else timestep >= boundary

    def _setup_training(self, finetune: str, rank: int, alpha: float, targets: Sequence[str]) -> None:
        """The base's LoRA (or full fine-tuning) on the high-noise expert, then the same on the low-noise one."""
        super()._setup_training(finetune, rank, alpha, targets)
        second = getattr(self.pipe, LOW_NOISE, None)
        if second is None or self.pipe.config.get("boundary_ratio") is None:
            return
        self._second = {"transformer": second}
        with self._low_noise():
            super()._setup_training(finetune, rank, alpha, targets)

    @contextlib.contextmanager
    def _low_noise(self) -> Iterator[None]:
        """Within this context the base class's per-transformer state (``PER_EXPERT``) is the low-noise expert's."""
        if self._in_low:
            yield
            return
        high = {k: self.__dict__.pop(k) for k in PER_EXPERT if k in self.__dict__}
        self.__dict__.update(self._second)
        self._in_low = True
        try:
            yield
        finally:
            self._second = {k: self.__dict__.pop(k) for k in PER_EXPERT if k in self.__dict__}
            self.__dict__.update(high)
            self._in_low = False

    def _expert(self, low: bool):
        return self._low_noise() if low else contextlib.nullcontext()

    def exported_transformers(self) -> dict[str, torch.nn.Module]:
        found = {"transformer": self.transformer}
        if self._second is not None:
            found[LOW_NOISE] = self._second["transformer"]
        return found

    def fsdp_modules(self) -> list[torch.nn.Module]:
        modules = super().fsdp_modules()
        if self._second is not None and not self._in_low:
            with self._low_noise():
                modules += super().fsdp_modules()
        return modules

    def _lora_params(self) -> dict[str, torch.nn.Parameter]:
        """Both experts' trainable parameters, the low-noise one's named ``transformer_2.<name>``."""
        params = super()._lora_params()
        if self._second is None or self._in_low:
            return params
        with self._low_noise():
            low = super()._lora_params()
        return {**params, **{f"{LOW_NOISE}.{name}": p for name, p in low.items()}}

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Both experts' reference policies (each LoRA disabled, or each frozen copy in its expert's place)."""
        with super().reference():
            if self._second is None:
                yield
                return
            low = super().reference()
            with self._low_noise():
                low.__enter__()
            try:
                yield
            finally:
                with self._low_noise():
                    low.__exit__(None, None, None)

    # ---- network evaluation ---------------------------------------------------------------------------------
    def predict(self, x: torch.Tensor, sigma: torch.Tensor, cond: Condition) -> torch.Tensor:
        """Each row through the expert the pipeline uses at its sigma (module docstring: a sharded model calls both
        experts every time)."""
        if self._second is None or not len(x):
            return super().predict(x, sigma, cond)
        if sigma.dim() == 0:
            sigma = sigma.expand(x.shape[0])
        high = self.high_noise(sigma).cpu()
        out, padding = None, []
        for low, chosen in ((False, high), (True, ~high)):
            rows = chosen.nonzero().squeeze(1)
            if not len(rows) and not self.sharded:
                continue
            if len(rows) == len(high):  # every row: the call as the pipeline makes it
                with self._expert(low):
                    out = super().predict(x, sigma, cond)
                continue
            pad = not len(rows)
            rows = torch.zeros(1, dtype=torch.long) if pad else rows
            with self._expert(low):
                v = super().predict(x[rows.to(x.device)], sigma[rows.to(sigma.device)], cond.index(rows))
            if pad:
                padding.append(v)
                continue
            if out is None:
                out = v.new_empty((x.shape[0], *v.shape[1:]))
            out = out.index_put((rows.to(v.device),), v)
        for v in padding:  # lockstep padding: the call and its backward happen, its value adds nothing
            out = out + v.sum() * 0
        return out

    def _transformer_forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: Condition) -> torch.Tensor:
        """TI2V-5B (``expand_timesteps``): one timestep per latent token, as pipeline_wan.py:607-611."""
        if self.pipe.config.get("expand_timesteps"):
            p = self.transformer.config.patch_size
            tokens = (x.shape[2] // p[0]) * (x.shape[3] // p[1]) * (x.shape[4] // p[2])
            timestep = timestep[:, None].expand(-1, tokens)
        return super()._transformer_forward(x, timestep, cond)

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Condition, guidance: float | None = None,
                 cfg_grad: str = "cond", cfg_batch: str = "auto") -> torch.Tensor:
        """The base's CFG, with each row's sigma kept for ``guide`` (the low-noise rows combine with
        ``guidance_2``)."""
        self._guided_sigma = sigma.expand(x.shape[0]) if sigma.dim() == 0 else sigma
        try:
            return super().velocity(x, sigma, cond, guidance, cfg_grad, cfg_batch)
        finally:
            self._guided_sigma = None

    def guide(self, v_cond: torch.Tensor, v_uncond: torch.Tensor, guidance: float) -> torch.Tensor:
        """``u + g (c - u)`` with ``g`` the high-noise expert's scale on its rows and ``guidance_2`` on the low-noise
        expert's (pipeline_wan.py:597-604, 638)."""
        sigma = self._guided_sigma
        combined = super().guide(v_cond, v_uncond, guidance)
        if self._second is None or sigma is None:
            return combined
        high = self.high_noise(sigma).to(v_cond.device)
        if bool(high.all()):
            return combined
        low = super().guide(v_cond, v_uncond, self.guidance_2)
        return torch.where(high.view(-1, *([1] * (v_cond.dim() - 1))), combined, low)
