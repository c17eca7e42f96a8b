"""The shared-vs-tuned verdict table (benchmark/study/recipe_compare.py) on hand-made claims files."""

import pandas as pd
import pytest

from flowzoo.benchmark.study.recipe_compare import compare, main, read_claims
from flowzoo.errors import ConfigError


def _claims(path, rows):
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"claim": c, "verdict exploration": e, "verdict replication": r, "replication": s}
                  for c, e, r, s in rows]).to_csv(path / "claims.csv", index=False)
    return path


def test_changed_same_and_unjudged_claims(tmp_path):
    shared = _claims(tmp_path / "shared", [
        ("A saves steps", "contradicted", "contradicted", "replicated: contradicted"),
        ("B saves steps", "reproduced", "reproduced", "replicated: reproduced"),
        ("C saves steps", "contradicted", "contradicted", "replicated: contradicted"),
        ("D saves steps", "reproduced", "inconclusive", "not replicated")])
    tuned = _claims(tmp_path / "tuned", [
        ("A saves steps", "reproduced", "reproduced", "replicated: reproduced"),
        ("B saves steps", "reproduced", "reproduced", "replicated: reproduced"),
        ("C saves steps", "not tested", "not tested", "not tested")])
    table = compare(read_claims(shared), read_claims(tuned))
    change = dict(zip(table["claim"], table["change"]))
    assert change == {"A saves steps": "changed", "B saves steps": "same", "C saves steps": "not judged",
                      "D saves steps": "not judged"}
    assert list(table["change"]) == ["changed", "same", "not judged", "not judged"]  # changes first
    out = tmp_path / "compare.md"
    assert main([str(shared), str(tuned), "--out", str(out)]) == 0
    text = out.read_text()
    assert "1 changed, 1 the same, 2 not judged" in text and "| changed | A saves steps |" in text


def test_a_folder_without_claims_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(ConfigError, match="cannot read"):
        read_claims(tmp_path)
    assert main([str(tmp_path), str(tmp_path), "--out", str(tmp_path / "x.md")]) == 2
    assert "flowzoo: error: recipe_compare: cannot read" in capsys.readouterr().err


def test_a_cut_claims_file_is_refused_not_read_as_a_changed_verdict(tmp_path):
    """A claims.csv cut mid-row read its last verdict short ("reproduc") or empty, a changed verdict; now refused."""
    path = _claims(tmp_path / "cut", [("A saves steps", "reproduced", "reproduced", "replicated: reproduced"),
                                      ("B saves steps", "contradicted", "contradicted", "replicated: contradicted")])
    data = (path / "claims.csv").read_bytes()
    (path / "claims.csv").write_bytes(data[:-12])  # mid "replicated: contradicted"
    with pytest.raises(ConfigError, match="its last line is cut mid-row"):
        read_claims(path)
    cut_at_comma = data[:data.rindex(b",") + 1] + b"\n"  # the last field empty, the line ended
    (path / "claims.csv").write_bytes(cut_at_comma)
    with pytest.raises(ConfigError, match="'replication' is empty"):
        read_claims(path)
