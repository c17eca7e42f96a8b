"""Value ranges of constructor arguments (``model.args``, ``reward_args``) that the config check enforces.

A model or reward class declares its own as ``argument_ranges = {"argument": Range(...) or check(value, where)}``;
``benchmark.config.argument_ranges.check_ranges`` applies them to a config's arguments before anything is
built, so a bad value is one line naming ``model.args.<name>``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """An interval of numbers: ``low``/``high`` (None: unbounded), each end closed unless ``*_open``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return False
        return True

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


AT_LEAST_1 = Range(1)  # sizes and counts
NON_NEGATIVE = Range(0)  # step counts, seeds, retries, waits, paddings
POSITIVE = Range(0, low_open=True)  # scales, alphas, timeouts
FRACTION = Range(0, 1)
