"""prompts.source: dataset: prompt sets from a Hugging Face dataset on local disk (benchmark/experiments/
prompt_datasets.py), saved with save_to_disk or as Parquet / JSON Lines files; bad paths, splits and columns are one
line; a tiny-tier run trains on them."""

from __future__ import annotations

import json

import pytest

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.loading import load_config
from flowzoo.benchmark.prompts.sources import PromptSection, load_prompts
from flowzoo.errors import ConfigError

datasets = pytest.importorskip("datasets")

ROWS = {"prompt": ["a red circle", "two blue squares", "a green triangle"], "tag": ["single", "counting", "single"],
        "include": [json.dumps([{"class": "circle", "count": 1}]), "[]", "[]"]}


def _section(train, test, **dataset):
    return PromptSection(source="dataset", train=str(train), test=str(test), dataset=dataset or None)


@pytest.mark.parametrize("form", ["save_to_disk", "dataset_dict", "parquet", "jsonl_folder"])
def test_each_local_form_gives_the_prompts_and_their_metadata(tmp_path, form):
    data = datasets.Dataset.from_dict(ROWS)
    path = tmp_path / form
    if form == "save_to_disk":
        data.save_to_disk(str(path))
    elif form == "dataset_dict":
        datasets.DatasetDict({"train": data, "test": data.select([2])}).save_to_disk(str(path))
    elif form == "parquet":
        path = tmp_path / "prompts.parquet"
        data.to_parquet(str(path))
    else:
        path.mkdir()
        for i, row in enumerate(data):
            (path / f"part{i}.jsonl").write_text(json.dumps(row) + "\n")
    train, test = load_prompts(_section(path, path, metadata=["tag", "include"]))
    assert train == [(p, {"tag": t, "include": inc}) for p, t, inc in zip(*ROWS.values())]
    assert test == (train[2:] if form == "dataset_dict" else train)


def test_bad_paths_splits_and_columns_are_one_line(tmp_path):
    data = datasets.Dataset.from_dict(ROWS)
    data.to_parquet(str(tmp_path / "p.parquet"))
    datasets.DatasetDict({"train": data}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.parquet").write_bytes((tmp_path / "p.parquet").read_bytes())
    (tmp_path / "mixed" / "b.txt").write_text("x\n")
    cases = [
        (_section(tmp_path / "nope", tmp_path / "p.parquet"), f"prompts.train: {tmp_path / 'nope'} does not exist"),
        (_section(tmp_path / "p.parquet", tmp_path / "p.parquet", column="text"),
         "has no column 'text'; its columns: prompt, tag, include"),
        (_section(tmp_path / "p.parquet", tmp_path / "p.parquet", metadata=["tags"]), "has no column 'tags'"),
        (_section(tmp_path / "dict", tmp_path / "dict"), "has the splits train, not 'test' (prompts.dataset.test_split)"),
        (_section(tmp_path / "mixed", tmp_path / "p.parquet"), "not files of one kind of"),
    ]
    for section, expected in cases:
        with pytest.raises(ConfigError) as err:
            load_prompts(section)
        assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match="prompts.dataset is only used by the 'dataset' source, not 'files'"):
        load_prompts(PromptSection(source="files", train="a.txt", test="a.txt", dataset={"column": "prompt"}))
    with pytest.raises(ConfigError, match=r"prompts.dataset: unknown key"):
        load_prompts(_section(tmp_path / "p.parquet", tmp_path / "p.parquet", colum="prompt"))


def test_a_tiny_run_trains_on_a_parquet_prompt_set(tmp_path):
    datasets.Dataset.from_dict(ROWS).to_parquet(str(tmp_path / "prompts.parquet"))
    args = ["prompts.source=dataset", f"prompts.train={tmp_path / 'prompts.parquet'}",
            f"prompts.test={tmp_path / 'prompts.parquet'}", "prompts.dataset={metadata: [tag]}",
            "reward=jpeg_compressibility", "model.args.weights=null",
            "model.args.arch={layers: 1, heads: 2, head_dim: 8, text_width: 16, text_layers: 1, text_heads: 2}",
            "algorithm.num_steps=2", "algorithm.group_size=2", "train.steps=1", "train.prompts_per_step=1",
            "train.eval_prompts=2", "train.save_samples=false", "train.checkpoint_every=0", f"run_dir={tmp_path / 'run'}"]
    config = load_config("benchmark/configs/tiny_flow_grpo.yaml", args)
    assert config.prompts.dataset == {"metadata": ["tag"]}
    assert main(["train", "benchmark/configs/tiny_flow_grpo.yaml", *args, "--quiet"]) == 0
    assert (tmp_path / "run" / "done.json").exists()
