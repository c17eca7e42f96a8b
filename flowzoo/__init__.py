"""FlowZoo: a benchmark zoo for RL post-training of flow-matching models.

This small package holds what every other package shares and nothing else: the name registry,
the error type for bad user input and atomic file writes. The real work lives in the top-level
packages ``algorithms``, ``models``, ``rewards`` and ``benchmark``.
"""

__version__ = "0.1.0"
