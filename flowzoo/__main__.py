"""``python -m flowzoo``: the ``flowzoo`` command line (flowzoo/benchmark/cli.py)."""

import sys

from flowzoo.benchmark.cli import main

sys.exit(main())
