"""A custom tracker ``fake`` (registered as accelerate's ``register_tracker_class`` does), which appends one line per
call and the process's RANK to ``<logging_dir>/fake.log``. tests/test_trackers_distributed.py registers it and forks
the 2 ranks of its run; ``python tests/tracked_launch.py train ...`` is the CLI with it registered (for a launcher)."""

import os
import sys

from accelerate import tracking

import flowzoo.benchmark.run.tracking
from flowzoo.benchmark.cli import main


class FakeTracker(tracking.GeneralTracker):
    name, requires_logging_directory, main_process_only = "fake", True, False

    def __init__(self, run_name, logging_dir):
        super().__init__()
        os.makedirs(logging_dir, exist_ok=True)
        self.path = os.path.join(logging_dir, "fake.log")

    @property
    def tracker(self):
        return self

    def _write(self, text):
        with open(self.path, "a") as f:
            f.write(f"{text} rank={os.environ.get('RANK')}\n")

    def store_init_configuration(self, values):
        self._write("config")

    def log(self, values, step, **kwargs):
        self._write(f"log {step}")

    def finish(self):
        self._write("finish")


if __name__ == "__main__":
    tracking.LOGGER_TYPE_TO_CLASS["fake"] = FakeTracker
    flowzoo.benchmark.run.tracking.check_trackers = lambda names: None  # "fake" is no accelerate LoggerType
    sys.exit(main(sys.argv[1:]))
