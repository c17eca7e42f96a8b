"""The wheel installs one import name, ``flowzoo``: the project's top-level folders become ``flowzoo.algorithms``,
``flowzoo.models``, ``flowzoo.rewards`` and ``flowzoo.benchmark`` (pyproject's package-dir), so an environment that
also holds another project's ``models`` or ``benchmark`` package imports both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("algorithms", "models", "rewards", "benchmark")


def test_pyproject_lists_every_package_folder_under_flowzoo():
    """A folder with an __init__.py that pyproject does not list would be missing from the wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"flowzoo"} | {
        "flowzoo." + ".".join(init.parent.relative_to(ROOT).parts)
        for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py") if "__pycache__" not in init.parts}
    assert set(setuptools["packages"]) == folders
    assert setuptools["package-dir"] == {"flowzoo": "flowzoo", **{f"flowzoo.{f}": f for f in FOLDERS}}


@pytest.mark.slow
def test_the_wheel_installs_beside_another_models_package(tmp_path):
    """Build the wheel, check it holds no top-level name but flowzoo, install it into a fresh virtual environment
    (its dependencies borrowed from this one's site-packages) beside a package named ``models``, and import both."""
    from importlib.metadata import version

    wheels = tmp_path / "wheels"
    # this environment's setuptools when it is recent enough for pyproject (>= 77), else an isolated build's
    isolation = [] if int(version("setuptools").split(".")[0]) < 77 else ["--no-build-isolation"]
    source = tmp_path / "source"  # built from a copy: an in-tree build would leave build/ in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("flowzoo", *FOLDERS):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *isolation, "-w",
                            str(wheels), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("flowzoo-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"flowzoo"}, tops
    assert "flowzoo/models/weights/tiny_shapes.safetensors" in names  # package data travels along
    assert "flowzoo/benchmark/suites/quick.yaml" in names

    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    # this environment's packages (torch, diffusers, ...) as the fresh one's dependencies: a path line, not a site
    # directory, so no .pth of this environment (such as its editable install of FlowZoo) runs there
    borrowed = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in borrowed))
    other = tmp_path / "other_project"
    (other / "models").mkdir(parents=True)
    (other / "models" / "__init__.py").write_text("OWNER = 'another project'\n")
    script = ("import models, flowzoo.models, flowzoo.benchmark.cli\n"
              "assert models.OWNER == 'another project', models.__file__\n"
              "assert flowzoo.models.__file__.startswith(%r), flowzoo.models.__file__\n"
              "print(','.join(flowzoo.models.names()))\n" % str(site))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(other), "HOME": str(tmp_path)}
    done = subprocess.run([str(python), "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "toy2d" in done.stdout.split(",") and "sd3" in done.stdout
    version = subprocess.run([str(env_dir / "bin" / "flowzoo"), "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert version.returncode == 0 and version.stdout.startswith("flowzoo "), version.stderr[-2000:]
