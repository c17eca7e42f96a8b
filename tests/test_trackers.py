"""TensorBoard, Weights & Biases (offline) and MLflow (local file store), each read back from what it wrote: every
logged series equals ``metrics.csv``, every evaluation's sample grid is logged as an image with its prompts as the
caption, and a literal key given in the config and on the command line reaches no file of any tracker.

The trackers are the optional extra ``.[trackers]``; a test whose tracker is not installed is skipped with the
reason. One run on the tiny text-to-image tier (images with prompts) scored by the fake judge of
``tests/test_secrets.py`` logs to every installed tracker at once.
"""

import io
import json
import math
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from flowzoo.benchmark.cli import main
from tests.test_secrets import LITERAL_KEY, Judge, hits, write_config

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
STEPS = 4  # evaluations at 0, 2 and 4 (TRAIN of tests/test_secrets.py)


def installed() -> list[str]:
    import importlib.util

    return [name for name, package in TRACKERS.items() if importlib.util.find_spec(package) is not None]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One run logging to every installed tracker, with a literal key in its config and on its command line."""
    names = installed()
    if not names:
        pytest.skip("no tracker installed (pip install -e '.[trackers]')")
    tmp = tmp_path_factory.mktemp("tracked")
    judge = Judge()
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        config = write_config(tmp / "c.yaml", judge.base_url, {"api_key": LITERAL_KEY}, trackers=names)
        run_dir = tmp / "run"
        code = main(["train", str(config), f"reward_args.unifiedreward.api_key={LITERAL_KEY}", f"run_dir={run_dir}",
                     "--quiet"])
    finally:
        mp.undo()
        judge.httpd.shutdown()
        judge.httpd.server_close()
    assert code == 0
    return run_dir


def metrics_series(run_dir: Path) -> dict[str, dict[int, float]]:
    """{column: {step: value}} of every numeric metrics.csv value that is not NaN (what Trackers.log sends)."""
    frame = pd.read_csv(run_dir / "metrics.csv")
    series = {}
    for column in frame.columns:
        if column == "step":
            continue
        values = {int(s): float(v) for s, v in zip(frame["step"], frame[column]) if not math.isnan(float(v))}
        if values:
            series[column] = values
    return series


def grids(run_dir: Path) -> dict[int, tuple[np.ndarray, list[str]]]:
    """{step: (pixels, prompts)} of the run's sample grids and their sidecars."""
    out = {}
    for path in (run_dir / "samples").glob("step_*.png"):
        step = int(path.stem.split("_")[1])
        prompts = json.loads(path.with_suffix(".json").read_text())["prompts"]
        out[step] = (np.asarray(Image.open(path).convert("RGB")), prompts)
    return out


def assert_series_equal(logged: dict[str, dict[int, float]], run_dir: Path, rtol: float) -> None:
    expected = metrics_series(run_dir)
    assert set(logged) >= set(expected), sorted(set(expected) - set(logged))
    for column, values in expected.items():
        assert sorted(logged[column]) == sorted(values), column
        for step, value in values.items():
            assert logged[column][step] == pytest.approx(value, rel=rtol, abs=1e-12), (column, step)


def assert_caption_lists(caption: str, prompts: list[str]) -> None:
    assert prompts and caption.splitlines() == [f"{i + 1}: {p}" for i, p in enumerate(prompts)]


def test_the_run_saved_grids_with_their_prompts(tracked_run):
    found = grids(tracked_run)
    assert sorted(found) == [0, 2, 4]
    for pixels, prompts in found.values():
        assert pixels.size and len(prompts) == 2  # 2 held-out prompts x 1 sample


def test_no_tracker_file_holds_the_key(tracked_run):
    assert (tracked_run / "trackers").is_dir()
    assert hits([tracked_run], LITERAL_KEY) == []


# ----------------------------------------------------------------------------------------------------- TensorBoard


def test_tensorboard_event_files_equal_metrics_and_hold_captioned_grids(tracked_run):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install -e '.[trackers]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked_run / "trackers" / "tensorboard"),
                           size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    logged = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    assert_series_equal(logged, tracked_run, rtol=1e-6)  # event files hold float32
    images = {e.step: e for e in acc.Images("samples")}
    texts = {e.step: e for e in acc.Tensors("samples/prompts/text_summary")}
    for step, (pixels, prompts) in grids(tracked_run).items():
        decoded = np.asarray(Image.open(io.BytesIO(images[step].encoded_image_string)).convert("RGB"))
        assert np.array_equal(decoded, pixels)
        text = texts[step].tensor_proto.string_val[0].decode()
        assert_caption_lists(text.replace("  \n", "\n"), prompts)


# ---------------------------------------------------------------------------------------------- Weights & Biases


def wandb_records(path: Path):
    """The records of a W&B run file (``run-<id>.wandb``): a LevelDB-style log of protobuf ``Record`` messages
    (a 7-byte file header ``:W&B``, magic 0xBEE1, version 0; then 32 KiB blocks of chunks, each with a 7-byte header:
    CRC-32C, length, type full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0)
    block, position, pending = 32768, 7, b""
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:  # the rest of a block too short for a header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_equals_metrics_and_holds_captioned_grids(tracked_run):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[trackers]')")
    runs = list((tracked_run / "trackers" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    logged: dict[str, dict[int, float]] = {}
    captions, media = {}, {}
    config_keys = set()
    for record in wandb_records(next(runs[0].glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            config_keys |= {u.key for u in record.config.update}
        if kind != "history":
            continue
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        step = int(items["_step"])
        for key, value in items.items():
            if key == "samples/caption":  # an image is logged as nested keys samples/_type, samples/path, ...
                assert items["samples/_type"] == "image-file"
                captions[step], media[step] = value, items["samples/path"]
            elif not key.startswith("_") and isinstance(value, (int, float)):
                logged.setdefault(key, {})[step] = float(value)
    assert {"algorithm", "reward_args", "train"} <= config_keys
    assert_series_equal(logged, tracked_run, rtol=1e-12)
    for step, (pixels, prompts) in grids(tracked_run).items():
        assert_caption_lists(captions[step], prompts)
        assert np.array_equal(np.asarray(Image.open(runs[0] / "files" / media[step]).convert("RGB")), pixels)


# ------------------------------------------------------------------------------------------------------------ MLflow


def test_mlflow_file_store_equals_metrics_and_holds_captioned_grids(tracked_run, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install -e '.[trackers]')")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tracked_run / "trackers" / "mlruns"
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    [experiment] = [e for e in client.search_experiments() if e.name == "secret_probe"]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "secret_probe/flow_grpo/s0"
    assert run.data.params["algorithm.name"] == "flow_grpo"
    assert run.data.params["reward_args.unifiedreward.api_key"] == "***"
    logged = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
              for key in run.data.metrics}
    assert_series_equal(logged, tracked_run, rtol=1e-12)
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    for step, (pixels, prompts) in grids(tracked_run).items():
        [image] = [p for p in (artifacts / "images").glob(f"samples+step+{step}+*.png")]
        assert np.array_equal(np.asarray(Image.open(image).convert("RGB")), pixels)
        assert_caption_lists((artifacts / "samples" / f"step_{step}_prompts.txt").read_text(), prompts)


def test_a_resumed_run_leaves_one_tensorboard_point_per_step(tmp_path, monkeypatch):
    """Killed after logging step 3 (its checkpoint is at step 2), then resumed: TensorBoard keeps one point per step
    and tag (the resumed writer purges the killed tail; the history is not sent twice), equal to metrics.csv."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from flowzoo.benchmark.run import tracking

    root = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "run"
    args = ["train", str(root / "benchmark" / "configs" / "toy_flow_grpo.yaml"), "train.steps=4",
            "train.eval_every=2", "train.checkpoint_every=2", "train.eval_samples_per_prompt=4",
            "train.save_samples=false", "train.trackers=[tensorboard]", "model.args.pretrain_steps=50",
            f"run_dir={run_dir}", "--quiet"]
    original = tracking.Trackers.log

    def killed_after_step_3(self, row, step, trackers=None):
        original(self, row, step, trackers)
        if step == 3:
            for tracker in self.accelerator.trackers:  # what the killed process had written reaches the disk
                tracker.writer.flush()
            raise KeyboardInterrupt

    monkeypatch.setattr(tracking.Trackers, "log", killed_after_step_3)
    assert main(args) == 130
    monkeypatch.setattr(tracking.Trackers, "log", original)
    assert main(args) == 0
    acc = EventAccumulator(str(run_dir / "trackers" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    steps = {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert steps["eval_reward"] == [0, 2, 4] and steps["reward_mean"] == [1, 2, 3, 4]
    expected = metrics_series(run_dir)
    for tag in ("reward_mean", "eval_reward"):
        assert {e.step: e.value for e in acc.Scalars(tag)} == pytest.approx(expected[tag], rel=1e-6)
