"""The smoothing of an evaluation curve, the one definition that both the tuner's objective
(``benchmark.tuning.tune``) and the studies' statistics (``benchmark.analysis.stats``) use."""

from __future__ import annotations

import numpy as np
import pandas as pd

from flowzoo.errors import ConfigError

#: evaluations in the trailing mean of a smoothed curve (the studies' "final reward": the mean of the last 3)
DEFAULT_SMOOTH = 3


def smooth_trailing(values, window: int = DEFAULT_SMOOTH) -> np.ndarray:
    """Trailing mean over the last ``window`` values (fewer at the start): out[i] = mean(values[max(0, i-w+1):i+1])."""
    if window < 1:
        raise ConfigError(f"smoothing window must be >= 1, got {window}")
    return pd.Series(np.asarray(values, dtype=float)).rolling(window, min_periods=1).mean().to_numpy()
