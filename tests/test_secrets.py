"""Secrets never reach a run directory, a report, a tracker or an error line; a run resumes with its key from the
environment. The unifiedreward reward scores a tiny random text-to-image model through a fake judge on 127.0.0.1."""

import io
import multiprocessing
import os
import re
import signal
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

import flowzoo.secrets
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.render.report import write_report
from flowzoo.benchmark.run.runner import TIMING_COLUMNS
from flowzoo.secrets import REDACTED, literal_secrets, redact, warn_literal_secrets, without_secrets
from tests.test_rewards_unifiedreward import FakeServer, chat_response

LITERAL_KEY = "sk-literal-8d41f0b2c9e7"
ENV_KEY = "sk-environment-5a6c3e91d0f4"
VARIABLE = "FLOWZOO_TEST_JUDGE_KEY"
TINY = {"data": "shapes", "weights": None,
        "arch": {"layers": 1, "heads": 1, "head_dim": 8, "text_width": 16, "text_layers": 1, "text_heads": 1}}
# requests per step: 4 training samples; evaluations (steps 0, 2, 4, ...) add 2
TRAIN = {"steps": 4, "prompts_per_step": 2, "eval_every": 2, "eval_prompts": 2, "eval_samples_per_prompt": 1,
         "checkpoint_every": 2, "threads": 1}


# ------------------------------------------------------------------------------------------------ the naming rule


JUDGE_KEY = ("reward_args", "judge", "api_key")


def test_secrets_are_decided_by_where_a_value_goes_not_by_its_name():
    """Only the declared places are secret: a sampler's ``category_key``, a reward's ``max_tokens`` or a key-like
    name given to a class that takes no credential is an ordinary value."""
    config = {"model": {"args": {"hf_token": "hf-1", "size": 3}},
              "reward_args": {"judge": {"api_key": "sk-1", "api_key_env": "V", "max_tokens": 9, "auth": "x"},
                              "other": {"api_key": "not-a-credential-here"}},
              "train": {"prompt_sampler": {"name": "variance", "category_key": "tag"}},
              "empty": {"password": None}}
    secret = {JUDGE_KEY, ("reward_args", "judge", "auth"), ("empty", "password")}
    shown = redact(config, secret)
    assert shown["reward_args"]["judge"] == {"api_key": REDACTED, "api_key_env": "V", "max_tokens": 9, "auth": REDACTED}
    assert shown["model"] == config["model"] and shown["train"] == config["train"]
    assert shown["reward_args"]["other"] == config["reward_args"]["other"]
    assert shown["empty"] == {"password": None} and config["reward_args"]["judge"]["api_key"] == "sk-1"  # a copy
    same = {**config, "reward_args": {"judge": {"max_tokens": 9}, "other": config["reward_args"]["other"]},
            "empty": {}}
    assert without_secrets(config, secret) == same == without_secrets(shown, secret)
    assert literal_secrets(config, secret) == ["reward_args.judge.api_key", "reward_args.judge.auth"]
    assert literal_secrets(shown, secret) == []  # *** is not a literal
    assert literal_secrets(config) == [] and redact(config) == config  # nothing declared: nothing secret


def test_the_config_declares_the_places_of_its_classes_credentials():
    from flowzoo.benchmark.config.schema import ExperimentConfig, declared_secrets

    config = ExperimentConfig(reward={"toy_mode": 1.0, "unifiedreward": 1.0})
    assert declared_secrets(config) == {("reward_args", "unifiedreward", "api_key")}
    assert declared_secrets(ExperimentConfig(reward="toy_mode")) == set()


def test_a_literal_secret_is_warned_about_once(capsys, monkeypatch):
    monkeypatch.setattr(flowzoo.secrets, "_warned", set())
    for _ in range(2):
        warn_literal_secrets({"reward_args": {"judge": {"api_key": LITERAL_KEY}}}, {JUDGE_KEY})
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reward_args.judge.api_key" in err and "api_key_env" in err
    assert LITERAL_KEY not in err


# ------------------------------------------------------------------------------------------- runs and the judge


class Judge(FakeServer):
    """Scores an image by its mean brightness (a deterministic function of the PNG); can hold request ``hold_at``
    (1-based) and every later one until ``release`` is set."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.lock = threading.Lock()
        self.hold_at = None
        self.holding, self.release = threading.Event(), threading.Event()
        self.reply = self.score

    def score(self, request):
        with self.lock:
            self.count += 1
            number = self.count
        if self.hold_at is not None and number >= self.hold_at:
            self.holding.set()
            self.release.wait(60)
        url = request["messages"][0]["content"][0]["image_url"]["url"]
        image = Image.open(io.BytesIO(__import__("base64").b64decode(url.split(",", 1)[1])))
        return 200, chat_response(f"Final Score: {5 * np.asarray(image).mean() / 255:.4f}")

    def keys_sent(self):
        return {h.get("Authorization") for h in self.headers}


@pytest.fixture
def judge():
    fake = Judge()
    yield fake
    fake.release.set()
    fake.httpd.shutdown()
    fake.httpd.server_close()


def write_config(path: Path, base_url: str, key_args: dict, **train) -> Path:
    config = {
        "task": "secret_probe", "seed": 0,
        "algorithm": {"name": "flow_grpo", "group_size": 2, "num_steps": 2, "kl_beta": 0.0, "lr": 1e-2},
        "model": {"name": "tiny", "args": TINY},
        "reward": "unifiedreward",
        "reward_args": {"unifiedreward": {"base_url": base_url, "retries": 0, "timeout": 30, **key_args}},
        "prompts": {"source": "tiny_shapes"},
        "train": {**TRAIN, **train},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def hits(roots, *secrets) -> list[str]:
    """Files under ``roots`` (any depth, every byte) that contain one of the secrets."""
    found = []
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file() and any(s.encode() in path.read_bytes() for s in secrets):
                found.append(str(path))
    return found


def test_literal_and_environment_keys_reach_the_judge_and_nothing_else(tmp_path, judge, capsys, monkeypatch):
    monkeypatch.setattr(flowzoo.secrets, "_warned", set())
    monkeypatch.setenv(VARIABLE, ENV_KEY)
    trackers = []  # what a tracker is given (no tracker package needs to be installed)

    class Recorder:
        def __init__(self, names, run_name, run_dir, config, resumed_at=0):
            trackers.append(config)

        def log(self, row, step):
            pass

        def replay(self, rows):  # a resumed run's history, as Trackers.replay sends it
            for row in rows:
                self.log(row, row["step"])

        def finish(self):
            pass

    monkeypatch.setattr("flowzoo.benchmark.run.tracking.check_trackers", lambda names: None)
    monkeypatch.setattr("flowzoo.benchmark.run.runner.Trackers", Recorder)
    runs = tmp_path / "runs"
    literal = write_config(tmp_path / "literal.yaml", judge.base_url, {"api_key": LITERAL_KEY}, trackers=["recorder"])
    assert main(["train", str(literal), f"run_dir={runs / 'literal'}", "--quiet"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warning) == 1 and "reward_args.unifiedreward.api_key" in warning[0] and "api_key_env" in warning[0]
    assert judge.keys_sent() == {f"Bearer {LITERAL_KEY}"} and len(judge.headers) == 3 * 2 + 4 * 4
    assert trackers and trackers[0]["reward_args"]["unifiedreward"]["api_key"] == REDACTED
    stored = yaml.safe_load((runs / "literal" / "config.yaml").read_text())
    assert stored["reward_args"]["unifiedreward"]["api_key"] == REDACTED

    judge.headers.clear()
    from_env = write_config(tmp_path / "env.yaml", judge.base_url, {"api_key_env": VARIABLE})
    assert main(["train", str(from_env), f"run_dir={runs / 'env'}", "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert judge.keys_sent() == {f"Bearer {ENV_KEY}"}
    stored = yaml.safe_load((runs / "env" / "config.yaml").read_text())
    assert stored["reward_args"]["unifiedreward"]["api_key_env"] == VARIABLE

    # one report per run: the two are the same seed of the same cell, which one report refuses to pool
    reports = [write_report(runs / name, tmp_path / f"report_{name}", baseline="flow_grpo").parent
               for name in ("literal", "env")]
    assert len(list((runs / "literal").rglob("*"))) > 4 and all(len(list(r.rglob("*"))) > 2 for r in reports)
    assert hits([runs, *reports], LITERAL_KEY, ENV_KEY) == []


@pytest.mark.parametrize("key_args", [{"api_key": LITERAL_KEY}, {"api_key_env": VARIABLE}], ids=["literal", "env"])
def test_a_server_that_is_down_leaks_nothing(tmp_path, judge, capsys, monkeypatch, key_args):
    monkeypatch.setenv(VARIABLE, ENV_KEY)
    judge.httpd.shutdown()
    judge.httpd.server_close()  # nothing listens on its port any more
    config = write_config(tmp_path / "c.yaml", judge.base_url, key_args)
    capsys.readouterr()
    assert main(["train", str(config), f"run_dir={tmp_path / 'run'}", "--quiet"]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if not line.startswith("flowzoo: warning:")]
    assert len(errors) == 1 and re.match(r"flowzoo: error: .*unifiedreward.*cannot reach server", errors[0])
    assert LITERAL_KEY not in captured.out + captured.err and ENV_KEY not in captured.out + captured.err
    # a fresh run that fails before its first checkpoint removes what it wrote (config.yaml included)
    assert not (tmp_path / "run").exists()


def _metrics(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "metrics.csv")
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])


def _train_quietly(args: list[str], env: dict[str, str]) -> None:
    """``flowzoo train ARGS`` in a forked process with ``env`` added to its environment, its output discarded."""
    os.environ.update(env)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os._exit(main(["train", *args]))


def test_killed_run_resumes_with_the_key_from_the_environment(tmp_path, judge, monkeypatch):
    config = write_config(tmp_path / "c.yaml", judge.base_url, {"api_key_env": VARIABLE}, steps=6)
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    # requests: eval 0 (1-2), step 1 (3-6), step 2 (7-10), eval 2 (11-12), step 3 (13-16), step 4 (17-...): held in
    # step 4, after step 3's metrics row and step 2's checkpoint were written
    judge.hold_at = 17
    # the run to kill is a process of its own, forked from this one (no interpreter start-up to wait for), with the
    # key in its environment only
    proc = multiprocessing.get_context("fork").Process(
        target=_train_quietly, args=([str(config), f"run_dir={killed}", "--quiet"], {VARIABLE: ENV_KEY}))
    proc.start()
    try:
        assert judge.holding.wait(180), "the run never reached step 4"
        # step 2's evaluation and checkpoint wrote rows 0-2; step 3's row may still be waiting for the next write
        # (metrics.csv is rewritten at evaluations and checkpoints, and otherwise at most every 5 s)
        assert len(pd.read_csv(killed / "metrics.csv")) in (3, 4) and (killed / "checkpoint.pt").is_file()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    judge.hold_at = None
    judge.release.set()
    assert not (killed / "done.json").exists()
    monkeypatch.setenv(VARIABLE, ENV_KEY)
    assert main(["train", str(config), f"run_dir={killed}", "--quiet"]) == 0
    assert main(["train", str(config), f"run_dir={reference}", "--quiet"]) == 0
    resumed, uninterrupted = _metrics(killed), _metrics(reference)
    assert resumed["eval_reward"].notna().sum() == 4 and resumed["reward_mean"].nunique() > 1
    pd.testing.assert_frame_equal(resumed, uninterrupted)
    assert judge.keys_sent() == {f"Bearer {ENV_KEY}"} and hits([killed, reference], ENV_KEY) == []


def test_a_literal_key_run_resumes_from_the_environment(tmp_path, judge, capsys, monkeypatch):
    """The redacted value is not a change of config: a run started with a literal key continues with the key from
    the environment (and ``***``, the redacted copy, is refused as a key)."""
    monkeypatch.setenv(VARIABLE, ENV_KEY)
    run_dir = tmp_path / "run"
    literal = write_config(tmp_path / "a.yaml", judge.base_url, {"api_key": LITERAL_KEY}, steps=2)
    assert main(["train", str(literal), f"run_dir={run_dir}", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["train", str(run_dir / "config.yaml"), f"run_dir={tmp_path / 'copy'}", "--quiet"]) == 2
    assert "api_key is '***', the redacted copy of a key" in capsys.readouterr().err
    (run_dir / "done.json").unlink()
    (run_dir / "checkpoint.pt").unlink()  # so that the judge is asked again
    from_env = write_config(tmp_path / "b.yaml", judge.base_url, {"api_key_env": VARIABLE}, steps=2)
    assert main(["train", str(from_env), f"run_dir={run_dir}", "--quiet"]) == 0  # same run: not refused
    assert (run_dir / "done.json").is_file() and judge.keys_sent() == {f"Bearer {LITERAL_KEY}", f"Bearer {ENV_KEY}"}
