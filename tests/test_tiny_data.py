"""The tiny tier's synthetic data: deterministic by seed, prompts that match their scenes, the prompt sources."""

import pytest
import torch

from flowzoo.benchmark.config.schema import PromptSection
from flowzoo.benchmark.prompts.sources import TINY_EVAL_PROMPTS, TINY_TRAIN_PROMPTS, load_prompts
from flowzoo.models.tiny_data import (
    GLYPH_HEIGHT, GLYPH_WIDTH, SHAPES_SIZE, image_shape, sample_batch, sample_glyph_text, sample_shapes_scene,
)
from flowzoo.errors import ConfigError
from flowzoo.rewards.shapes import ShapesGenEval


def test_shapes_batches_are_deterministic_by_seed_and_index():
    images, prompts, metadata = sample_batch("shapes", 3, 10, 8)
    again, prompts_again, metadata_again = sample_batch("shapes", 3, 10, 8)
    assert torch.equal(images, again) and prompts == prompts_again and metadata == metadata_again
    # sample i does not depend on the batch it is drawn in
    tail, tail_prompts, _ = sample_batch("shapes", 3, 14, 4)
    assert torch.equal(images[4:], tail) and prompts[4:] == tail_prompts
    other, other_prompts, _ = sample_batch("shapes", 4, 10, 8)
    assert not torch.equal(images, other) or prompts != other_prompts
    assert images.shape == (8, *image_shape("shapes")) == (8, 3, SHAPES_SIZE, SHAPES_SIZE)
    assert 0 <= images.min() and images.max() <= 1


def test_every_tag_appears_and_ground_truth_scenes_pass_the_reward():
    images, prompts, metadata = sample_batch("shapes", 0, 0, 200)
    assert {m["tag"] for m in metadata} == {"colors", "counting", "two_object", "position"}
    out = ShapesGenEval()(images, prompts, metadata)
    assert out.components["strict_accuracy"].mean() == 1.0 and out.score.mean() == 1.0


def test_position_prompt_names_the_relation_of_the_drawn_objects():
    for index in range(400):
        objects, prompt, meta = sample_shapes_scene(0, index)
        if meta["tag"] != "position":
            continue
        relation, _ = meta["include"][1]["position"]
        first, second = objects  # the prompt says: second <relation> first
        cx = lambda o: (o.box[0] + o.box[2]) / 2  # noqa: E731
        cy = lambda o: (o.box[1] + o.box[3]) / 2  # noqa: E731
        expected = {"left of": cx(second) < cx(first), "right of": cx(second) > cx(first),
                    "above": cy(second) < cy(first), "below": cy(second) > cy(first)}[relation]
        assert expected, (prompt, objects)
        assert prompt.startswith(f"a {second.color} {second.shape} {relation} a {first.color} {first.shape}")


def test_glyphs_are_deterministic_and_prompts_quote_the_text():
    images, prompts, metadata = sample_batch("glyphs", 1, 0, 6)
    again, _, _ = sample_batch("glyphs", 1, 0, 6)
    assert torch.equal(images, again)
    assert images.shape == (6, 3, GLYPH_HEIGHT, GLYPH_WIDTH)
    for prompt, meta in zip(prompts, metadata):
        assert prompt == f'the text "{meta["text"]}"' and 2 <= len(meta["text"]) <= 3
    assert images.flatten(1).max(1).values.min() > 0.9  # every strip has ink
    assert [sample_glyph_text(1, i) for i in range(6)] == [m["text"] for m in metadata]


def test_tiny_prompt_sources():
    train, test = load_prompts(PromptSection(source="tiny_shapes"))
    assert (len(train), len(test)) == (TINY_TRAIN_PROMPTS, TINY_EVAL_PROMPTS)
    assert train[:5] != test[:5]  # different streams
    assert all(m["include"] for _, m in test)
    assert load_prompts(PromptSection(source="tiny_shapes"))[1] == test
    _, glyph_test = load_prompts(PromptSection(source="tiny_glyphs"))
    assert glyph_test[0][0].startswith('the text "')


def test_tiny_prompt_tags_keep_only_those_tags_in_both_lists():
    train, test = load_prompts(PromptSection(source="tiny_shapes", tags=["counting"]))
    full_train, full_test = load_prompts(PromptSection(source="tiny_shapes"))
    assert train == [(p, m) for p, m in full_train if m["tag"] == "counting"]
    assert test == [(p, m) for p, m in full_test if m["tag"] == "counting"]
    assert len({p for p, _ in train}) == 12 and all(p.startswith("two ") for p, _ in test)
    both, _ = load_prompts(PromptSection(source="tiny_shapes", tags=["counting", "position"]))
    assert {m["tag"] for _, m in both} == {"counting", "position"}


@pytest.mark.parametrize("section,message", [
    (PromptSection(source="tiny_shapes", tags=["cunting"]), "unknown tag 'cunting'; valid: colors, counting"),
    (PromptSection(source="tiny_shapes", tags="counting"), "must be a non-empty list"),
    (PromptSection(source="tiny_shapes", tags=[]), "must be a non-empty list"),
    (PromptSection(source="tiny_glyphs", tags=["counting"]), "only used by the 'tiny_shapes' and 'tiny_edit' sources"),
    (PromptSection(source="toy2d", tags=["counting"]), "only used by the 'tiny_shapes' and 'tiny_edit' sources"),
])
def test_tiny_prompt_tags_bad_values_are_named(section, message):
    with pytest.raises(ConfigError, match=message):
        load_prompts(section)


@pytest.mark.parametrize("suite, task", [("tiny-counting-study", "tiny_counting_sparse"),
                                         ("tiny-rare-counting-study", "tiny_counting_rare")])
def test_one_run_of_a_counting_study_cell_is_the_studys_run(tmp_path, suite, task):
    """``flowzoo train SUITE:TASK/flow_grpo seed=S`` (docs/tiny.md's one-run command) and the study's Flow-GRPO runs
    are the same runs: equal identities seed by seed."""
    from flowzoo.benchmark.run.checkpoints import config_digest
    from flowzoo.benchmark.run.run_source import load_run
    from flowzoo.benchmark.run.suite import expand, load_suite

    runs = [c for c in expand(load_suite(suite), tmp_path) if c.task == task and c.algorithm_name == "flow_grpo"]
    assert len(runs) == 20
    for run in runs[:2] + runs[-1:]:
        config, _ = load_run(f"{suite}:{task}/flow_grpo", [f"seed={run.seed}"])
        assert config_digest(config) == config_digest(run)


def test_the_rare_counting_prompts_are_tiny_shapes_counting_prompts():
    """benchmark/prompts/tiny_counting_rare.jsonl holds 4 distinct counting prompts of the tiny_shapes source with
    the generator's metadata word for word, so the strict reward checks what the tier's own prompts would ask."""
    from pathlib import Path

    from flowzoo.benchmark.prompts.files import read_prompts

    root = Path(__file__).resolve().parents[1]
    rare = read_prompts(root / "benchmark" / "prompts" / "tiny_counting_rare.jsonl")
    counting = dict(load_prompts(PromptSection(source="tiny_shapes", tags=["counting"]))[0])
    assert [p for p, _ in rare] == ["two blue circles", "two blue squares", "two green circles", "two red squares"]
    for prompt, metadata in rare:
        assert metadata == counting[prompt]
