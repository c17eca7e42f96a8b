"""Running the GPU check on a machine without a package registry: the wheels carried beside the checkout (diffusers,
which such a machine's image lacks) are installed offline into a temporary folder put first on ``sys.path``; the
checkout itself needs no install (``flowzoo/__init__.py`` finds its subpackages beside ``flowzoo/`` when
``python -m flowzoo`` runs from the repository root)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

from flowzoo.errors import ConfigError


def install_wheels(directory: str, target: str | None = None) -> str:
    """``pip install --no-index --no-deps --target`` of every ``*.whl`` in ``directory`` (nothing is fetched);
    returns the folder, now first on ``sys.path``."""
    wheels = sorted(str(p) for p in Path(directory).glob("*.whl"))
    if not wheels:
        raise ConfigError(f"perf --wheels: no *.whl in {directory!r} (carry e.g. diffusers-0.42.1-py3-none-any.whl)")
    target = target or tempfile.mkdtemp(prefix="flowzoo-wheels-")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--no-compile", "--target", target, *wheels], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(f"perf --wheels: pip could not install {', '.join(Path(w).name for w in wheels)} offline: "
                          f"{last[-1] if last else 'exit ' + str(done.returncode)}")
    sys.path.insert(0, target)
    importlib.invalidate_caches()
    return target
