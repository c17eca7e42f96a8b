"""The benchmark harness: configs, the training runner, suites, statistics and reports, and the CLI."""
