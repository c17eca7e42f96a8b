"""The error a reward raises when it cannot score (as opposed to ConfigError for a bad configuration)."""

from flowzoo.errors import FlowZooError


class RewardError(FlowZooError, RuntimeError):
    """A reward failed to score a batch. The message names the reward and the cause; it never becomes a silent 0."""


class NonFiniteSamplesError(FlowZooError, ValueError):
    """A reward was given samples holding NaN or inf: the model produced them (e.g. a diverged policy), so the
    reward is not called and not blamed. ``bad`` of ``total`` samples are not finite."""

    def __init__(self, reward: str, bad: int, total: int):
        super().__init__(f"the decoded samples given to reward {reward!r} are not finite ({bad} of {total}): the "
                         f"model produced them, the reward was not called")
        self.reward, self.bad, self.total = reward, bad, total
