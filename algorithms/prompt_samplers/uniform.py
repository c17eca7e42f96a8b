"""The default sampler: a seeded shuffle of the pool per step (every prompt once before any twice), the draw every
run made before samplers existed (bit-identical)."""

from __future__ import annotations

from flowzoo.algorithms.prompt_samplers import register
from flowzoo.algorithms.prompt_samplers.base import PromptSampler


@register("uniform")
class Uniform(PromptSampler):
    """A seeded shuffle of the training prompts per step (the default)."""
