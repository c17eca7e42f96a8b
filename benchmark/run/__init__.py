"""Running: building an experiment from a resolved config (``experiment``, ``loading``), the training loop with its
checkpoints, trackers and memory check (``runner``, ``checkpoints``, ``tracking``, ``memory``), suites and where their
runs execute (``suite``, ``executors``), and the commands that read a trained run (``eval_command``, ``export_lora``,
``grad_snr``, ``memory_table``)."""
