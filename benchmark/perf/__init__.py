"""Performance: one Flow-GRPO iteration of ours against the released-style loop (``measure``, ``reference``,
``pipeline``, ``memory``), the GPU check (``gpu``, ``gpu_large``; its plan, budget and skip rules ``gpu_plan``, the
paired timing against the released updates ``paired``, offline wheels ``offline``), and the comparison of
pytest-benchmark results with the committed baseline (``compare``, ``baseline.json``). ``command`` is
``flowzoo perf``."""
