"""What one training iteration reports: :class:`StepStats` (a metrics.csv row), the columns the template writes
itself (``RESERVED_COLUMNS``, which ``Algorithm.log`` refuses) and the names of the diagnostics the update logs."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field


#: the largest |log pi_theta - log pi_old| over the on-policy (sample, step) pairs of an update's first optimizer
#: step: 0 up to rounding when the update recomputes what the rollout sampled; precision (bf16/fp16 rollouts against
#: a float32 recompute) or a nondeterministic kernel makes it grow, and the first PPO ratio is then not 1
ONPOLICY_DRIFT = "onpolicy_max_abs_log_ratio"
#: a sharded run's update logs the network calls its processes made only to stay in lockstep (models/sharding.py)
FSDP_PADDING = "fsdp_padding_calls"
#: the PPO clip fractions of the on- and off-policy samples, which ``update`` logs when a batch holds off-policy ones
CLIP_FRAC_ON, CLIP_FRAC_OFF = "clip_frac_on", "clip_frac_off"
#: the fractions of positive- and negative-advantage pairs whose PPO clip binds (``losses.binding_clips``), which
#: ``update`` logs for a class with ``logs_clip_sides``
CLIP_FRAC_POS, CLIP_FRAC_NEG = "clip_frac_pos_adv", "clip_frac_neg_adv"


@dataclass
class StepStats:
    """What one training iteration reports; ``row()`` flattens it into a metrics.csv row. ``extra`` holds the
    iteration's values recorded with :meth:`Algorithm.log`."""

    reward_mean: float
    reward_std: float
    clip_frac: float
    approx_kl: float
    kl: float
    ratio_mean: float
    loss: float
    grad_norm: float
    nfe_sampling: int
    nfe_training: int
    t_sampling: float
    t_reward: float
    t_training: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def nfe(self) -> int:
        return self.nfe_sampling + self.nfe_training

    def row(self) -> dict[str, float]:
        values = asdict(self)
        extra = values.pop("extra")
        values["nfe_step"] = self.nfe
        values.update(extra)
        return values


#: metrics.csv columns the template writes; ``Algorithm.log`` refuses them (the contract's columns and StepStats')
RESERVED_COLUMNS = frozenset(f.name for f in dataclasses.fields(StepStats) if f.name != "extra") | {
    "nfe_step", "step", "nfe", "wall_s", "eval_reward", "t_eval"}
