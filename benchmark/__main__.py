import sys

from flowzoo.benchmark.cli import main

sys.exit(main())
