"""Running experiments: the config schema and its loading (``config``, ``loading``), the dry-run checks and the
built experiment (``experiment``), the training loop (``runner``: evaluation, checkpoints, resume, logging),
suites and their executors, prompt sources, recipes, trackers, and the tools that read a trained run (``eval_cmd``,
``export``, ``grad_snr``). Imports only ``algorithms``, ``models``, ``rewards`` and ``flowzoo``."""
