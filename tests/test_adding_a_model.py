"""Adding a model is one file (docs/adding-a-model.md): the doc's example adapter, ``docs/examples/gmm2d.py``,
registers itself on import, its declared argument ranges are checked by the config loader, it trains through
``flowzoo train`` on the toy tier in the direction the reward asks for, and dropped into ``models/`` of a copy of the
project (nothing else changed) it is listed and trains there too. Per-adapter facts are class attributes, never
tables keyed by model name."""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from flowzoo import models
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.loading import build_config
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "gmm2d.py"
DOC = ROOT / "docs" / "adding-a-model.md"
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
FAST = ["model.name=gmm2d", "train.steps=4", "train.prompts_per_step=4", "train.eval_every=2",
        "train.eval_samples_per_prompt=16", "train.save_samples=false", "algorithm.group_size=8", "algorithm.lr=0.05"]


@pytest.fixture(scope="module")
def example():
    """docs/examples/gmm2d.py imported as it is (it registers itself), unregistered afterwards."""
    spec = importlib.util.spec_from_file_location("gmm2d_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    models.REGISTRY._entries.pop("gmm2d", None)
    sys.modules.pop(spec.name, None)


def test_the_doc_shows_the_whole_example_file():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks and blocks[0] == EXAMPLE.read_text()


def test_every_model_module_registers_itself():
    """The package imports each of its modules: every adapter class defined in one is registered under its name."""
    import pkgutil

    from flowzoo.models.base import FlowModel

    defined = set()
    for info in pkgutil.iter_modules(models.__path__):
        module = sys.modules[f"flowzoo.models.{info.name}"]  # imported by `import models`, not by this test
        defined |= {value for value in vars(module).values() if isinstance(value, type) and issubclass(value, FlowModel)
                    and value.__module__ == module.__name__ and "name" in vars(value) and value is not FlowModel}
    assert {cls for cls in map(models.get, models.names()) if cls.__module__.startswith("flowzoo.models.")} == defined
    assert models.names() == sorted(models.names()) and {"toy2d", "tiny", "sd3"} <= set(models.names())
    with pytest.raises(ConfigError, match=r"unknown model 'nope'; known: .*toy2d"):
        models.get("nope")


def test_no_table_keyed_by_model_name_outside_the_adapters():
    """The facts a caller needs about a model are asked of its class: no module of the harness spells an adapter's
    name as a dict key (export's pipeline classes, argument ranges, ...)."""
    names = "|".join(n for n in models.names())
    key = re.compile(rf"""[{{,(]\s*\(?\s*(?:"model",\s*)?["']({names})["']\s*\)?\s*:""")
    offenders = []
    for package in ("benchmark", "algorithms", "rewards", "flowzoo"):
        for path in (ROOT / package).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if key.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    offenders = [o for o in offenders if not o.startswith("benchmark/perf/")]  # the GPU checks' own model sets
    assert not offenders, "a per-model fact belongs on the adapter class (docs/adding-a-model.md):\n" + "\n".join(
        offenders)


def test_per_adapter_facts_are_class_attributes():
    from flowzoo.benchmark.run.export_lora import exportable

    assert models.get("toy2d").lora_format is None and models.get("toy2d").transformer_class is None
    assert models.get("sd3").lora_format == models.get("sd3").pipeline_class == "StableDiffusion3Pipeline"
    assert models.get("tiny").lora_format == "StableDiffusion3Pipeline"  # an SD3 transformer without a pipeline
    assert models.get("flux").transformer_class == "FluxTransformer2DModel"
    assert exportable() == ["flux", "flux_kontext", "qwen_image", "qwen_image_edit", "sd3", "tiny", "tiny_edit", "wan",
                            "wan22"]
    assert 'transformer.load_lora_adapter("DIR"' in models.get("tiny").export_load_hint(False, "w.safetensors")
    assert models.get("wan").export_load_hint(True, "w") == 'WanTransformer3DModel.from_pretrained("DIR/transformer")'
    with pytest.raises(ConfigError, match=r"model.args.hidden must be >= 1, got 0"):
        build_config({"model": {"name": "toy2d", "args": {"hidden": 0}}})
    with pytest.raises(ConfigError, match=r"model.args.lora_rank must be >= 1, got 0"):
        build_config({"model": {"name": "flux", "args": {"lora_rank": 0}}, "reward": "jpeg_compressibility",
                      "prompts": {"source": "files", "train": "a.txt", "test": "a.txt"}})


def test_the_example_registers_and_its_ranges_are_checked(example):
    assert "gmm2d" in models.names() and models.get("gmm2d") is example.GaussianMixtureFlow
    assert example.GaussianMixtureFlow.name == "gmm2d"  # set by @register
    config = build_config({"model": {"name": "gmm2d", "args": {"std": 0.3}}})
    assert config.model.args == {"std": 0.3}
    with pytest.raises(ConfigError, match=r"model.args.std must be in \[0.01, 1\], got 5"):
        build_config({"model": {"name": "gmm2d", "args": {"std": 5}}})
    with pytest.raises(ConfigError, match=r"model 'gmm2d': unknown argument 'hidden'; valid: std, majority"):
        build_config({"model": {"name": "gmm2d", "args": {"hidden": 8}}})


def test_the_example_is_the_exact_flow_of_its_mixture(example):
    """ODE samples of the untrained model land in class 1's modes at its weights 0.8 / 0.2."""
    from flowzoo.algorithms.engine.sde import sigma_schedule

    model = models.get("gmm2d")()
    n, sigmas = 2000, sigma_schedule(40, 1.0)
    x = model.initial_noise([torch.Generator().manual_seed(i) for i in range(n)])
    cond = model.encode(["class 1"] * n)
    with torch.no_grad():
        for a, b in zip(sigmas[:-1], sigmas[1:]):
            x = x + model.velocity(x, a.expand(n), cond) * (b - a)
    mode = torch.round(torch.atan2(x[:, 1], x[:, 0]) % (2 * math.pi) / (math.pi / 4)).long() % 8
    share = torch.bincount(mode, minlength=8).float() / n
    assert share[2] == pytest.approx(0.8, abs=0.03) and share[3] == pytest.approx(0.2, abs=0.03)
    assert x.norm(dim=1).mean() == pytest.approx(2.0, abs=0.05)


def test_the_example_trains_through_the_cli_toward_the_reward(example, tmp_path, capsys):
    """`flowzoo train` of the toy config with model.name=gmm2d: toy_mode rewards the minority mode, and a few
    Flow-GRPO steps raise every class's minority weight from 0.2; export refuses the run (no lora_format)."""
    run = tmp_path / "run"
    assert main(["train", str(CONFIG), *FAST, f"run_dir={run}", "--quiet"]) == 0
    metrics = pd.read_csv(run / "metrics.csv")
    trained = metrics[metrics["step"] > 0]
    assert trained["step"].tolist() == [1, 2, 3, 4] and all(math.isfinite(v) for v in trained["loss"])
    assert (trained["nfe_sampling"] == 4 * 8 * 10).all()  # 4 prompts x G 8 x T 10 (the class's default), no CFG
    state = torch.load(run / "checkpoint.pt", weights_only=False)["algorithm"]["model"]
    minority = torch.softmax(state["logits"], dim=-1)[:, 1]
    assert (minority > 0.22).all(), minority
    evals = metrics["eval_reward"].dropna().tolist()
    assert evals[-1] > evals[0]
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "lora")]) == 2
    err = capsys.readouterr().err.strip()
    assert "'gmm2d' run" in err and "export takes runs of flux, flux_kontext, qwen_image, qwen_image_edit, sd3, tiny, tiny_edit, wan, wan22" in err


def test_the_example_is_one_file_in_a_copy_of_the_zoo(tmp_path):
    """docs/examples/gmm2d.py dropped into ``models/`` of a copy of the project, nothing else changed: it is listed
    and trains through the CLI."""
    copy = tmp_path / "zoo"
    copy.mkdir()
    for part in ("algorithms", "rewards", "benchmark", "flowzoo"):
        (copy / part).symlink_to(ROOT / part)
    (copy / "models").mkdir()
    for path in (ROOT / "models").iterdir():
        if path.name != "__pycache__":
            (copy / "models" / path.name).symlink_to(path)
    (copy / "models" / EXAMPLE.name).write_text(EXAMPLE.read_text())
    script = f"""
from flowzoo import models
from flowzoo.benchmark.cli import main
assert models.get("gmm2d").name == "gmm2d" and models.get("gmm2d").__module__ == "flowzoo.models.gmm2d"
code = main(["train", {str(CONFIG)!r}, *{FAST!r}, "train.steps=2", "run_dir=run", "--quiet"])
if code == 0:
    print("--- flowzoo list ---", flush=True)
    code = main(["list"])
raise SystemExit(code)
"""
    env = {"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (copy / "run" / "done.json").is_file()
    listed = proc.stdout.split("--- flowzoo list ---", 1)[1]
    assert re.search(r"^\s+gmm2d\s+Exact flow of a per-class 2-D Gaussian mixture", listed, flags=re.M), listed
