"""Finished runs written by hand for the analysis tests: the two files `flowzoo study` and `flowzoo report` read of a
run (config.yaml naming its task, seed, algorithm and step budget; metrics.csv with the evaluation curve)."""

from pathlib import Path

import numpy as np
import pandas as pd
import yaml


def write_run(root: Path, task: str, algorithm: str, seed: int, steps, rewards, extra: dict | None = None) -> Path:
    """``root/task/algorithm/s<seed>``, the bench's layout, with ``eval_reward`` = ``rewards`` at ``steps`` (10 NFE
    and 0.5 s a step) and the columns of ``extra``; returns its metrics.csv."""
    run = Path(root) / task / algorithm / f"s{seed}"
    run.mkdir(parents=True)
    run.joinpath("config.yaml").write_text(yaml.safe_dump(
        {"task": task, "seed": seed, "algorithm": {"name": algorithm}, "train": {"steps": int(steps[-1])}}))
    frame = pd.DataFrame({"step": steps, "nfe": np.asarray(steps) * 10, "wall_s": np.asarray(steps) * 0.5,
                          "eval_reward": rewards, **(extra or {})})
    frame.to_csv(run / "metrics.csv", index=False)
    return run / "metrics.csv"
