"""Performance: one Flow-GRPO iteration of ours against the released-style loop (``measure``, ``reference``,
``pipeline``, ``memory``), the GPU check (``gpu``), and the comparison of pytest-benchmark results with the committed
baseline (``compare``, ``baseline.json``). ``command`` is ``flowzoo perf``."""
