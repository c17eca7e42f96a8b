"""Hostile inputs: each case here once lost data, ran on silently with a wrong result, or wrote files before failing.

Every case must end in one line (a FlowZooError, exit 2 from the CLI) or do the right thing, and must not touch the
shipped weights or leave a run directory behind when the config is refused.
"""

from __future__ import annotations

import hashlib
import math
import shutil

import pytest
import torch

from benchmark.cli import main
from flowzoo.errors import ConfigError, FlowZooError


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- data loss: pretrain never replaces the shipped weights by default ------------------------------------------
@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """The shipped glyph weights copied into a scratch weights directory that stands in for models/weights/ (so a
    regression overwrites the copy, never the real file)."""
    import models.tiny as tiny

    weights = tmp_path / "weights"
    weights.mkdir()
    for name in ("tiny_glyphs.safetensors", "tiny_shapes.safetensors"):
        shutil.copy(tiny.WEIGHTS_DIR / name, weights / name)
    monkeypatch.setattr(tiny, "WEIGHTS_DIR", weights)
    return weights / "tiny_glyphs.safetensors"


PRETRAIN = ["pretrain", "tiny", "--data", "glyphs", "--batch", "2", "--threads", "1", "--quiet"]


def test_pretrain_zero_minutes_writes_under_its_run_dir_not_over_the_shipped_weights(tmp_path, shipped_copy, capsys):
    before = _digest(shipped_copy)
    run_dir = tmp_path / "pre"
    assert main([*PRETRAIN, "--minutes", "0", "--run-dir", str(run_dir)]) == 0
    assert _digest(shipped_copy) == before
    assert (run_dir / "tiny_glyphs.safetensors").is_file()
    assert str(run_dir / "tiny_glyphs.safetensors") in capsys.readouterr().out


def test_pretrain_refuses_untrained_weights_over_a_named_shipped_file(tmp_path, shipped_copy, capsys):
    before = _digest(shipped_copy)
    rc = main([*PRETRAIN, "--minutes", "0", "--out", str(shipped_copy), "--run-dir", str(tmp_path / "pre")])
    err = capsys.readouterr().err
    assert rc == 2 and "trains nothing" in err and len(err.strip().splitlines()) == 1
    assert _digest(shipped_copy) == before


def test_pretrain_rejects_nan_minutes(tmp_path, shipped_copy, capsys):
    assert main([*PRETRAIN, "--minutes", "nan", "--run-dir", str(tmp_path / "pre")]) == 2
    assert "minutes must be a finite number" in capsys.readouterr().err
    assert not (tmp_path / "pre").exists()
