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
    from flowzoo.benchmark.experiments.prompt_datasets import DatasetSpec, read_dataset_prompts

    path, named = _damaged_dataset(kind, tmp_path)
    with pytest.raises(ConfigError) as error:
        read_dataset_prompts(str(path), "train", DatasetSpec())
    message = _one_line(error, "prompts.train", str(named))
    if kind == "zero-row-parquet":
        assert "holds no prompts (0 rows)" in message


def test_binary_prompt_file_is_one_line_naming_it(tmp_path):
    """Item 12 (the Flow-GRPO formats): a binary .txt / .jsonl raised UnicodeDecodeError."""
    from flowzoo.benchmark.experiments.prompt_files import read_prompts

    for name in ("train.txt", "train_metadata.jsonl"):
        path = tmp_path / name
        path.write_bytes(b"a cat\n\xc7\xff\xfe binary\n")
        with pytest.raises(ConfigError) as error:
            read_prompts(path)
        _one_line(error, str(path), "not UTF-8 text")
