"""The error a reward raises when it cannot score (as opposed to ConfigError for a bad configuration)."""

from flowzoo.errors import FlowZooError


class RewardError(FlowZooError, RuntimeError):
    """A reward failed to score a batch. The message names the reward and the cause; it never becomes a silent 0."""
