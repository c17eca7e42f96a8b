"""How many files a new reward and a new study touch (docs/architecture.md, "Touch counts"), checked in a copy of
the tree: the copy links every file of the checkout, the new files are written into it, and the copy then differs
from the checkout in exactly those files. A new algorithm and a new model are checked the same way by
``tests/test_algorithm_api.py`` and ``tests/test_adding_a_model.py`` (one file each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("algorithms", "models", "rewards", "benchmark", "flowzoo")

#: a reward of the toy tier written for this test: the negative distance to the prompt's minority mode
REWARD = '''"""Dense toy reward: minus the distance to the class's minority mode."""

import torch

from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput


@register("toy_negative_distance")
class ToyNegativeDistance(Reward):
    """Minus the Euclidean distance to the prompt's minority mode."""

    accepts = ("points",)

    def score(self, samples, prompts, metadata) -> RewardOutput:
        target = torch.tensor([m["mode_target"] for m in metadata], dtype=torch.float32, device=samples.device)
        return RewardOutput(-((samples.float() - target) ** 2).sum(dim=1).sqrt())
'''


def linked_copy(tmp_path: Path) -> Path:
    """A copy of the checkout's code folders in which every file is a link to the checkout's (nothing is copied, so
    a file written into the copy is the only file that differs)."""
    copy = tmp_path / "zoo"
    for part in PARTS:
        for folder, dirs, files in os.walk(ROOT / part):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            target = copy / Path(folder).relative_to(ROOT)
            target.mkdir(parents=True, exist_ok=True)
            for name in files:
                (target / name).symlink_to(Path(folder) / name)
    return copy


def touched(copy: Path) -> list[str]:
    """The files of the copy that are not links to the checkout: what the change touched."""
    return sorted(p.relative_to(copy).as_posix() for part in PARTS for p in (copy / part).rglob("*")
                  if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts)


def run_in(copy: Path, tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", script], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_new_reward_is_one_file(tmp_path):
    copy = linked_copy(tmp_path)
    (copy / "rewards" / "toy_negative_distance.py").write_text(REWARD)
    assert touched(copy) == ["rewards/toy_negative_distance.py"]
    config = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
    script = f"""
from flowzoo import rewards
from flowzoo.benchmark.cli import main
assert rewards.get("toy_negative_distance").__module__ == "flowzoo.rewards.toy_negative_distance"
code = main(["train", {str(config)!r}, "reward=toy_negative_distance", "train.steps=2", "train.eval_every=2",
             "train.eval_samples_per_prompt=4", "train.save_samples=false", "model.args.pretrain_steps=50",
             "run_dir=run", "--quiet"])
if code == 0:
    print("--- flowzoo list ---", flush=True)
    code = main(["list"])
raise SystemExit(code)
"""
    proc = run_in(copy, tmp_path, script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (copy / "run" / "done.json").is_file()
    listed = proc.stdout.split("--- flowzoo list ---", 1)[1]
    assert "toy_negative_distance" in listed and "Minus the Euclidean distance" in listed, listed


def test_a_new_study_is_two_files_its_suite_and_its_claim_set(tmp_path):
    copy = linked_copy(tmp_path)
    suite = (ROOT / "docs" / "examples" / "mix-grpo-flash-study.yaml").read_text()
    (copy / "benchmark" / "suites" / "mix-grpo-flash-study.yaml").write_text(suite)
    claims = (ROOT / "docs" / "examples" / "example_claim_set.py").read_text()
    (copy / "benchmark" / "study" / "claim_sets" / "example_claim_set.py").write_text(claims)
    assert touched(copy) == ["benchmark/study/claim_sets/example_claim_set.py",
                             "benchmark/suites/mix-grpo-flash-study.yaml"]
    script = """
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.suite import load_suite
from flowzoo.benchmark.study import claims
suite = load_suite("mix-grpo-flash-study")
assert suite.claims == "example-mix-grpo-flash" and suite.claims in claims.names(), suite.claims
raise SystemExit(main(["list"]))
"""
    proc = run_in(copy, tmp_path, script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mix-grpo-flash-study" in proc.stdout and "example-mix-grpo-flash" in proc.stdout, proc.stdout


def test_the_touch_check_sees_an_edited_file(tmp_path):
    """An edit of an existing file in the copy (the case these counts exclude) is counted: the check can fail."""
    copy = linked_copy(tmp_path)
    init = copy / "rewards" / "__init__.py"
    text = init.read_text()
    init.unlink()
    init.write_text(text + "\n# edited\n")
    assert touched(copy) == ["rewards/__init__.py"]
