"""Property-based fuzzing of the pretrain, perf, eval and export command lines: random options (hostile numbers,
devices, paths with NUL bytes, files where directories belong, the shipped weights directory) either pass every check
or fail with one line and exit 2 (argparse's own refusals: exit 2 with the usage), never a traceback, and nothing is
ever written into the shipped weights. The expensive part after the checks (training, building models, evaluating)
is replaced by a sentinel, so each example costs milliseconds."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flowzoo.benchmark.cli import main  # noqa: E402

CONFIG = "benchmark/configs/toy_flow_grpo.yaml"


class Checked(Exception):
    """Raised where the real work would start: every check of the command passed."""


def _stop(*args, **kwargs):
    raise Checked


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """Scratch paths: a plain file, a directory, a garbage YAML, a copy of the shipped weights."""
    import flowzoo.models.tiny as tiny

    root = tmp_path_factory.mktemp("cli_fuzz")
    (root / "file.txt").write_text("not a directory")
    (root / "dir").mkdir()
    (root / "garbage.yaml").write_bytes(b"\x00\xff: [")
    shutil.copytree(tiny.WEIGHTS_DIR, root / "weights")
    return root


@pytest.fixture
def guarded(sandbox, monkeypatch):
    import flowzoo.models.tiny as tiny
    import flowzoo.models.tiny_pretrain as tiny_pretrain
    from flowzoo.benchmark.perf import command as perf_command, measure as perf, gpu as perf_gpu
    from flowzoo.benchmark.run.runner import Runner

    monkeypatch.setattr(tiny, "WEIGHTS_DIR", sandbox / "weights")
    monkeypatch.setattr(tiny_pretrain, "build_networks", _stop)
    monkeypatch.setattr(perf, "load_model", _stop)
    monkeypatch.setattr(perf_command, "load_model", _stop)  # `flowzoo perf` calls the name command.py bound at import
    monkeypatch.setattr(perf_gpu, "main", _stop)
    monkeypatch.setattr(Runner, "build", _stop)
    return sandbox


PATHS = st.sampled_from(["{root}/new", "{root}/file.txt", "{root}/dir", "{root}/weights", "{root}/weights/x",
                         "{root}/weights/tiny_glyphs.safetensors", "{root}/../{root}/dir/sub", "{root}/a\x00b",
                         "/dev/null", "", "{root}/missing/deeper/x"])
NUMBERS = st.sampled_from(["0", "-1", "1", "2", "1.5", "nan", "inf", "-inf", "1e308", "abc", "",
                           "99999999999999999999"])


def _options(draw, names: list[str], values) -> list[str]:
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    return [word for name in chosen for word in (name, draw(values))]


@st.composite
def pretrain_argv(draw):
    numbers = _options(draw, ["--steps", "--batch", "--lr", "--ema", "--seed", "--threads", "--minutes"], NUMBERS)
    paths = _options(draw, ["--run-dir", "--out"], PATHS)
    return ["pretrain", "tiny", "--quiet", *numbers, *paths]


@st.composite
def perf_argv(draw):
    numbers = _options(draw, ["--prompts", "--repeats", "--lora-rank"], NUMBERS)
    device = _options(draw, ["--device"], st.sampled_from(["cpu", "cuda", "cuda:7", "mps", "bogus", "", "cpu:0"]))
    overrides = draw(st.lists(st.sampled_from(["lr=1e-3", "lr=.nan", "x=[unclosed", "group_size=0", "minibatches=2",
                                               "=", "a.b=1", "clip_range=0"]), max_size=2))
    gpu = draw(st.sampled_from([[], ["--gpu-check"]]))
    return ["perf", *numbers, *device, *gpu, *overrides]


@st.composite
def eval_argv(draw):
    target = draw(st.sampled_from([CONFIG, "{root}/dir", "{root}/missing", "{root}/garbage.yaml", "/dev/null",
                                   "{root}/a\x00b", "{root}/weights"]))
    numbers = _options(draw, ["--steps", "--samples"], NUMBERS)
    out = _options(draw, ["--out"], PATHS)
    return ["eval", target, *numbers, *out]


@st.composite
def export_argv(draw):
    run = draw(st.sampled_from(["{root}/dir", "{root}/missing", "{root}/file.txt", "{root}/a\x00b", "{root}/weights"]))
    return ["export", run, "--out", draw(PATHS)]


def _digests(path) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(pretrain_argv(), perf_argv(), eval_argv(), export_argv()))
def test_command_lines_pass_their_checks_or_fail_with_one_line(guarded, capsys, argv):
    argv = [word.format(root=guarded) for word in argv]
    before = _digests(guarded / "weights")
    capsys.readouterr()
    threads = torch.get_num_threads()
    try:
        rc = main(argv)
    except Checked:
        rc = "checked"
    except SystemExit as exit_:  # argparse: a value of the wrong type, with the usage
        assert exit_.code == 2
        rc = "usage"
    finally:
        torch.set_num_threads(threads)  # pretrain sets its --threads before building
    err = capsys.readouterr().err.strip()
    event(f"{argv[0]}: {rc}")
    assert rc in ("checked", "usage", 2), (rc, err)
    if rc == 2:
        assert len(err.splitlines()) == 1 and err.startswith("flowzoo: error: "), err
    assert _digests(guarded / "weights") == before
