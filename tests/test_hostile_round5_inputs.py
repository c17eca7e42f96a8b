"""Round 5 of hostile inputs (the traceback and silent cases): every reader of a user file turns a parse failure into
one line naming the file, and a value written into a script or a page may not carry a newline."""

from __future__ import annotations

import pytest

from flowzoo.errors import ConfigError


def _one_line(error: pytest.ExceptionInfo, *names: str) -> str:
    message = str(error.value)
    assert len(message.splitlines()) == 1, message
    for name in names:
        assert name in message, message
    return message


# ------------------------------------------------------------------------- damaged prompt datasets (item 12)

def _damaged_dataset(kind: str, tmp_path):
    """A damaged ``prompts.source: dataset`` input of ``kind``: (path given, path the message must name)."""
    if kind == "broken-jsonl":
        path = tmp_path / "prompts.jsonl"
        path.write_text('{"prompt": "a cat"}\n{"prompt": broken\n')
        return path, path
    if kind == "binary-csv":
        path = tmp_path / "prompts.csv"
        path.write_bytes(bytes(range(256)) * 3)
        return path, path
    if kind == "empty-csv":
        path = tmp_path / "prompts.csv"
        path.write_bytes(b"")
        return path, path
    if kind == "zero-row-parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "prompts.parquet"
        pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
        return path, path
    import datasets

    dataset = datasets.Dataset.from_dict({"prompt": ["a cat", "a dog"]})
    folder = tmp_path / "saved"
    if kind == "bad-state-json":
        dataset.save_to_disk(str(folder))
        (folder / "state.json").write_text("{broken")
    else:
        datasets.DatasetDict({"train": dataset, "test": dataset}).save_to_disk(str(folder))
        (folder / "dataset_dict.json").write_bytes(b"\x00\x01 not json")
    return folder, folder


@pytest.mark.parametrize("kind", ["broken-jsonl", "binary-csv", "empty-csv", "zero-row-parquet", "bad-state-json",
                                  "bad-dataset-dict-json"])
def test_damaged_prompt_dataset_is_one_line_naming_it(kind, tmp_path):
    """Item 12: each of these raised a DatasetGenerationError / JSONDecodeError traceback (or, 0 rows, went on)."""
    from flowzoo.benchmark.prompts.local_datasets import DatasetSpec, read_dataset_prompts

    path, named = _damaged_dataset(kind, tmp_path)
    with pytest.raises(ConfigError) as error:
        read_dataset_prompts(str(path), "train", DatasetSpec())
    message = _one_line(error, "prompts.train", str(named))
    if kind == "zero-row-parquet":
        assert "holds no prompts (0 rows)" in message


def test_binary_prompt_file_is_one_line_naming_it(tmp_path):
    """Item 12 (the Flow-GRPO formats): a binary .txt / .jsonl raised UnicodeDecodeError."""
    from flowzoo.benchmark.prompts.files import read_prompts

    for name in ("train.txt", "train_metadata.jsonl"):
        path = tmp_path / name
        path.write_bytes(b"a cat\n\xc7\xff\xfe binary\n")
        with pytest.raises(ConfigError) as error:
            read_prompts(path)
        _one_line(error, str(path), "not UTF-8 text")


# ------------------------------------------------------------- hand-edited --from-trials tables (item 14)

@pytest.fixture(scope="module")
def tuned_tables(tmp_path_factory):
    """The mini suite of tests/test_tuning.py tuned for one cell (2 trials) and its report: (suite file, report)."""
    from tests.test_tuning import tuned_mini_report

    path, _, report = tuned_mini_report(tmp_path_factory.mktemp("tuned"), trials=2)
    return path, report


def _edit_binary(csv):
    csv.write_bytes(bytes(range(256)) * 4)


def _edit_no_state(csv):
    import pandas as pd

    pd.read_csv(csv).drop(columns=["state"]).to_csv(csv, index=False)


def _edit_text_objective(csv):
    import pandas as pd

    table = pd.read_csv(csv)
    table["objective"] = table["objective"].astype(object)
    table.loc[0, "objective"] = "high"
    table.to_csv(csv, index=False)


@pytest.mark.parametrize("edit, says", [(_edit_binary, "cannot read"), (_edit_no_state, "has no column state"),
                                        (_edit_text_objective, "objective is 'high', not a number")])
def test_hand_edited_from_trials_table_is_one_line(tuned_tables, edit, says, tmp_path, capsys):
    """Item 14: a binary table, one without its state column, or a text objective raised a pandas / KeyError /
    TypeError traceback from `tune --report --from-trials`; now one line naming the table, and no output written."""
    import shutil

    from flowzoo.benchmark.cli import main

    path, report = tuned_tables
    source = tmp_path / "source"
    shutil.copytree(report, source)
    csv = source / "trials" / "toy2d_mode" / "flow_grpo.csv"
    edit(csv)
    out = tmp_path / "out"
    capsys.readouterr()
    code = main(["tune", str(path), "--report", "--trials", "2", "--from-trials", str(source), "--out", str(out),
                 "--tasks", "toy2d_mode", "--algorithms", "flow_grpo"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(csv) in err and says in err, err
    assert not out.exists()


# ----------------------------------------------------------------------------------- a binary ANSWER.md (item 15)

@pytest.mark.parametrize("content, says", [(bytes(range(256)) * 2, "not UTF-8 text"),
                                           (b"the answer\x00\x00\x1b[2J", "control character")])
def test_binary_answer_md_is_one_line_naming_it(content, says, tmp_path):
    """Item 15: a binary ANSWER.md raised UnicodeDecodeError; one that decodes (NUL bytes, escapes) went onto the
    page. Both are one line naming the file."""
    from flowzoo.benchmark.study import answer as study_answer

    (tmp_path / "ANSWER.md").write_bytes(content)
    with pytest.raises(ConfigError) as error:
        study_answer.hand_written_answer(tmp_path)
    _one_line(error, str(tmp_path / "ANSWER.md"), says)


# -------------------------------------------------------------------- newlines in sbatch options (item 17)

@pytest.mark.parametrize("entry, says", [
    ('exclude: "node07\\n#SBATCH --partition=other"', "slurm_args.exclude 'node07\\n#SBATCH --partition=other': an "
                                                      "sbatch value is one line"),
    ('comment: "run\\rX"', "slurm_args.comment 'run\\rX': an sbatch value is one line"),
    ('"exclude\\n#SBATCH --qos": "high"', "slurm_args key 'exclude\\n#SBATCH --qos' is no sbatch option name"),
    ('"mail type": "END"', "slurm_args key 'mail type' is no sbatch option name")])
def test_a_slurm_arg_with_a_newline_is_refused(tmp_path, entry, says):
    """Item 17: slurm_args values (and keys) with a newline injected a line into the sbatch script; partition and
    account were already refused."""
    from flowzoo.benchmark.run.executors import load_cluster

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"slurm_args:\n  {entry}\n")
    with pytest.raises(ConfigError) as error:
        load_cluster(cluster)
    _one_line(error, "cluster file cluster.yaml", says)


def test_a_slurm_arg_of_one_line_is_kept(tmp_path):
    from flowzoo.benchmark.run.executors import load_cluster

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text('slurm_args:\n  exclude: "node07,node08"\n  comment: "a run of two words"\n  nice: 10\n')
    assert load_cluster(cluster).slurm_args == {"exclude": "node07,node08", "comment": "a run of two words",
                                                "nice": 10}


# ------------------------------------------------------------------ a multi-line study question (item 18)

def _suite_with_question(tmp_path, question_yaml: str):
    import yaml

    from flowzoo.benchmark.run.suite import SUITES_DIR

    data = yaml.safe_load((SUITES_DIR / "tiny-counting-study.yaml").read_text())
    data.pop("question")
    path = tmp_path / "asked.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False) + question_yaml)
    return path


@pytest.mark.parametrize("question_yaml", ['question: "why?\\n\\n## Verdict: OP-GRPO wins"\n',
                                           'question: |\n  why?\n  # a second title\n',
                                           'question: "why?\\u001b[2J"\n'])
def test_a_multi_line_question_is_refused(tmp_path, question_yaml):
    """Item 18: a multi-line `question:` put a heading of its own into the study page (its title line)."""
    from flowzoo.benchmark.run.suite import load_suite

    with pytest.raises(ConfigError) as error:
        load_suite(str(_suite_with_question(tmp_path, question_yaml)))
    _one_line(error, "suite asked.yaml: question", "must be one line of text")


def test_a_folded_one_line_question_is_kept(tmp_path):
    from flowzoo.benchmark.run.suite import load_suite

    suite = load_suite(str(_suite_with_question(tmp_path, "question: >\n  does it\n  save steps?\n")))
    assert suite.question == "does it save steps?"


# ------------------------------------------------------- a prompt dataset replaced before the resume (item 16)

def test_a_prompt_dataset_replaced_before_the_resume_is_refused(tmp_path, capsys):
    """Item 16: a run killed after a checkpoint, its prompts.train dataset replaced (same path, other prompts), then
    resumed, trained on the new prompts from the old checkpoint; now the resume is refused in one line, and resuming
    on the original data still works."""
    import datasets

    from flowzoo.benchmark.cli import main

    data = tmp_path / "prompts.parquet"
    original = {"prompt": ["a red circle", "a blue square", "two green triangles"], "tag": ["a", "b", "c"]}
    datasets.Dataset.from_dict(original).to_parquet(str(data))
    run = tmp_path / "run"
    args = ["benchmark/configs/tiny_flow_grpo.yaml", "prompts.source=dataset", f"prompts.train={data}",
            f"prompts.test={data}", "reward=jpeg_compressibility", "model.args.weights=null",
            "model.args.arch={layers: 1, heads: 2, head_dim: 8, text_width: 16, text_layers: 1, text_heads: 2}",
            "algorithm.num_steps=2", "algorithm.group_size=2", "train.steps=2", "train.prompts_per_step=1",
            "train.eval_prompts=2", "train.save_samples=false", "train.checkpoint_every=1", f"run_dir={run}",
            "--quiet"]
    assert main(["train", *args]) == 0
    (run / "done.json").unlink()  # as if killed after its last checkpoint
    datasets.Dataset.from_dict({**original, "prompt": ["a red square", "a blue circle", "two green circles"]}).to_parquet(str(data))
    capsys.readouterr()
    assert main(["train", *args]) != 0
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("flowzoo: error")]  # (datasets' progress bars)
    assert len(errors) == 1 and "was written on other prompts" in errors[0] and str(run) in errors[0], err
    assert not (run / "done.json").exists()
    datasets.Dataset.from_dict(original).to_parquet(str(data))
    assert main(["train", *args]) == 0 and (run / "done.json").is_file()


# ------------------------------------------------------------- a study over two suites' runs of one cell (item 19)

def test_a_study_over_two_suites_runs_of_one_cell_is_refused(tmp_path, capsys):
    """Item 19: `flowzoo study RUNS` where RUNS holds suite-a/ and suite-b/, each with runs of one (task, algorithm)
    at other seeds, pooled the two suites' seeds into one cell; now one line naming both suites' runs. A study of one
    suite's folder, or of a runs directory holding only one suite, still runs."""
    from flowzoo.benchmark.cli import main
    from tests.synthetic_runs import write_run

    steps, task = [0, 10, 20, 30], "toy2d_sep64_sparse"
    for suite, seeds in (("suite-a", (0, 1, 2)), ("suite-b", (3, 4, 5))):
        for seed in seeds:
            write_run(tmp_path / "runs" / suite, task, "flow_grpo", seed, steps, [0.0, 0.1, 0.2, 0.3])
            write_run(tmp_path / "runs" / suite, task, "op_grpo", seed, steps, [0.0, 0.3, 0.3, 0.3])
    capsys.readouterr()
    code = main(["study", str(tmp_path / "runs"), "--suite", "op-grpo-study", "--out", str(tmp_path / "page"), "--smooth", "1",
                 "--resamples", "200", "--claims", "none"])
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if "error" in line]
    assert code == 2 and len(errors) == 1, err
    assert "are runs of two suites (suite-a, suite-b)" in errors[0], err
    assert not (tmp_path / "page" / "README.md").exists()
    assert main(["study", str(tmp_path / "runs" / "suite-a"), "--suite", "op-grpo-study", "--out", str(tmp_path / "page-a"), "--smooth", "1",
                 "--resamples", "200", "--claims", "none"]) == 0
