"""``make perf``'s regression step (benchmark/perf/compare.py): ratios from pytest-benchmark JSON, a rise above 15%
fails, a missing benchmark fails, a file that is not such JSON is one error line."""

import json

from flowzoo.benchmark.perf import compare as perf_compare


def _write(path, ratios):
    path.write_text(json.dumps({"benchmarks": [{"name": n, "extra_info": {"ratio": r}} for n, r in ratios.items()]}))
    return str(path)


def test_regression_over_the_tolerance_fails(tmp_path, capsys):
    base = _write(tmp_path / "base.json", {"a": 0.80, "b": 1.00})
    assert perf_compare.main([base, _write(tmp_path / "ok.json", {"a": 0.91, "b": 0.70})]) == 0  # +13.7%, faster
    assert "+13.7%" in capsys.readouterr().out
    assert perf_compare.main([base, _write(tmp_path / "bad.json", {"a": 0.94, "b": 1.0})]) == 1  # +17.5%
    assert "a: ratio 0.940 vs baseline 0.800 (+17.5%)  REGRESSION" in capsys.readouterr().out
    assert perf_compare.main([base, _write(tmp_path / "less.json", {"a": 0.8})]) == 1
    assert "b: missing" in capsys.readouterr().out


def test_unreadable_json_is_one_error_line(tmp_path, capsys):
    (tmp_path / "x.json").write_text("{}")
    base = _write(tmp_path / "base.json", {"a": 1.0})
    assert perf_compare.main([base, str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "x.json" in err and "KeyError" in err


def test_committed_baseline_is_readable():
    ratios = perf_compare.ratios("benchmark/perf/baseline.json")
    assert set(ratios) == {f"test_bench_perf_pair[{v}]" for v in ("defaults", "recompute", "released_two_steps")} | {
        f"test_bench_tier_step_pair[{tier}]" for tier in ("toy", "tiny")}
    assert all(0 < r < 5 for r in ratios.values())
