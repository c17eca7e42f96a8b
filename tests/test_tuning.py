"""flowzoo tune (benchmark/tuning/tune.py): declared spaces fit the loader, equal budgets, kill -9 resume,
concurrent workers, the objective, disjoint seeds, and tuned recipes picked up by a suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flowzoo import algorithms
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.config import search_space
from flowzoo.benchmark.tuning import tune as tuning
from flowzoo.benchmark.run.loading import build_config
from flowzoo.benchmark.run.suite import expand, load_suite
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

MINI = {
    "name": "mini",
    "seeds": [0, 1],
    "algorithms": ["flow_grpo", "op_grpo"],
    "defaults": {
        "algorithm": {"group_size": 8, "clip_range": 0.05, "lr": 1.0e-4, "kl_beta": 0.0},
        "train": {"steps": 4, "prompts_per_step": 2, "eval_every": 2, "eval_samples_per_prompt": 4,
                  "checkpoint_every": 2, "save_samples": False, "threads": 1},
        "model": {"name": "toy2d"}, "reward": "toy_mode",
        "per_algorithm": {"op_grpo": {"replay_prompts": "buffer", "off_policy_groups": 0.5}},
    },
    "tasks": {"toy2d_mode": {},
              "toy2d_mode@dynamic": {"algorithms": ["flow_grpo"], "train": {"prompt_sampler": "dynamic"}},
              "toy2d_mode@pinned": {"algorithms": ["op_grpo"], "per_algorithm": {"op_grpo": {"t_off": 0}}}},
    "tuning": {"objective": "auc", "trials": 2, "seeds": [1000], "validation": {"eval_seed": 54321, "prompts": "reported"},
               "sampler": {"seed": 0, "startup_trials": 1}, "pruner": {"startup_trials": 1, "warmup_evaluations": 1}},
}


def write_suite(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(yaml.safe_dump(MINI))
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tuned_mini_report(tmp, trials: int):
    """The mini suite (:func:`write_suite`) tuned for one cell (``trials`` trials) and its report written by
    ``tune --report``: (suite file, runs, report)."""
    from flowzoo.benchmark.cli import main
    from flowzoo.benchmark.tuning import tune as tuning

    path, runs, report = write_suite(tmp), tmp / "runs", tmp / "report"
    tuning.tune(str(path), runs, trials=trials, tasks="toy2d_mode", algorithms="flow_grpo")
    assert main(["tune", str(path), "--report", "--trials", str(trials), "--runs", str(runs), "--out", str(report),
                 "--tasks", "toy2d_mode", "--algorithms", "flow_grpo"]) == 0
    return path, runs, report


def studies(runs: Path, suite: str = "mini") -> dict:
    import optuna

    storage = tuning.open_storage(f"sqlite:///{(runs / suite / 'tuning' / 'optuna.db').resolve()}")
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=storage)
            for s in optuna.get_all_study_summaries(storage)}


def states(study) -> list[str]:
    return [t.state.name for t in study.get_trials(deepcopy=False)]


# ----------------------------------------------------------------------------------------------- declared spaces

def _declared_points(name: str):
    scopes = search_space.declared_scopes(search_space.space_paths(name), search_space._preset_keys(name))
    for scope, knobs in scopes.items():
        for knob in knobs.values():
            for value in knob.points():
                yield scope, knob.name, value


@pytest.mark.parametrize("name", algorithms.names())
def test_every_point_of_every_declared_space_passes_the_config_loader(name):
    base = yaml.safe_load((ROOT / "benchmark/configs/toy_flow_grpo.yaml").read_text())
    points = list(_declared_points(name))
    assert points, f"{name} declares no search space"
    for scope, knob, value in points:
        if scope not in ("default", "toy2d"):
            continue  # the tiny scope is checked on its suite below (its T = 5)
        # OP-GRPO as the studies run it (buffer prompts take a share < 1 of the groups)
        context = {"replay_prompts": "buffer", "off_policy_groups": 0.5} if name.startswith("op_grpo") else {}
        algorithm = {"name": name, **context, knob: value}
        build_config({**base, "algorithm": algorithm})


@pytest.mark.parametrize("suite_name", ["op-grpo-study", "tiny-rare-counting-study"])
def test_every_point_of_the_study_designs_spaces_fits_their_cells(suite_name, tmp_path):
    suite, design = tuning.load_tuning(suite_name)
    cells = tuning.tuning_cells(suite, design)
    assert {c.algorithm for c in cells} >= {"flow_grpo", "op_grpo", "diffusion_nft"}
    assert any(c.sampler == "dynamic" for c in cells)
    for cell in cells:
        assert "lr" in cell.knobs
        assert tuning.check_space(suite, design, cell, tmp_path) == sum(len(k.points()) for k in cell.all_knobs().values())


def test_a_point_that_does_not_fit_the_cell_is_refused_before_any_trial(tmp_path):
    suite_file = write_suite(tmp_path, **{"defaults.algorithm.group_size": 2})  # replay_k up to 4 needs G >= 5
    suite, design = tuning.load_tuning(str(suite_file))
    cell = next(c for c in tuning.tuning_cells(suite, design) if c.algorithm == "op_grpo")
    with pytest.raises(ConfigError, match="replay_k=.* does not fit the cell"):
        tuning.check_space(suite, design, cell, tmp_path)


def test_a_preset_inherits_its_parents_space_less_the_keys_it_fixes():
    assert "t_off" in search_space.algorithm_space("op_grpo")
    truncation = search_space.algorithm_space("op_grpo_no_truncation")
    assert "t_off" not in truncation and "off_policy_groups" in truncation
    assert search_space.algorithm_space("op_grpo", "tiny")["t_off"].high == 4  # the tiny scope narrows it


def test_flowzoo_list_shows_the_space(capsys):
    from flowzoo.benchmark.cli import main

    assert main(["list", "awm"]) == 0
    out = capsys.readouterr().out
    assert "search space" in out and "weighting: one of" in out and "lr: float in" in out


def test_a_knob_without_its_source_is_refused(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("search_space:\n  default:\n    lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}\n")
    with pytest.raises(ConfigError, match="has no source"):
        search_space.read_space_file(path)


# ---------------------------------------------------------------------------------------------------- the design

def test_the_objective_equals_a_hand_computation():
    curves = [[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]]
    assert tuning.objective_value(curves, "auc") == pytest.approx((1.5 + 1.0) / 2)
    assert tuning.objective_value(curves, "final") == pytest.approx(((1 + 2 + 3) / 3 + 1.0) / 2)
    assert tuning.objective_value([[0.2, 0.4]], "final") == pytest.approx(0.3)  # fewer than 3 evaluations
    assert tuning.evaluations_per_run(400, 10) == 41 and tuning.evaluations_per_run(5, 2) == 4


def test_tuning_seeds_overlapping_evaluation_seeds_are_refused(tmp_path, capsys):
    path = write_suite(tmp_path, **{"tuning.seeds": [1, 1000]})
    with pytest.raises(ConfigError, match=r"tuning.seeds \[1\] are also evaluation seeds"):
        load_suite(str(path))
    capsys.readouterr()
    assert main(["tune", str(path)]) == 2  # the command's exit status, in this process (no second interpreter)
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_design_without_an_objective_is_refused(tmp_path):
    data = dict(MINI["tuning"])
    del data["objective"]
    with pytest.raises(ConfigError, match="needs `objective`"):
        load_suite(str(write_suite(tmp_path, tuning=data)))


def test_budgets_are_equal_by_construction(tmp_path, capsys):
    runs = tmp_path / "runs"
    tuning.tune(str(write_suite(tmp_path)), runs, trials=2, tasks="toy2d_mode,toy2d_mode@dynamic")
    found = studies(runs)
    assert set(found) == {"mini/toy2d_mode/flow_grpo", "mini/toy2d_mode/op_grpo", "mini/toy2d_mode@dynamic/flow_grpo"}
    for study in found.values():
        assert sum(s in ("COMPLETE", "PRUNED") for s in states(study)) == 2
    lines = [line for line in capsys.readouterr().out.splitlines() if " trial " in line]
    assert len(lines) == 6 and all(" s" in line and "objective" in line for line in lines)
    assert any("sampler.max_rounds=" in line for line in lines)


# --------------------------------------------------------------------------------------------- kill and workers

def _tune_args(suite_file: Path, runs: Path, *extra: str) -> list[str]:
    return ["tune", str(suite_file), "--runs", str(runs), "--tasks", "toy2d_mode", "--algorithms", "flow_grpo", *extra]


def _tune_command(suite_file: Path, runs: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flowzoo", *_tune_args(suite_file, runs, *extra)]


def test_a_killed_tune_resumes_without_repeating_finished_trials(tmp_path):
    suite_file = write_suite(tmp_path, **{"defaults.train.steps": 40, "defaults.train.eval_every": 10,
                                          "defaults.train.checkpoint_every": 10, "tuning.trials": 3,
                                          "tuning.pruner.name": "none"})
    runs = tmp_path / "runs"
    process = subprocess.Popen(_tune_command(suite_file, runs), cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:  # the first finished trial, then kill -9 during the second
        if " trial 0 " in line:
            break
    time.sleep(0.5)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    study = studies(runs)["mini/toy2d_mode/flow_grpo"]
    before = {t.number: t.value for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"}
    done = {p: p.stat().st_mtime_ns for p in (runs / "mini" / "tuning").rglob("done.json")}
    assert 0 in before
    # the resume: the same command in this process (the killed one was another process, its trial's worker dead)
    assert main(_tune_args(suite_file, runs)) == 0
    study = studies(runs)["mini/toy2d_mode/flow_grpo"]
    after = {t.number: t.value for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"}
    assert {n: after[n] for n in before} == before  # finished trials kept, not rerun
    assert len(after) == 3
    assert all(p.stat().st_mtime_ns == m for p, m in done.items())  # their runs untouched
    assert "RUNNING" not in states(study)


def test_two_workers_on_one_study_never_run_the_same_trial(tmp_path, capsys):
    suite_file = write_suite(tmp_path, **{"tuning.trials": 4, "tuning.pruner.name": "none"})
    runs = tmp_path / "runs"
    # the command in this process: its two workers are processes of their own (a process pool) all the same
    assert main(_tune_args(suite_file, runs, "--workers", "2")) == 0, capsys.readouterr().err[-2000:]
    trials = studies(runs)["mini/toy2d_mode/flow_grpo"].get_trials(deepcopy=False)
    counted = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(counted) == 4  # exactly the budget, however the workers interleave
    assert len({t.number for t in counted}) == 4
    assert len({tuple(sorted(t.params.items())) for t in counted}) == 4  # no two workers drew the same values
    assert all(t.user_attrs.get("over_budget") for t in trials if t.state.name == "FAIL")
    trial_dirs = sorted(p.name for p in (runs / "mini" / "tuning" / "toy2d_mode" / "flow_grpo").glob("trial*"))
    assert trial_dirs == [f"trial{t.number}" for t in sorted(counted, key=lambda t: t.number)]


def test_two_workers_resuming_queued_trials_run_each_once(tmp_path, monkeypatch, capsys):
    """A resumed tune with two workers and two queued re-runs (what a Ctrl-C of a 2-worker tune leaves). SQLite's
    pop of a queued trial reads, then writes, without a lock: two workers could both pop the first re-run, race for
    its run directory, and the loser's told state broke the winner ("Cannot tell a PRUNED trial"). The moment between
    reading the queued trial and writing its claim is slowed here, so that both workers always read before either
    writes."""
    import optuna

    suite_file = write_suite(tmp_path, **{"tuning.pruner.name": "none"})
    runs = tmp_path / "runs"
    assert main(_tune_args(suite_file, runs, "--trials", "1")) == 0
    study = studies(runs)["mini/toy2d_mode/flow_grpo"]
    queued = [{"lr": 2.0e-4}, {"lr": 3.0e-4}]
    for number, params in enumerate(queued, start=5):
        study.enqueue_trial(params, user_attrs={"retry_of": number, "retries": 1})
    check = optuna.storages.RDBStorage.check_trial_is_updatable

    def slow_claim(self, trial_id, trial_state):
        if trial_state == optuna.trial.TrialState.WAITING:  # read a queued trial; its RUNNING not yet written
            time.sleep(1.0)
        return check(self, trial_id, trial_state)

    monkeypatch.setattr(optuna.storages.RDBStorage, "check_trial_is_updatable", slow_claim)  # forked into the workers
    assert main(_tune_args(suite_file, runs, "--trials", "3", "--workers", "2")) == 0, capsys.readouterr().err[-2000:]
    trials = studies(runs)["mini/toy2d_mode/flow_grpo"].get_trials(deepcopy=False)
    ran = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert sorted(t.user_attrs.get("retry_of", t.number) for t in ran) == [0, 5, 6]  # each queued re-run once
    assert not [t.user_attrs["stopped"] for t in ran if "stopped" in t.user_attrs]  # no run lost its directory
    assert "RUNNING" not in states(studies(runs)["mini/toy2d_mode/flow_grpo"])


# ----------------------------------------------------------------------------------------------- tuned recipes

def test_a_tuned_file_is_picked_up_by_a_suite_cell(tmp_path):
    tuned = tmp_path / "tuned"
    (tuned / "toy2d_mode").mkdir(parents=True)
    (tuned / "toy2d_mode" / "op_grpo.yaml").write_text(yaml.safe_dump(
        {"algorithm_keys": {"lr": 4.2e-4, "t_off": 3, "off_policy_groups": 0.25}, "sampler_keys": {}}))
    (tuned / "toy2d_mode@dynamic").mkdir()
    (tuned / "toy2d_mode@dynamic" / "flow_grpo.yaml").write_text(yaml.safe_dump(
        {"algorithm_keys": {"lr": 3.3e-4}, "sampler_keys": {"max_rounds": 5}}))
    suite = load_suite(str(write_suite(tmp_path, tuned=str(tuned))))
    configs = {(c.task, c.algorithm_name, c.seed): c for c in expand(suite, tmp_path / "runs")}
    op = configs[("toy2d_mode", "op_grpo", 0)].algorithm
    assert (op["lr"], op["t_off"], op["off_policy_groups"]) == (4.2e-4, 3, 0.25)  # over the shared per-algorithm 0.5
    pinned = configs[("toy2d_mode@pinned", "op_grpo", 0)].algorithm
    assert pinned["lr"] == 4.2e-4 and pinned["t_off"] == 0  # the base task's file; the control's own key kept
    dynamic = configs[("toy2d_mode@dynamic", "flow_grpo", 0)]
    assert dynamic.algorithm["lr"] == 3.3e-4
    assert dynamic.train.prompt_sampler == {"name": "dynamic", "max_rounds": 5}
    assert configs[("toy2d_mode", "flow_grpo", 0)].algorithm["lr"] == 1.0e-4  # no file: the shared recipe


def test_the_report_writes_a_tuned_file_a_suite_reads(tmp_path):
    from flowzoo.benchmark.tuning.report import write_tuning_report

    runs, out = tmp_path / "runs", tmp_path / "out"
    suite, design, cells, url = tuning.tune(str(write_suite(tmp_path)), runs, trials=2, tasks="toy2d_mode",
                                            algorithms="flow_grpo")
    index = write_tuning_report(suite.name, design, cells, url, out, 2)
    text = index.read_text()
    assert "| toy2d_mode | flow_grpo | 3 | - | 2/2 |" in text  # 3 knobs, none left out
    table = pd.read_csv(out / "chosen.csv")
    assert table.loc[0, "cpu_min"] > 0  # the trials' compute, summed from each trial's cpu_s
    assert (out / "figures" / "sensitivity_toy2d_mode.png").is_file()
    record = yaml.safe_load((out / "tuned" / "toy2d_mode" / "flow_grpo.yaml").read_text())
    tuned_suite = load_suite(str(write_suite(tmp_path, tuned=str(out / "tuned"))))
    config = next(c for c in expand(tuned_suite, runs) if (c.task, c.algorithm_name) == ("toy2d_mode", "flow_grpo"))
    assert config.algorithm["lr"] == record["algorithm_keys"]["lr"]


def test_a_dead_trial_requeued_by_two_workers_runs_once():
    """Two workers that both find one dead trial both re-queue it; only the lower-numbered copy runs, the other
    ends uncounted (as an over-budget trial does), so the budget is not spent on a duplicate."""
    import optuna

    from flowzoo.benchmark.tuning.tune import _duplicate_retry

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for _ in range(2):
        study.enqueue_trial({"lr": 1e-4}, user_attrs={"retry_of": 3, "retries": 1})
    first, second = study.ask(), study.ask()
    assert first.number < second.number
    assert not _duplicate_retry(first) and _duplicate_retry(second)
    fresh = study.ask()
    assert not _duplicate_retry(fresh)  # not a retry at all


def test_a_trial_killed_before_its_worker_claimed_it_is_failed_not_left_running(tmp_path):
    """kill -9 between Optuna creating a trial and the objective's first line leaves a running trial with no worker:
    once older than the grace it is failed (a fresh draw owes nothing; a popped re-run is queued again with its values),
    so a resumed tune neither waits forever nor counts it against the budget."""
    import optuna

    from flowzoo.benchmark.tuning.tune import counted, fail_dead_trials

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", study_name="s")
    fresh = study.ask()  # created RUNNING, never claimed
    study.enqueue_trial({"lr": 3e-4}, user_attrs={"retry_of": 7, "retries": 1})
    popped = study.ask()  # the queued re-run, popped and never claimed
    assert counted(study) == 2
    fail_dead_trials(study, grace_s=0.0)
    states = {t.number: t.state.name for t in study.get_trials(deepcopy=False)}
    assert states[fresh.number] == "FAIL" and states[popped.number] == "FAIL" and counted(study) == 0
    queued = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert len(queued) == 1 and queued[0].system_attrs["fixed_params"] == {"lr": 3e-4}
    assert queued[0].user_attrs == {"retry_of": 7, "retries": 2}
    young = study.ask()  # a live worker's trial a moment before it claims it: left alone once claimed
    young.set_user_attr("worker", "elsewhere:1")
    fail_dead_trials(study, grace_s=3600.0)
    assert study.get_trials(deepcopy=False)[young.number].state.name == "RUNNING"


def test_a_database_server_must_answer_within_the_connect_timeout(monkeypatch):
    """A PostgreSQL or MySQL URL of an unroutable host waited for the OS (minutes) before the one-line error."""
    import optuna

    seen = {}

    def fake_storage(url, engine_kwargs=None, **_):
        seen[url] = engine_kwargs
        raise RuntimeError("could not connect to server: timeout expired")

    monkeypatch.setattr(optuna.storages, "RDBStorage", fake_storage)
    for url in ("postgresql://10.255.255.1/tune", "mysql+pymysql://10.255.255.1/tune"):
        with pytest.raises(ConfigError, match="RuntimeError: could not connect"):
            tuning.open_storage(url)
        assert seen[url] == {"connect_args": {"connect_timeout": tuning.CONNECT_TIMEOUT_S}}
    assert tuning.engine_kwargs("sqlite:////shared/tune.db") == {"connect_args": {"timeout": 120}}


def test_a_storage_password_never_reaches_an_error_line(monkeypatch):
    import optuna

    def refuse(url, **_):
        raise RuntimeError("connection refused")

    monkeypatch.setattr(optuna.storages, "RDBStorage", refuse)
    with pytest.raises(ConfigError) as error:
        tuning.open_storage("postgresql://ana:s3cret@db.example/tune")
    assert "s3cret" not in str(error.value) and "postgresql://ana:***@db.example/tune" in str(error.value)
    with pytest.raises(ConfigError) as error:
        tuning.check_storage("postgresql://ana:s3cret@db.example:notaport/tune")
    assert "s3cret" not in str(error.value)
    assert tuning.shown_url("sqlite:////shared/tune.db") == "sqlite:////shared/tune.db"


# ------------------------------------------------------------------------------------------------- inert knobs

def test_a_knob_that_cannot_change_the_cell_is_never_tuned(tmp_path, capsys):
    """AWM at kl_beta 0 (the study's shared recipe): ema_kl_beta is inert (the release nests the copy's KL inside its
    KL term), so it leaves AWM's space with the reason; OP-GRPO with no group replaying loses its replay knobs; a
    design that names an inert knob is refused; a tuned switch keeps what it switches."""
    path = write_suite(tmp_path, algorithms=["flow_grpo", "op_grpo", "awm"])
    suite, design = tuning.load_tuning(str(path))
    cells = {(c.task, c.algorithm): c for c in tuning.tuning_cells(suite, design)}
    awm = cells[("toy2d_mode", "awm")]
    assert "ema_kl_beta" not in awm.knobs and "kl_beta is 0" in awm.inert["ema_kl_beta"]
    assert {"lr", "advantage_max", "weighting"} <= set(awm.knobs)
    assert cells[("toy2d_mode", "op_grpo")].inert == {}  # it replays: every replay knob matters

    quiet = write_suite(tmp_path, **{"tasks.toy2d_mode": {"per_algorithm": {"op_grpo": {"off_policy_groups": 0.0}}}})
    suite, design = tuning.load_tuning(str(quiet))
    op = {(c.task, c.algorithm): c for c in tuning.tuning_cells(suite, design)}[("toy2d_mode", "op_grpo")]
    assert {"replay_k", "t_off"} <= set(op.inert) and not {"replay_k", "t_off", "off_policy_groups"} & set(op.knobs)
    assert "off_policy_groups is 0" in op.inert["t_off"]
    keys = tuning.cell_keys(suite, "toy2d_mode", "op_grpo")  # with the switch in the space, nothing it switches is inert
    assert tuning.inert_knobs(keys, "toy2d_mode", "op_grpo", {"t_off": None, "off_policy_groups": None}) == {}
    capsys.readouterr()

    named = write_suite(tmp_path, algorithms=["flow_grpo", "op_grpo", "awm"], **{"tuning.knobs": ["lr", "ema_kl_beta"]})
    suite, design = tuning.load_tuning(str(named))
    with pytest.raises(ConfigError, match=r"tuning.knobs names 'ema_kl_beta', inert in toy2d_mode/awm \(kl_beta is 0"):
        tuning.tuning_cells(suite, design, algorithms_csv="awm")


def test_inert_keys_follow_their_switches():
    """The rules themselves: each names a knob only while its switch is off."""
    from flowzoo.algorithms.methods.awm import AWMConfig
    from flowzoo.algorithms.engine.base import AlgorithmConfig
    from flowzoo.algorithms.methods.op_grpo import OPGRPOConfig

    assert set(AlgorithmConfig(ema=False).inert_keys()) == {"ema_decay", "ema_every"}
    assert AlgorithmConfig(ema=True).inert_keys() == {}
    assert "ema_kl_beta" in AWMConfig(kl_beta=0.0).inert_keys()
    assert "ema_kl_beta" not in AWMConfig(kl_beta=1e-3).inert_keys()
    assert set(AWMConfig(kl_beta=1e-3, ema_kl_beta=0.0).inert_keys()) >= {"kl_ema_decay", "ema_kl_form"}
    assert "t_off" in OPGRPOConfig(off_policy_groups=0.0).inert_keys()
    assert "t_off" in OPGRPOConfig(replay_k=0).inert_keys()
    assert OPGRPOConfig(off_policy_groups=0.5, replay_k=1).inert_keys().keys() <= {"ema_decay", "ema_every"}


# ------------------------------------------------------------------------------------------- the validation split

def test_a_design_states_its_validation_and_never_scores_on_the_reported_set(tmp_path):
    """No validation section, or the reported runs' evaluation noise, or held-out prompts a source lacks: refused in
    one line; a trial's runs carry the design's evaluation noise."""
    with pytest.raises(ConfigError, match="needs `validation: "):
        load_suite(str(write_suite(tmp_path, tuning={k: v for k, v in MINI["tuning"].items() if k != "validation"})))
    with pytest.raises(ConfigError, match="validation.prompts 'test' is not one of held_out, reported"):
        load_suite(str(write_suite(tmp_path, **{"tuning.validation": {"eval_seed": 1, "prompts": "test"}})))
    same = write_suite(tmp_path, **{"tuning.validation": {"eval_seed": 12345, "prompts": "reported"}})
    suite, design = tuning.load_tuning(str(same))
    with pytest.raises(ConfigError, match="eval_seed 12345 is the evaluation noise of the reported runs"):
        tuning.tuning_cells(suite, design)
    toy = write_suite(tmp_path, **{"tuning.validation": {"eval_seed": 7, "prompts": "held_out"}})
    suite, design = tuning.load_tuning(str(toy))
    with pytest.raises(ConfigError, match="prompts held_out, task toy2d_mode: .*'toy2d' source has no prompts held out"):
        tuning.tuning_cells(suite, design)

    suite, design = tuning.load_tuning(str(write_suite(tmp_path)))
    cell = tuning.tuning_cells(suite, design, "toy2d_mode", "flow_grpo")[0]
    configs = tuning.trial_configs(suite, design, cell, {"lr": 1e-4, "clip_range": 0.1, "noise_level": 0.7},
                                   tmp_path / "trial0")
    assert [c.train.eval_seed for c in configs] == [54321] and configs[0].prompts.eval_split == "test"
    bench = next(c for c in expand(suite, tmp_path / "runs") if c.algorithm_name == "flow_grpo")
    assert bench.train.eval_seed == 12345  # the reported runs keep theirs


def test_held_out_prompts_are_disjoint_from_the_evaluation_set(tmp_path):
    """The tiny sources draw validation prompts apart and drop any test prompt's text; the files source reads
    prompts.validation and refuses one that shares a prompt with prompts.test; a run's identity is unchanged when
    the new keys sit at their defaults."""
    from flowzoo.benchmark.run.checkpoints import config_digest
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.prompts.sources import PromptSection, load_prompts

    _, test = load_prompts(PromptSection(source="tiny_shapes"))
    _, validation = load_prompts(PromptSection(source="tiny_shapes", eval_split="validation"))
    assert validation and not {p for p, _ in validation} & {p for p, _ in test}
    for name, lines in (("train", ["a cat", "a dog"]), ("test", ["a red car"]), ("val", ["a blue car", "a red car"])):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    files = {"source": "files", "train": str(tmp_path / "train.txt"), "test": str(tmp_path / "test.txt")}
    with pytest.raises(ConfigError, match="shares 1 prompt"):
        load_prompts(PromptSection(**files, validation=str(tmp_path / "val.txt"), eval_split="validation"))
    (tmp_path / "val.txt").write_text("a blue car\n")
    assert [p for p, _ in load_prompts(PromptSection(**files, validation=str(tmp_path / "val.txt"),
                                                     eval_split="validation"))[1]] == ["a blue car"]
    with pytest.raises(ConfigError, match="needs prompts.validation"):
        load_prompts(PromptSection(**files, eval_split="validation"))
    plain = load_config(ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml")
    spelled = load_config(ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml", ["prompts.eval_split=test"])
    assert config_digest(plain) == config_digest(spelled)


# -------------------------------------------------------------------------------------------- the confirmation

def test_confirmation_seeds_are_fresh(tmp_path):
    for seeds, message in (([0, 2000], r"confirmation.seeds \[0\] are also evaluation or tuning seeds"),
                           ([1000, 2000], r"confirmation.seeds \[1000\] are also evaluation or tuning seeds"),
                           ([2000], "give at least 2")):
        with pytest.raises(ConfigError, match=message):
            load_suite(str(write_suite(tmp_path, **{"tuning.confirmation": {"seeds": seeds}})))


def test_the_verdict_keeps_the_shared_recipe_unless_a_tuned_one_beats_it():
    from flowzoo.benchmark.tuning.confirm import SHARED, verdict

    def rows(shared, tuned):
        return pd.DataFrame([{"candidate": label, "trial": trial, "seed": seed, "objective": value, "cpu_s": 1.0,
                              "values": '{"lr": 0.001}' if trial is not None else "{}"}
                             for label, trial, values in ((SHARED, None, shared), ("trial3", 3, tuned))
                             for seed, value in zip((2000, 2001, 2002), values)])

    kept = verdict(rows([0.30, 0.32, 0.31], [0.29, 0.31, 0.30]))
    assert kept.keeps_shared and kept.values == {} and kept.best_tuned == "trial3"
    assert kept.difference[0] == pytest.approx(-0.01) and "shared recipe is kept" in kept.sentence()
    won = verdict(rows([0.30, 0.32, 0.31], [0.40, 0.41, 0.39]))
    assert won.pick == "trial3" and won.values == {"lr": 0.001}
    assert won.difference[1] > 0  # the paired interval excludes 0
    assert won.table.set_index("candidate").loc["trial3", "sd"] == pytest.approx(0.01)


def test_the_confirmation_reruns_the_top_trials_and_the_shared_recipe(tmp_path):
    """flowzoo tune with a confirmation: the best trial and the shared recipe each train on both confirmation seeds
    (on the validation split), the page and the tuned file say which won, and a suite at the tuned recipes runs it."""
    from flowzoo.benchmark.tuning.confirm import confirm_cells
    from flowzoo.benchmark.tuning.report import write_tuning_report

    path = write_suite(tmp_path, **{"tuning.confirmation": {"seeds": [2000, 2001], "top_k": 1}})
    runs, out = tmp_path / "runs", tmp_path / "out"
    suite, design, cells, url = tuning.tune(str(path), runs, trials=2, tasks="toy2d_mode", algorithms="flow_grpo")
    confirm_cells(suite, design, cells, url, runs / "mini" / "tuning", 2)
    confirm = runs / "mini" / "tuning" / "toy2d_mode" / "flow_grpo" / "confirm"
    assert sorted(p.name for p in confirm.iterdir())[0] == "shared" and len(list(confirm.iterdir())) == 2
    for run in confirm.glob("*/s*"):
        assert (run / "done.json").is_file()
        stored = yaml.safe_load((run / "config.yaml").read_text())
        assert stored["train"]["eval_seed"] == 54321 and stored["seed"] in (2000, 2001)
    index = write_tuning_report(suite.name, design, cells, url, out, 2).read_text()
    assert "## Confirmation" in index and "**pick**" in index
    table = pd.read_csv(out / "trials" / "toy2d_mode" / "flow_grpo.confirmation.csv")
    # the page opens with its answer: the cell's recipe and the paired tuned - shared difference, from these rows
    answer = index[:index.index("Objective `")]
    assert answer.startswith("# Tuning of mini\n\n**The answer**") and "| toy2d_mode | flow_grpo |" in answer
    best = table[table["candidate"] != "shared"]
    paired = (best.set_index("seed")["objective"] - table[table["candidate"] == "shared"].set_index("seed")["objective"])
    assert f"{paired.mean():+.4f} [" in answer
    # a report written again from these trial tables alone (a committed report whose storage is gone) is the same
    again = write_tuning_report(suite.name, design, cells, None, tmp_path / "again", 2, from_trials=out)
    assert again.read_text() == index
    for name in ("chosen.csv", "tuned/toy2d_mode/flow_grpo.yaml", "trials/toy2d_mode/flow_grpo.csv",
                 "trials/toy2d_mode/flow_grpo.confirmation.csv"):
        assert (tmp_path / "again" / name).read_text() == (out / name).read_text(), name
    assert len(table) == 4 and set(table["seed"]) == {2000, 2001}
    record = yaml.safe_load((out / "tuned" / "toy2d_mode" / "flow_grpo.yaml").read_text())
    pick = record["confirmation"]["pick"]
    means = record["confirmation"]["means"]
    assert pick == max(means, key=means.get) or (pick == "shared" and means["shared"] >= max(means.values()))
    assert record.get("kept_shared", False) == (pick == "shared")
    tuned_suite = load_suite(str(write_suite(tmp_path, tuned=str(out / "tuned"))))
    config = next(c for c in expand(tuned_suite, runs) if (c.task, c.algorithm_name) == ("toy2d_mode", "flow_grpo"))
    assert config.algorithm["lr"] == (1.0e-4 if pick == "shared" else record["algorithm_keys"]["lr"])


def test_the_confirmed_pick_is_worse_than_the_default_less_often_than_the_argmax():
    """benchmark/tuning/selection.py, the simulation docs/tuning.md quotes: at a realistic seed-to-seed spread the
    plain argmax of 24 one-seed trials picks a recipe truly worse than the default in about a third of tunings; the
    confirmed pick (top 3 and the default on 3 fresh seeds) about half as often, with a higher mean true gain."""
    from flowzoo.benchmark.tuning.selection import Landscape, simulate

    land = Landscape()
    assert float(land.value(land.optimum)) == land.peak > float(land.value(land.default))
    quiet, noisy = simulate(0.01, simulations=2000), simulate(0.05, simulations=2000)
    assert quiet.worse_argmax < 0.1 and noisy.worse_argmax > 0.2  # the winner's curse grows with the noise
    assert noisy.worse_confirmed < noisy.worse_argmax / 1.5
    assert noisy.gain_confirmed > noisy.gain_argmax


def test_a_report_into_an_old_out_leaves_no_stale_pick(tmp_path):
    """A cell without a pick in this report (its confirmation has not run) loses an older report's tuned file in the
    same --out, which a suite's tuned: key would otherwise still read."""
    from flowzoo.benchmark.tuning.report import write_tuning_report

    path = write_suite(tmp_path, **{"tuning.confirmation": {"seeds": [2000, 2001], "top_k": 1}})
    runs, out = tmp_path / "runs", tmp_path / "out"
    stale = out / "tuned" / "toy2d_mode" / "flow_grpo.yaml"
    stale.parent.mkdir(parents=True)
    stale.write_text("algorithm_keys: {lr: 0.5}\n")
    keep = out / "tuned" / "other_task" / "flow_grpo.yaml"  # not a cell of this report: kept
    keep.parent.mkdir(parents=True)
    keep.write_text("algorithm_keys: {lr: 0.5}\n")
    suite, design, cells, url = tuning.tune(str(path), runs, trials=1, tasks="toy2d_mode", algorithms="flow_grpo")
    text = write_tuning_report(suite.name, design, cells, url, out, 1).read_text()
    assert "not confirmed yet" in text and not stale.exists() and keep.exists()


def test_ctrl_c_then_rerun_draws_what_an_uninterrupted_tune_draws(tmp_path, monkeypatch):
    """A KeyboardInterrupt inside a trial's runs: the trial is failed and queued again with its values; the rerun
    resumes it, and the tune ends with the same trial values as one that was never stopped."""
    from flowzoo.benchmark.run import runner

    path = write_suite(tmp_path)
    plain = tmp_path / "plain"
    tuning.tune(str(path), plain, trials=3, tasks="toy2d_mode", algorithms="flow_grpo")
    original, calls = runner.Runner.run, []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 2:  # inside the second trial
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(runner.Runner, "run", interrupted)
    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        tuning.tune(str(path), stopped, trials=3, tasks="toy2d_mode", algorithms="flow_grpo")
    monkeypatch.setattr(runner.Runner, "run", original)
    tuning.tune(str(path), stopped, trials=3, tasks="toy2d_mode", algorithms="flow_grpo")

    def values(runs):
        study = studies(runs)["mini/toy2d_mode/flow_grpo"]
        counted = [t for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]
        return sorted(tuple(sorted(t.params.items())) for t in counted), study

    wanted, _ = values(plain)
    got, study = values(stopped)
    assert got == wanted
    assert [t.state.name for t in study.get_trials(deepcopy=False)].count("FAIL") == 1
    assert any(t.user_attrs.get("retry_of") == 1 for t in study.get_trials(deepcopy=False))


def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    found = set()
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        found |= {int(x) for x in path.read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie has ended


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_kill_9_of_a_tune_with_two_workers_ends_its_workers(tmp_path):
    """Its workers used to train on unseen and then block forever; now they end with it."""
    suite_file = write_suite(tmp_path, **{"defaults.train.steps": 2000, "tuning.trials": 4, "tuning.pruner.name": "none"})
    process = subprocess.Popen(_tune_command(suite_file, tmp_path / "runs", "--workers", "2"), cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < 2:
        workers = _children(process.pid)
        time.sleep(0.5)
    assert len(workers) >= 2, "the workers did not start"
    time.sleep(2)  # they are training
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    end = time.monotonic() + 30
    while time.monotonic() < end and any(_alive(w) for w in workers):
        time.sleep(0.5)
    assert not any(_alive(w) for w in workers)


def test_a_trial_measures_only_what_its_objective_reads_and_trains_as_the_reported_run(tmp_path):
    """Trials of the tiny rare-counting cells leave out the gold judge and the unseen prompts (2/3 of each evaluation's
    samples there), keep the task's training prompts; a short run trains to the same numbers either way."""
    suite, design = tuning.load_tuning("tiny-rare-counting-study")
    cell = tuning.tuning_cells(suite, design, "tiny_counting_rare", "flow_grpo")[0]
    trial = tuning.trial_configs(suite, design, cell, {"lr": 1e-3}, tmp_path / "trial0")[0]
    reported = next(c for c in expand(suite, tmp_path / "runs") if c.task == "tiny_counting_rare")
    assert reported.train.gold is not None and reported.prompts.unseen is not None  # what the study measures
    assert trial.train.gold is None and trial.prompts.unseen is None and trial.train.eval_own is False
    assert trial.prompts.train == reported.prompts.train and trial.train.eval_seed == design.validation.eval_seed

    short = ["train.steps=2", "train.eval_every=1", "train.prompts_per_step=2", "train.eval_samples_per_prompt=2",
             "train.checkpoint_every=0", "algorithm.group_size=4"]
    frames = {}
    for name, extra in (("measured", []), ("trial", list(tuning.UNREAD_BY_OBJECTIVES))):
        runs = tmp_path / name
        assert main(["bench", "tiny-rare-counting-study", "--tasks", "tiny_counting_rare", "--algorithms", "flow_grpo",
                     "--seeds", "3", "--runs", str(runs), *short, *extra]) == 0
        frames[name] = pd.read_csv(next(runs.rglob("metrics.csv")))
    assert "eval_unseen_reward" in frames["measured"] and "eval_unseen_reward" not in frames["trial"]
    columns = ["step", "reward_mean", "loss", "grad_norm", "eval_reward", "eval_spread"]
    pd.testing.assert_frame_equal(frames["measured"][columns], frames["trial"][columns])
