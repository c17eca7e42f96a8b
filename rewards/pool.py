"""``RewardPool``: score batches in background threads, overlapping reward computation with other work.

The runner submits a batch as soon as it is decoded and collects the future later, e.g. after starting the next
rollout or while computing something else::

    with RewardPool(reward, retries=1) as pool:
        pending = pool.submit(samples, prompts, metadata)
        ...                              # other work
        output = pending.result()        # RewardOutput, or RewardError naming the reward and the cause

Safety: samples are detached and copied to CPU at submission, so the caller may reuse or modify its tensors.
With the default single worker a reward never runs concurrently with itself (model rewards need not be
thread-safe); more workers only help rewards that wait on I/O (``unifiedreward`` already parallelises its requests).
A failure is retried ``retries`` times, then raised as :class:`RewardError`; it never becomes a silent 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from flowzoo.rewards.base import Reward, RewardOutput
from flowzoo.rewards.errors import NonFiniteSamplesError, RewardError


class RewardPool:
    def __init__(self, reward: Reward, max_workers: int = 1, retries: int = 0, retry_wait_s: float = 0.0):
        if max_workers < 1 or retries < 0:
            raise ValueError(f"RewardPool: need max_workers >= 1 and retries >= 0, got {max_workers}, {retries}")
        self.reward = reward
        self.retries = retries
        self.retry_wait_s = retry_wait_s
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"reward-{reward.name}")

    def _score_with_retries(
        self, samples: torch.Tensor, prompts: list[str], metadata: list[dict] | None
    ) -> RewardOutput:
        for attempt in range(self.retries + 1):
            try:
                return self.reward(samples, prompts, metadata)
            except NonFiniteSamplesError:  # the model's fault, not the reward's: no retry, no blame
                raise
            except Exception as error:
                if attempt == self.retries:
                    tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                    raise RewardError(
                        f"reward {self.reward.name!r} failed after {tries}: {type(error).__name__}: {error}"
                    ) from error
                time.sleep(self.retry_wait_s * 2**attempt)
        raise AssertionError("unreachable")

    def submit(
        self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict] | None = None
    ) -> Future[RewardOutput]:
        """Start scoring a batch; ``.result()`` returns its RewardOutput or raises RewardError."""
        snapshot = samples.detach().to("cpu", copy=True)
        return self._executor.submit(
            self._score_with_retries, snapshot, list(prompts), None if metadata is None else list(metadata)
        )

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
