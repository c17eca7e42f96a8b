"""Flow-GRPO (Liu et al., 2025): on-policy GRPO on the flow model's SDE.

Every sampling step is stochastic (``flow_grpo`` kernel, a = 0.7), the first int(T * 0.99) steps are trained (all but
the last of 10), KL to the reference with beta 0.04 (0.01 for preference rewards). This is exactly the base
class's template; it is its own class so that it has a name and a place for future Flow-GRPO-only options.
"""

from __future__ import annotations

from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import Algorithm


@register("flow_grpo")
class FlowGRPO(Algorithm):
    """The base template, registered as ``flow_grpo`` (see the module docstring)."""

    label, colormap = "Flow-GRPO", "Blues"  # the report's name and colours of this family
    logs_clip_sides = True  # clip_frac_pos_adv / clip_frac_neg_adv (GRPO-Guard, which subclasses it, too)
    diagnostics = {
        "clip_frac_pos_adv": "fraction of positive-advantage trained pairs whose clip binds (ratio > 1 + clip_range)",
        "clip_frac_neg_adv": "fraction of negative-advantage trained pairs whose clip binds (ratio < 1 - clip_range)",
    }
