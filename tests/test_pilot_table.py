"""flowzoo.benchmark.render.pilot_table: pilot runs named by their config's differences from a reference, with gains."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

from flowzoo.benchmark.render.pilot_table import main, pilot_rows, variant_summary
from flowzoo.benchmark.config.schema import resolved_dict
from flowzoo.benchmark.run.run_source import load_run
from flowzoo.errors import ConfigError

REFERENCE = "tiny-counting-study:tiny_counting_sparse/flow_grpo"  # the study's Flow-GRPO cell


def _run(root: Path, name: str, seed: int, overrides: list[str], evals: list[float], rewards: list[float]) -> None:
    run = root / name / f"s{seed}"
    run.mkdir(parents=True)
    config = resolved_dict(load_run(REFERENCE, [f"seed={seed}", *overrides])[0])
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"step": 0, "nfe": 0, "wall_s": 0.0, "eval_reward": evals[0]}]
    for step, reward in enumerate(rewards, start=1):
        rows.append({"step": step, "nfe": 10 * step, "wall_s": 2.0 * step, "reward_mean": reward,
                     "zero_std_frac": 0.5, "eval_reward": evals[step] if step < len(evals) else None})
    pd.DataFrame(rows).to_csv(run / "metrics.csv", index=False)


def test_rows_name_each_variant_by_its_differences_and_give_its_gain(tmp_path):
    _run(tmp_path, "a", 0, [], [0.1, 0.2, 0.3, 0.5], [0.1, 0.2, 0.3])
    _run(tmp_path, "b", 1, ["algorithm.lr=3e-3", "train.steps=300"], [0.1, 0.1, 0.0, 0.0], [0.2, 0.1, 0.0])
    _run(tmp_path, "b", 2, ["algorithm.lr=3e-3", "train.steps=300"], [0.2, 0.3, 0.3, 0.3], [0.2, 0.2, 0.2])
    rows = pilot_rows(tmp_path, REFERENCE, last=2)
    assert list(rows["variant"]) == ["(reference)", "algorithm.lr=0.003, train.steps=300",
                                     "algorithm.lr=0.003, train.steps=300"]
    reference = rows.iloc[0]
    assert reference["base"] == pytest.approx(0.1)
    assert reference["final"] == pytest.approx(0.4)  # mean of the last 2 evaluations after step 0
    assert reference["gain"] == pytest.approx(0.3)
    assert reference["s_per_step"] == pytest.approx(2.0)
    summary = variant_summary(rows).set_index("variant")
    lr = summary.loc["algorithm.lr=0.003, train.steps=300"]
    assert lr["seeds"] == "1 2" and lr["seeds_gaining"] == "1/2"
    assert lr["mean_gain"] == pytest.approx((-0.1 + 0.1) / 2)
    assert lr["min_gain"] == pytest.approx(-0.1) and lr["max_gain"] == pytest.approx(0.1)


def test_cli_writes_the_rows_and_names_bad_input(tmp_path, capsys):
    _run(tmp_path / "runs", "a", 0, [], [0.1, 0.2], [0.1])
    out = tmp_path / "rows.csv"
    assert main([str(tmp_path / "runs"), "--reference", str(REFERENCE), "--csv", str(out)]) == 0
    assert "(reference)" in capsys.readouterr().out
    assert pd.read_csv(out)["gain"].iloc[0] == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="--last must be a positive number of evaluations, got 0"):
        pilot_rows(tmp_path / "runs", REFERENCE, last=0)
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--reference", str(REFERENCE)]) == 2
    assert "no run directories" in capsys.readouterr().err


def test_differing_keys_names_nested_and_one_sided_keys():
    from flowzoo.schema import differing_keys

    a = {"algorithm": {"lr": 1e-3, "kl": 0.0}, "train": {"steps": 100}, "seed": 0}
    b = {"algorithm": {"lr": 3e-3, "kl": 0.0}, "train": {"steps": 100, "extra": 1}, "seed": 0}
    assert differing_keys(a, b) == ["algorithm.lr", "train.extra"]
    assert differing_keys(a, a) == []
    assert differing_keys({"x": {"y": 1}}, {"x": 2}) == ["x"]
