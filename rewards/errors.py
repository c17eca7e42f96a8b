"""The error a reward raises when it cannot score (as opposed to ConfigError for a bad configuration)."""


class RewardError(RuntimeError):
    """A reward failed to score a batch. The message names the reward and the cause; it never becomes a silent 0."""
