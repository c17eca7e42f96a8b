"""Entry point for tests/test_distributed.py: ``python -m flowzoo train`` with a fault injected into one rank.

``FLOWZOO_TEST_FAIL_RANK`` names the rank whose training step ``FLOWZOO_TEST_FAIL_STEP`` raises; the time of the fault
goes to ``FLOWZOO_TEST_FAIL_STAMP`` so the test can measure how long the other ranks take to end.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowzoo.algorithms.engine.base import Algorithm  # noqa: E402
from flowzoo.benchmark.cli import main  # noqa: E402

_step = Algorithm.step
_calls = {"n": 0}


def _faulty_step(self, *args, **kwargs):
    _calls["n"] += 1
    if self.dist.rank == int(os.environ["FLOWZOO_TEST_FAIL_RANK"]) and _calls["n"] == int(
            os.environ["FLOWZOO_TEST_FAIL_STEP"]):
        Path(os.environ["FLOWZOO_TEST_FAIL_STAMP"]).write_text(repr(time.time()))
        raise RuntimeError("injected fault in the training step")
    return _step(self, *args, **kwargs)


Algorithm.step = _faulty_step

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
