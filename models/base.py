"""The FlowModel interface every algorithm talks to.

Conventions (shared by every tier and by ``algorithms.engine.sde``):

* ``sigma`` runs from 1 (pure noise) to 0 (clean data); ``x_sigma = (1 - sigma) * x0 + sigma * noise``.
* The velocity is ``v = dx/dsigma = noise - x0``; an Euler step is ``x_next = x + v * (sigma_next - sigma)``.
* ``velocity()`` applies classifier-free guidance and counts network evaluations (``nfe``): one per sample
  per forward pass, so a CFG step on B samples adds 2 * B.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Sequence

import torch

from flowzoo.models.footprint import Footprint

#: which CFG branch carries the gradient in training (see ``FlowModel.velocity``)
CFG_GRADS = ("cond", "both")
#: how the detached-unconditional CFG form runs with autograd on (see ``FlowModel.velocity``)
CFG_BATCHES = ("auto", "batched", "split")


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or in its own dtype when that is wider (float64): half-precision values (a bf16 network's
    output) are upcast for the sampler's and the losses' math, and a float64 run is never narrowed to float32."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@dataclass
class Condition:
    """Batch-first conditioning tensors of one batch of prompts (text embeddings, class ids, ...), and ``host``:
    per-row values kept on the host (a tuple per name, one value a row) that index, repeat and join with the rows,
    for what a model reads per call without waiting for the device (Qwen-Image's valid prompt lengths: its pipeline
    reads them once per generation, a read of the mask per transformer call would be one host sync each)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    host: dict[str, tuple] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def index(self, idx: torch.Tensor | slice | Sequence[int]) -> "Condition":
        if not isinstance(idx, (slice, torch.Tensor)):
            idx = torch.as_tensor(list(idx), dtype=torch.long)
        return Condition({k: v[idx] for k, v in self.tensors.items()}, self._host_rows(idx))

    def _host_rows(self, idx: torch.Tensor | slice) -> dict[str, tuple]:
        """``host`` at the rows ``idx`` selects; dropped (not synced) for an index on a device."""
        if not self.host:
            return {}
        if isinstance(idx, slice):
            return {k: v[idx] for k, v in self.host.items()}
        if idx.device.type != "cpu":
            return {}
        rows = (idx.nonzero().flatten() if idx.dtype == torch.bool else idx.flatten()).tolist()
        return {k: tuple(v[i] for i in rows) for k, v in self.host.items()}

    def repeat_interleave(self, n: int) -> "Condition":
        return Condition({k: v.repeat_interleave(n, dim=0) for k, v in self.tensors.items()},
                         {k: tuple(x for x in v for _ in range(n)) for k, v in self.host.items()})

    @staticmethod
    def stack(rows: Sequence[tuple[dict[str, torch.Tensor], dict]]) -> "Condition":
        """The condition of per-prompt rows, each (its tensors, its host values), in order."""
        return Condition({k: torch.stack([tensors[k] for tensors, _ in rows]) for k in rows[0][0]},
                         {k: tuple(host[k] for _, host in rows) for k in rows[0][1]})

    @staticmethod
    def cat(conds: Sequence["Condition"]) -> "Condition":
        keys = conds[0].tensors.keys()
        host = {k: tuple(x for c in conds for x in c.host[k]) for k in conds[0].host
                if all(k in c.host for c in conds)}
        return Condition({k: torch.cat([c.tensors[k] for c in conds]) for k in keys}, host)

    def to(self, device: torch.device | str) -> "Condition":
        return Condition({k: v.to(device) for k, v in self.tensors.items()}, dict(self.host))


class FlowModel:
    """A conditional flow-matching generator seen as a policy over denoising steps.

    Adapters implement ``encode``, ``null_condition``, ``predict``, ``decode``, ``latent_shape``,
    ``trainable_parameters``, ``reference`` and the trainable state dict; the base class adds CFG,
    NFE counting and per-sample initial noise.
    """

    name: ClassVar[str] = "base"
    #: what ``decode`` returns: "points" [B, D], "image" [B, C, H, W] or "video" [B, F, C, H, W], in [0, 1] for media
    sample_kind: ClassVar[str] = "points"
    default_guidance: float = 1.0
    default_shift: float = 1.0
    #: the sigma grid of the model's own pipeline (``algorithms.engine.sde.sigma_schedule``'s ``grid``): "diffusers" (SD3's
    #: scheduler), "flux" (FluxPipeline / QwenImagePipeline: linspace(1, 1/T, T) shifted) or "unipc_flow" (Wan2.1's
    #: UniPCMultistepScheduler flow sigmas)
    default_sigma_grid: str = "diffusers"
    #: the last non-zero sigma the pipeline's scheduler stretches its grid to (diffusers ``shift_terminal``), or None
    shift_terminal: float | None = None
    default_num_steps: int = 10
    default_eval_num_steps: int = 20
    #: samples per evaluation chunk when ``train.eval_batch`` is unset (memory against per-call overhead)
    default_eval_batch: int = 64
    #: samples per network call of a training rollout, and per decode and reward call, when
    #: ``algorithm.rollout_batch`` is unset (None: all of a process's samples at once). Adapters of large models set
    #: their released trainer's sampling batch, so that a GPU's share of a paper-scale batch fits its memory
    default_rollout_batch: int | None = None
    #: torch intra-op threads the runner uses when the config does not say (None: torch's default)
    preferred_threads: int | None = None
    #: whether an update evaluates all of a minibatch's trained (sample, step) pairs in one network call and one
    #: backward, and steps torch's fused AdamW (the tier's choice, not the user's): it pays where a call's fixed
    #: overhead outweighs its arithmetic (a small network) and the activations of every trained step fit at once;
    #: large models keep per-step calls. The same gradient and update to float rounding (tests/test_fused_update.py)
    fused_update: ClassVar[bool] = False
    #: whether the runner can shard this model's transformer(s) with FSDP2 (``models/sharding.py``): adapters
    #: built on transformer blocks say so and name the block lists in ``shard_blocks``
    shardable: ClassVar[bool] = False
    #: the attribute names of the transformer's block ``ModuleList``s that FSDP2 wraps one block at a time (None: every
    #: ``ModuleList`` attribute of the transformer whose name ends in ``blocks``)
    shard_blocks: ClassVar[tuple[str, ...] | None] = ()
    #: set by ``models.sharding.shard_model``: the transformer's parameters are DTensors sharded over the processes
    sharded: bool = False
    #: ``{constructor argument: Range or check(value, where)}``: the value ranges the config check enforces on
    #: ``model.args`` before the model is built (``flowzoo.ranges``; types come from the constructor's annotations)
    argument_ranges: ClassVar[dict[str, Any]] = {}
    #: ``flowzoo export``: the diffusers pipeline class whose ``save_lora_weights`` writes this adapter's LoRA (its
    #: file loads with that pipeline's ``load_lora_weights``); None: the model has no diffusers format and export
    #: refuses its runs. A ``DiffusersFlowModel`` defaults to its own ``pipeline_class``
    lora_format: ClassVar[str | None] = None
    #: ``flowzoo export`` of a full fine-tuning: the diffusers class whose ``from_pretrained`` loads the saved
    #: transformer (None: the model card says ``<transformer class>``)
    transformer_class: ClassVar[str | None] = None

    #: where the network runs; every tensor a rollout or an update computes with is created on it
    device: torch.device = torch.device("cpu")
    #: the network's compute dtype (a diffusers adapter's ``dtype`` argument: bf16 autocasts its transformer)
    dtype: torch.dtype = torch.float32

    @property
    def latent_dtype(self) -> torch.dtype:
        """The dtype of latents and trajectories: float32, or the network's dtype when that is wider (float64); a
        half-precision network's latents stay float32 and are cast per call (``predict``)."""
        return torch.promote_types(self.dtype, torch.float32)

    def __init__(self) -> None:
        self.nfe = 0

    # ---- to implement ---------------------------------------------------------------------------------------
    @property
    def latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def encode(self, prompts: Sequence[str], metadata: Sequence[dict] | None = None) -> Condition:
        raise NotImplementedError

    def null_condition(self, n: int) -> Condition:
        """The unconditional ("empty prompt") condition for CFG."""
        raise NotImplementedError

    def predict(self, x: torch.Tensor, sigma: torch.Tensor, cond: Condition) -> torch.Tensor:
        """One network evaluation without guidance: velocity for each sample of ``x`` at ``sigma`` [B]."""
        raise NotImplementedError

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    @contextlib.contextmanager
    def uncounted(self, active: bool = True) -> Iterator[None]:
        """Network evaluations inside this context are not counted in ``nfe`` when ``active``: the calls that train
        nothing (a sharded process's lockstep padding), which a run's NFE must not include."""
        nfe = self.nfe
        try:
            yield
        finally:
            if active:
                self.nfe = nfe

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Within this context ``predict`` uses the frozen reference policy (e.g. the LoRA adapter disabled)."""
        raise NotImplementedError
        yield  # pragma: no cover

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def fsdp_modules(self) -> list[torch.nn.Module]:
        """The modules FSDP2 shards (``shardable`` adapters: the transformer, and the frozen reference copy of a full
        fine-tuning); each holds the block lists ``shard_blocks`` names."""
        return []

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    @classmethod
    def export_load_hint(cls, full: bool, weights_name: str) -> str:
        """The model card's ``Load:`` line of a run exported by ``flowzoo export`` to ``DIR`` (``full``: a full
        fine-tuning's ``DIR/transformer``; else the LoRA file ``DIR/<weights_name>``)."""
        if full:
            return f'{cls.transformer_class or "<transformer class>"}.from_pretrained("DIR/transformer")'
        return f'{cls.lora_format}.from_pretrained(BASE).load_lora_weights("DIR")'

    def exported_transformers(self) -> dict[str, torch.nn.Module]:
        """``flowzoo export``: the trained transformers by the pipeline component each loads into (``transformer``;
        Wan2.2's two experts add ``transformer_2``). Only adapters with a ``lora_format`` are exported."""
        return {"transformer": self.transformer}

    #: the architecture's published facts the memory estimate reads (``models.footprint.Arch``), on adapters of one
    #: fixed architecture (sd3, flux, qwen_image; wan's default size); tiers sized by their arguments compute theirs
    architecture: ClassVar = None

    @classmethod
    def footprint(cls, args: dict) -> "Footprint":
        """What the memory estimate reads of this model at its arguments ``args`` (the config's ``model.args`` over the
        constructor's defaults): its architecture and one sample's sizes (``models.footprint``). An adapter without
        one cannot be estimated, and says so."""
        from flowzoo.errors import ConfigError

        raise ConfigError(f"model {cls.name!r} states no memory footprint (FlowModel.footprint), so its runs cannot "
                          "be estimated; pass --no-memory-check to launch without the estimate")

    # ---- shared ---------------------------------------------------------------------------------------------
    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Condition, guidance: float | None = None,
        cfg_grad: str = "cond", cfg_batch: str = "auto",
    ) -> torch.Tensor:
        """Guided velocity ``v_u + g * (v_c - v_u)``; ``g == 1`` makes a single conditional pass.

        ``cfg_grad`` says which branch carries the gradient when autograd is on (it changes nothing without it):

        * ``"cond"``: the unconditional branch is a constant, so d v = g d v_c, as released Flow-GRPO's
          ``compute_log_prob`` (yifan123/flow_grpo scripts/train_sd3.py:189-195 at ac4c86e, where
          ``noise_pred_uncond.detach()`` was added in 2d76907; note that later stored revisions of that file, e.g.
          74db691, and train_sd3_fast.py there, no longer detach). It runs as its own pass under ``no_grad``, which
          keeps no activations for it and back-propagates through B rows instead of 2 B.
          ``cfg_batch`` says how this form runs: ``split`` as just said (two transformer calls); ``batched`` as the
          released code, one call on 2 B rows with autograd and the unconditional half detached after it (one call
          fewer, but its backward and saved activations cover 2 B rows); ``auto`` asks ``split_cfg_pays()``.
          Both give the same velocity and gradient (to float rounding).
        * ``"both"``: both branches carry gradient, d v = g d v_c + (1 - g) d v_u, as DanceGRPO's released trainers
          that use CFG in training (XueZeyue/DanceGRPO fastvideo/train_grpo_sd.py:611-622,
          fastvideo/train_grpo_wan_2_1.py:238-248; its FLUX/HunyuanVideo trainers and MixGRPO's FLUX trainer use
          no CFG in training, only FLUX's guidance embedding).

        Without autograd (rollouts, evaluation) both run as one batched pass of 2 B rows.
        """
        if cfg_grad not in CFG_GRADS:
            raise ValueError(f"unknown cfg_grad {cfg_grad!r}; known: {', '.join(CFG_GRADS)}")
        if cfg_batch not in CFG_BATCHES:
            raise ValueError(f"unknown cfg_batch {cfg_batch!r}; known: {', '.join(CFG_BATCHES)}")
        g = self.default_guidance if guidance is None else float(guidance)
        batch = x.shape[0]
        if sigma.dim() == 0:
            sigma = sigma.expand(batch)
        self.nfe += self.cfg_factor(g) * batch
        if g == 1.0:
            return self.predict(x, sigma, cond)
        detach_uncond = cfg_grad == "cond" and torch.is_grad_enabled()
        split = cfg_batch == "split" or (cfg_batch == "auto" and self.split_cfg_pays())
        if detach_uncond and split:
            v_cond = self.predict(x, sigma, cond)
            with torch.no_grad():
                v_uncond = self.predict(x, sigma, self.unconditional(cond))
            return self.guide(v_cond, v_uncond, g)
        both = Condition.cat([cond, self.unconditional(cond)])
        v = self.predict(torch.cat([x, x]), torch.cat([sigma, sigma]), both)
        v_cond, v_uncond = v.chunk(2)
        if detach_uncond:
            v_uncond = v_uncond.detach()
        return self.guide(v_cond, v_uncond, g)

    def unconditional(self, cond: Condition) -> Condition:
        """CFG's unconditional branch of the batch ``cond``: ``null_condition`` of its size. An edit model
        overrides it to keep each row's source image there (its pipeline's negative branch sees the same image)."""
        return self.null_condition(len(cond))

    def guide(self, v_cond: torch.Tensor, v_uncond: torch.Tensor, guidance: float) -> torch.Tensor:
        """How the two CFG branches combine: ``v_u + g (v_c - v_u)``. An adapter whose pipeline rescales the result
        (Qwen-Image's norm-preserving CFG) overrides it."""
        return v_uncond + guidance * (v_cond - v_uncond)

    def split_cfg_pays(self) -> bool:
        """Whether ``cfg_batch: auto`` runs the detached unconditional branch as its own no_grad call: it saves the
        backward of B rows and their activations but costs one more call, which pays once a call's work outweighs
        its fixed overhead. Models too small for that (the default) batch; big adapters override."""
        return False

    def cfg_factor(self, guidance: float | None = None) -> int:
        """Network evaluations per sample of one ``velocity`` call: 2 with classifier-free guidance, else 1."""
        g = self.default_guidance if guidance is None else float(guidance)
        return 1 if g == 1.0 else 2

    def initial_noise(self, generators: Sequence[torch.Generator]) -> torch.Tensor:
        """One standard-normal latent per generator, so each sample's noise depends only on its own seed: drawn in
        float32 from the (CPU) generator, whatever the device and dtype, then put on the model's device in
        ``latent_dtype``."""
        noise = [torch.randn(self.latent_shape, generator=g, dtype=torch.float32) for g in generators]
        return torch.stack(noise).to(device=self.device, dtype=self.latent_dtype)
