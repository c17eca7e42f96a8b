"""Prompt sources of a task: lists of (prompt, metadata) for training and for evaluation.

* ``toy2d``: the toy tier's class prompts (``models.toy2d.prompt_set``), the same for training and evaluation;
  ``classes`` (default 4) selects the many-condition variant and must equal the model's ``classes`` argument;
  ``layout`` (default ``overlapping``) its mode layout, equal to the model's ``layout`` argument; ``unseen_every: K``
  holds every K-th condition out of both and evaluates those as prompts never trained on.
* ``files``: local files in Flow-GRPO's formats (``benchmark.prompts.files``): ``prompts.train`` and ``prompts.test``
  are each a ``.txt`` / ``_metadata.jsonl`` file or a folder holding ``train``/``test`` files of those names;
  ``prompts.unseen`` (optional) prompts never trained on, evaluated beside the test prompts (``eval_unseen_reward``).
* ``dataset``: a Hugging Face dataset on local disk (``benchmark.prompts.local_datasets``): ``prompts.train`` and
  ``prompts.test`` each a ``save_to_disk`` folder or Parquet / Arrow / JSON / CSV files; ``prompts.dataset`` names the
  prompt column, the metadata columns and a DatasetDict's splits.
* ``tiny_shapes`` / ``tiny_glyphs``: the tiny tier's synthetic prompts (``models.tiny_data.prompt_set``): 1024
  training prompts and 256 held-out evaluation prompts from two fixed seeds. ``tags`` (``tiny_shapes`` only) keeps
  the prompts of those GenEval tags in both lists (e.g. ``[counting]``: the 12 counting prompts, repeats kept).
* ``tiny_edit``: the edit tier's prompts (``models.tiny_edit_data.edit_prompt_set``): instructions of edit triples
  with their source images (``metadata["source_image"]``, [3, 32, 32] tensors in [0, 1]) and their edit kind
  (``metadata["tag"]``: recolor, add, remove), 1024 training and 256 held-out evaluation prompts from the same two
  fixed seeds (edit triples draw their own stream: these are not the ``tiny_shapes`` scenes), validation prompts
  from the third; ``tags`` keeps those edit kinds.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowzoo.errors import ConfigError

Prompts = list[tuple[str, dict]]
SOURCES = ("toy2d", "files", "dataset", "tiny_shapes", "tiny_glyphs", "tiny_edit")
#: one line each for ``flowzoo list`` (the module docstring has the details)
SOURCE_SUMMARIES = {
    "toy2d": "the toy tier's class prompts, the same for training and evaluation (unseen_every holds some out)",
    "files": "local prompt files in Flow-GRPO's formats (.txt, _metadata.jsonl; edit pairs with an image path)",
    "dataset": "a Hugging Face dataset on local disk (save_to_disk folder, Parquet, Arrow, JSON or CSV)",
    "tiny_shapes": "the tiny tier's synthetic GenEval-style prompts: 1024 training, 256 held-out evaluation",
    "tiny_glyphs": "the tiny tier's synthetic text-rendering prompts: 1024 training, 256 held-out evaluation",
    "tiny_edit": "the edit tier's instructions with their source scenes (recolor, add, remove): 1024 training, 256 "
                 "held-out evaluation",
}
#: the tiny tier's sources
TINY_SOURCES = ("tiny_shapes", "tiny_glyphs", "tiny_edit")
#: sizes of the tiny sources: training prompts, held-out evaluation prompts (docs/tiny.md)
TINY_TRAIN_PROMPTS, TINY_EVAL_PROMPTS = 1024, 256


@dataclass
class PromptSection:
    """The ``prompts`` section of an experiment config."""

    source: str = "toy2d"  # one of SOURCES
    train: str | None = None  # training prompts: a file or folder (the "files" source)
    test: str | None = None  # held-out evaluation prompts: a file or folder (the "files" source)
    classes: int | None = None  # the "toy2d" source's class count (models.toy2d.check_classes); None = 4
    layout: str | None = None  # the "toy2d" many-condition layout (models.toy2d.LAYOUTS); None = "overlapping"
    # "tiny_shapes" / "tiny_edit": keep only prompts of these tags (models.tiny_data.TAG_WEIGHTS; edit kinds,
    # models.tiny_edit_data.EDIT_KINDS)
    tags: list[str] | None = None
    # "dataset": {column, metadata, train_split, test_split, image} (benchmark.prompts.local_datasets.DatasetSpec)
    dataset: dict | None = None
    # validation prompts, held out from ``test`` (the "files" source; the tiny sources draw their own): what
    # ``flowzoo tune``'s trials evaluate on when its design asks for held-out prompts
    validation: str | None = None
    # prompts never trained on (the "files" source: a file disjoint from prompts.train), evaluated beside the test
    # prompts at every evaluation with the same sampler and noise, logged as eval_unseen_reward
    unseen: str | None = None
    # the "toy2d" source's conditions never trained on: every class c with c % unseen_every == unseen_every - 1 is
    # left out of training and of the test prompts and evaluated as the unseen prompts (eval_unseen_reward)
    unseen_every: int | None = None
    # which prompts evaluations use: "test" (the reported evaluation set) or "validation" (a tune trial's)
    eval_split: str = "test"


EVAL_SPLITS = ("test", "validation")
#: the sources with validation prompts held out from their evaluation prompts
VALIDATION_SOURCES = ("files", *TINY_SOURCES)
#: the sources whose prompts carry a tag ``prompts.tags`` selects by (GenEval tags; edit kinds)
TAGGED_SOURCES = ("tiny_shapes", "tiny_edit")


def check_source(section: PromptSection) -> None:
    if section.source not in SOURCES:
        raise ConfigError(f"unknown prompt source {section.source!r}; known: {', '.join(SOURCES)}")
    if section.eval_split not in EVAL_SPLITS:
        raise ConfigError(f"prompts.eval_split {section.eval_split!r}: one of {', '.join(EVAL_SPLITS)}")
    if section.validation is not None and section.source != "files":
        raise ConfigError(f"prompts.validation is a prompt file of the 'files' source; the {section.source!r} "
                          f"source {'draws its own' if section.source in VALIDATION_SOURCES else 'has none'}")
    if section.unseen_every is not None:
        every = section.unseen_every
        if section.source != "toy2d":
            raise ConfigError(f"prompts.unseen_every holds out conditions of the 'toy2d' source, not "
                              f"{section.source!r} (the 'files' source: prompts.unseen)")
        if isinstance(every, bool) or not isinstance(every, int) or every < 2:
            raise ConfigError(f"prompts.unseen_every must be an int >= 2 (every that many conditions, one is never "
                              f"trained on), got {every!r}")
    if section.unseen is not None and section.source != "files":
        raise ConfigError(f"prompts.unseen is a prompt file of the 'files' source, not {section.source!r} (the toy "
                          "tier holds conditions out with prompts.unseen_every; the tiny sources' evaluation prompts "
                          "are drawn apart)")
    if section.eval_split == "validation":
        if section.source not in VALIDATION_SOURCES:
            raise ConfigError(f"prompts.eval_split validation: the {section.source!r} source has no prompts held out "
                              f"from its evaluation set (sources with them: {', '.join(VALIDATION_SOURCES)}); "
                              f"evaluate on its test prompts with other evaluation noise instead")
        if section.source == "files" and section.validation is None:
            raise ConfigError("prompts.eval_split validation with the 'files' source needs prompts.validation: a "
                              "prompt file held out from prompts.test")
    if section.tags is not None:
        _check_tags(section)
    if section.dataset is not None and section.source != "dataset":
        raise ConfigError(f"prompts.dataset is only used by the 'dataset' source, not {section.source!r}")
    if section.source in ("files", "dataset"):
        for split in ("train", "test"):
            path = getattr(section, split)
            if path is None:
                raise ConfigError(f"prompts.{split}: the {section.source!r} source needs a "
                                  f"{'prompt file or folder' if section.source == 'files' else 'dataset path'}")
            if section.source == "files":
                from flowzoo.benchmark.prompts.files import resolve_prompt_file

                resolve_prompt_file(path, split)
        if section.unseen is not None:
            from flowzoo.benchmark.prompts.files import resolve_prompt_file

            resolve_prompt_file(section.unseen, "unseen")
        if section.source == "dataset":
            dataset_spec(section)
    else:
        for key in ("classes", "layout"):
            if getattr(section, key) is not None and section.source != "toy2d":
                raise ConfigError(f"prompts.{key} is only used by the 'toy2d' source, not {section.source!r}")
        if section.source == "toy2d":
            from flowzoo.models.toy2d import DEFAULT_LAYOUT, NUM_CLASSES, check_classes, check_many_layout

            classes = NUM_CLASSES if section.classes is None else check_classes(section.classes)
            check_many_layout(classes, DEFAULT_LAYOUT if section.layout is None else section.layout)
        for split in ("train", "test"):
            if getattr(section, split) is not None:
                raise ConfigError(f"prompts.{split} is only used by the 'files' and 'dataset' sources, not "
                                  f"{section.source!r}")


def dataset_spec(section: PromptSection):
    """``prompts.dataset`` as a checked DatasetSpec (its defaults where unset)."""
    from flowzoo.benchmark.prompts.local_datasets import DatasetSpec, check_dataset_spec
    from flowzoo.schema import from_mapping

    spec = from_mapping(DatasetSpec, section.dataset or {}, where="prompts.dataset")
    check_dataset_spec(spec)
    return spec


def _check_tags(section: PromptSection) -> None:
    from flowzoo.models.tiny_data import TAG_WEIGHTS
    from flowzoo.models.tiny_edit_data import EDIT_KINDS

    known = tuple(TAG_WEIGHTS) if section.source == "tiny_shapes" else EDIT_KINDS
    if section.source not in TAGGED_SOURCES:
        raise ConfigError(f"prompts.tags is only used by the 'tiny_shapes' and 'tiny_edit' sources, not "
                          f"{section.source!r}")
    tags = section.tags
    if isinstance(tags, str) or not isinstance(tags, (list, tuple)) or not tags:
        raise ConfigError(f"prompts.tags must be a non-empty list of tags ({', '.join(known)}), got {tags!r}")
    unknown = [t for t in tags if t not in known]
    if unknown:
        raise ConfigError(f"prompts.tags: unknown tag {unknown[0]!r}; valid: {', '.join(known)}")


def load_prompts(section: PromptSection) -> tuple[Prompts, Prompts]:
    """(training prompts, evaluation prompts)."""
    check_source(section)
    if section.source == "toy2d":
        trained = [(p, m) for p, m in _toy_prompts(section) if not _toy_unseen(section, m)]
        return trained, list(trained)
    if section.source in TINY_SOURCES:
        from flowzoo.models.tiny_data import EVAL_PROMPT_SEED, TRAIN_PROMPT_SEED, VALIDATION_PROMPT_SEED

        draw = _tiny_prompt_set(section.source)
        train = draw(TINY_TRAIN_PROMPTS, TRAIN_PROMPT_SEED)
        test = draw(TINY_EVAL_PROMPTS, EVAL_PROMPT_SEED)
        validation = draw(TINY_EVAL_PROMPTS, VALIDATION_PROMPT_SEED) if section.eval_split == "validation" else []
        if section.tags is not None:
            keep = set(section.tags)
            train, test, validation = ([(p, m) for p, m in prompts if m.get("tag") in keep]
                                       for prompts in (train, test, validation))
        return train, _evaluated(section, test, validation)
    if section.source == "dataset":
        from flowzoo.benchmark.prompts.local_datasets import read_dataset_prompts

        spec = dataset_spec(section)
        train, test = (read_dataset_prompts(section.train, "train", spec),
                       read_dataset_prompts(section.test, "test", spec))
    else:
        from flowzoo.benchmark.prompts.files import read_prompts

        train, test = read_prompts(section.train, "train"), read_prompts(section.test, "test")
    for split, prompts, path in (("train", train, section.train), ("test", test, section.test)):
        if not prompts:
            raise ConfigError(f"prompts.{split}: {path} holds no prompts")
    if section.eval_split == "validation":
        validation = read_prompts(section.validation, "validation")
        shared = sorted({p for p, _ in validation} & {p for p, _ in test})
        if shared:
            raise ConfigError(f"prompts.validation: {section.validation} shares {len(shared)} prompt(s) with "
                              f"prompts.test (e.g. {shared[0]!r}); validation prompts are held out from the reported "
                              f"evaluation set")
        return train, _evaluated(section, test, validation)
    return train, test


def load_unseen(section: PromptSection, train: Prompts) -> Prompts:
    """``prompts.unseen``: prompts never trained on, or [] when unset. A one-line ConfigError for an empty file or a
    prompt that is also a training prompt."""
    if section.unseen_every is not None:
        conditions = _toy_prompts(section)
        held_out = [(p, m) for p, m in conditions if _toy_unseen(section, m)]
        if not held_out:
            raise ConfigError(f"prompts.unseen_every {section.unseen_every} holds out none of the {len(conditions)} "
                              f"conditions; give at most {len(conditions)}")
        return held_out
    if section.unseen is None:
        return []
    from flowzoo.benchmark.prompts.files import read_prompts

    unseen = read_prompts(section.unseen, "unseen")
    if not unseen:
        raise ConfigError(f"prompts.unseen: {section.unseen} holds no prompts")
    trained = sorted({p for p, _ in unseen} & {p for p, _ in train})
    if trained:
        raise ConfigError(f"prompts.unseen: {section.unseen} shares {len(trained)} prompt(s) with prompts.train (e.g. "
                          f"{trained[0]!r}); unseen prompts are never trained on")
    return unseen


def _tiny_prompt_set(source: str):
    """``(count, seed) -> prompts`` of a tiny source: the edit triples' (``tiny_edit``) or the scenes' of its data."""
    if source == "tiny_edit":
        from flowzoo.models.tiny_edit_data import edit_prompt_set

        return edit_prompt_set
    from flowzoo.models.tiny_data import prompt_set

    return lambda count, seed: prompt_set(source.removeprefix("tiny_"), count, seed)


def _toy_prompts(section: PromptSection) -> Prompts:
    """Every condition of the ``toy2d`` source (its class count and layout, or their defaults)."""
    from flowzoo.models.toy2d import DEFAULT_LAYOUT, NUM_CLASSES, prompt_set

    classes = NUM_CLASSES if section.classes is None else section.classes
    return prompt_set(classes, DEFAULT_LAYOUT if section.layout is None else section.layout)


def _toy_unseen(section: PromptSection, metadata: dict) -> bool:
    """Whether a toy condition is held out from training (``prompts.unseen_every``)."""
    every = section.unseen_every
    return every is not None and metadata["class"] % every == every - 1


def _evaluated(section: PromptSection, test: Prompts, validation: Prompts) -> Prompts:
    """The prompts evaluations use: ``test``, or with ``eval_split: validation`` the validation prompts whose condition
    is not a test prompt's (none left: a one-line error). A condition is the text, with an edit prompt's source image
    (``flowzoo.source_images.condition_key``): the tiny edit tier's few instructions recur on other sources."""
    if section.eval_split != "validation":
        return test
    from flowzoo.source_images import condition_key

    tested = {condition_key(q, m) for q, m in test}
    held_out = [(p, m) for p, m in validation if condition_key(p, m) not in tested]
    if not held_out:
        raise ConfigError(f"prompts.eval_split validation: the {section.source!r} prompts"
                          f"{' of tags ' + str(section.tags) if section.tags else ''} hold no validation prompt "
                          f"outside the evaluation set (too few distinct prompts); score on the test prompts with "
                          f"other evaluation noise (a tuning design's validation.prompts: reported)")
    return held_out
