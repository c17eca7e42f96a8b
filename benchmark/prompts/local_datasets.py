"""Prompt sets from a Hugging Face dataset on local disk (``prompts.source: dataset``), read through ``datasets``.

``prompts.train`` / ``prompts.test`` each name, on local disk (no hub: this reads no network):

* a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (read with ``load_from_disk``; of a
  DatasetDict the split ``prompts.dataset.train_split`` / ``test_split`` is taken, default ``train`` / ``test``);
* a Parquet, Arrow, JSON / JSON Lines or CSV file, or a folder of files of one of those kinds (read with
  ``load_dataset(<kind>, data_files=...)``). A folder in the Hub's layout, whose file names start with their split
  (``train-00000-of-00001.parquet``, ``test-00000-of-00001.parquet``), gives each split only its own files (the split
  ``prompts.dataset.train_split`` / ``test_split`` names); a folder mixing such files with files naming no split is
  refused.

``prompts.dataset``: ``column`` (default ``prompt``), the text column; ``metadata`` (default none), the columns kept as
each prompt's metadata (what rewards such as GenEval's read: ``tag``, ``include``, ...); ``image`` (default none: the
column ``image`` where the dataset has one), the column of each prompt's source image for instruction-editing models,
given as ``metadata["source_image"]`` (an image or array column as a [C, H, W] tensor in [0, 1], a path column as an
absolute path: ``benchmark/prompts/dataset_images.py``); ``image: ""`` reads none. A missing path, split or column is
one line naming it and what there is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from flowzoo.errors import ConfigError
from flowzoo.source_images import SOURCE_IMAGE

#: file suffix -> the ``datasets`` builder that reads it
BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv"}


@dataclass
class DatasetSpec:
    """``prompts.dataset``: which columns and splits of the dataset are the prompts."""

    column: str = "prompt"
    metadata: list[str] = field(default_factory=list)
    train_split: str = "train"
    test_split: str = "test"
    #: the source-image column (edit models); None: ``DEFAULT_IMAGE_COLUMN`` where the dataset has it; "": none
    image: str | None = None


#: the column read as each prompt's source image when ``prompts.dataset.image`` is unset and the dataset has it
DEFAULT_IMAGE_COLUMN = "image"


def check_dataset_spec(spec: DatasetSpec) -> None:
    if not isinstance(spec.column, str) or not spec.column:
        raise ConfigError(f"prompts.dataset.column must be a column name, got {spec.column!r}")
    if not isinstance(spec.metadata, list) or not all(isinstance(c, str) and c for c in spec.metadata):
        raise ConfigError(f"prompts.dataset.metadata must be a list of column names, got {spec.metadata!r}")


def read_dataset_prompts(path: str, split: str, spec: DatasetSpec) -> list[tuple[str, dict]]:
    """The (prompt, metadata) pairs of the dataset at ``path`` (``split``: ``train`` or ``test``)."""
    where = f"prompts.{split}"
    root = Path(path).expanduser()
    if not root.exists():
        raise ConfigError(f"{where}: {path} does not exist (a save_to_disk folder, or Parquet / Arrow / JSON / CSV "
                          f"files)")
    dataset = _load(root, where, getattr(spec, f"{split}_split"))
    columns = list(dataset.column_names)
    for column in [spec.column, *spec.metadata]:
        if column not in columns:
            raise ConfigError(f"{where}: {path} has no column {column!r}; its columns: {', '.join(columns)}")
    prompts = dataset[spec.column]
    bad = next((i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()), None)
    if bad is not None:
        raise ConfigError(f"{where}: row {bad} of {path} has no prompt text in column {spec.column!r} "
                          f"(got {prompts[bad]!r})")
    metadata = {c: dataset[c] for c in spec.metadata}
    image = image_column(spec, columns, where, path)
    if image is not None:
        from flowzoo.benchmark.prompts.dataset_images import source_images

        metadata[SOURCE_IMAGE] = source_images(dataset[image], root, where, image)
    return [(p, {c: values[i] for c, values in metadata.items()}) for i, p in enumerate(prompts)]


def image_column(spec: DatasetSpec, columns: list[str], where: str, path: str) -> str | None:
    """The column read as the prompts' source images: the one named (which must exist), else ``image`` where the
    dataset has it, else none."""
    if spec.image is None:
        return DEFAULT_IMAGE_COLUMN if DEFAULT_IMAGE_COLUMN in columns else None
    if spec.image == "":
        return None
    if spec.image not in columns:
        raise ConfigError(f"{where}: {path} has no image column {spec.image!r} (prompts.dataset.image); its columns: "
                          f"{', '.join(columns)}")
    return spec.image


#: the names the Hugging Face Hub reads as splits at the start of a data file's name (``train-00000-of-00001.parquet``)
SPLIT_WORDS = ("train", "training", "test", "testing", "validation", "valid", "val", "dev", "eval", "evaluation")


def split_of(file: Path) -> str:
    """The split a data file's name starts with (``train-00000-of-00001.parquet``, ``test.csv``): its name up to the
    first ``-``, ``_`` or ``.``."""
    return re.split(r"[-_.]", file.name, maxsplit=1)[0]


def split_files(files: list[Path], root: Path, where: str, split: str) -> list[Path]:
    """The files of a folder that are ``split``'s: all of them when no name starts with a split's (one dataset); else
    the Hub's layout, each file named for its split, and only ``split``'s are read (a folder given as both
    prompts.train and prompts.test never trains on the test prompts). A folder mixing split files with files naming
    none, or naming no file ``split``, is one line naming what it holds."""
    named = {f: split_of(f) for f in files}
    if not any(name in SPLIT_WORDS or name == split for name in named.values()):
        return files
    stray = [f.name for f, name in named.items() if name not in SPLIT_WORDS and name != split]
    if stray:
        splits = sorted({name for f, name in named.items() if f.name not in stray})
        raise ConfigError(f"{where}: {root} names the splits {', '.join(splits)} in its file names "
                          f"but {', '.join(stray)} names none; give a folder of one split's files or name each file "
                          f"<split>-NNNNN-of-NNNNN")
    chosen = [f for f, name in named.items() if name == split]
    if not chosen:
        raise ConfigError(f"{where}: {root} holds no file of the split {split!r} (prompts.dataset."
                          f"{where.split('.')[-1]}_split); its files name the splits "
                          f"{', '.join(sorted(set(named.values())))}")
    return chosen


def _load(root: Path, where: str, split: str):
    """The dataset at ``root``; a file ``datasets`` cannot read (damaged, binary, empty, a broken ``state.json``) is
    one line naming it, and a dataset of no rows is refused as holding no prompts."""
    import datasets

    saved = root.is_dir() and any((root / name).is_file() for name in ("dataset_dict.json", "dataset_info.json"))
    if not saved:
        files = [root] if root.is_file() else sorted(f for f in root.iterdir()
                                                     if f.is_file() and not f.name.startswith("."))
        if root.is_dir():
            files = split_files(files, root, where, split)
        kinds = {BUILDERS.get(f.suffix.lower()) for f in files}
        if not files or None in kinds or len(kinds) != 1:
            found = ", ".join(sorted({f.suffix or f.name for f in files})) or "nothing"
            raise ConfigError(f"{where}: {root} is no save_to_disk folder and holds {found}, not files of one kind "
                              f"of {', '.join(BUILDERS)}")
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own "Failed to load ..." lines: ours is the one
    try:
        if saved:
            loaded = datasets.load_from_disk(str(root))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise ConfigError(f"{where}: {root} has the splits {', '.join(loaded)}, not {split!r} "
                                      f"(prompts.dataset.{where.split('.')[-1]}_split)")
                loaded = loaded[split]
        else:
            kind = kinds.pop()
            if kind == "parquet":  # a 0-row Parquet file fails inside the builder ("BatchSize must be > 0")
                import pyarrow.parquet as pq

                if sum(pq.ParquetFile(f).metadata.num_rows for f in files) == 0:
                    raise ConfigError(f"{where}: {root} holds no prompts (0 rows)")
            loaded = datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train")
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure to parse a user's file is one line naming it
        raise ConfigError(f"{where}: cannot read {root} ({_first_line(error)})") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    if len(loaded) == 0:
        raise ConfigError(f"{where}: {root} holds no prompts (0 rows)")
    return loaded


def _first_line(error: BaseException) -> str:
    """The first line of the innermost cause of ``error`` (``datasets`` wraps the parser's own message)."""
    while error.__cause__ is not None or (error.__context__ is not None and not error.__suppress_context__):
        error = error.__cause__ or error.__context__
    return (str(error).strip().splitlines() or [type(error).__name__])[0] or type(error).__name__
