"""FlowZoo: a benchmark zoo for RL post-training of flow-matching models.

Every import name of the project lives under ``flowzoo``: the project's top-level folders ``algorithms/``,
``models/``, ``rewards/`` and ``benchmark/`` are the subpackages ``flowzoo.algorithms``, ``flowzoo.models``,
``flowzoo.rewards`` and ``flowzoo.benchmark`` (pyproject's ``package-dir`` puts them inside ``flowzoo/`` in the wheel),
so installing FlowZoo never shadows another project's ``models`` or ``benchmark``. The modules of this folder hold
what every other package shares and nothing else: the name registry, the error type for bad user input, atomic file
writes, the ``task@variant`` names.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

#: the source checkout's root when this package runs from one (the folders sit beside ``flowzoo/``, not inside it):
#: the subpackages are then found there, whether FlowZoo is installed editable or only on ``PYTHONPATH``
_HERE = _Path(__file__).absolute().parent  # not resolved: a copy of the checkout that links this folder is its own
_CHECKOUT = _HERE.parent
if not (_HERE / "benchmark").is_dir() and any(
        (_CHECKOUT / part / "__init__.py").is_file() for part in ("algorithms", "models", "rewards", "benchmark")):
    __path__.append(str(_CHECKOUT))  # noqa: F821 (a package's __path__)
