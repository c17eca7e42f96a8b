"""The unifiedreward client's edit mode against a fake OpenAI-compatible server on 127.0.0.1 (the stub of
tests/test_rewards_unifiedreward.py): two images a request, two scores a reply."""

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.rewards.errors import RewardError
from flowzoo.rewards.unifiedreward import EDIT_TEMPLATE, UnifiedReward, parse_edit_scores
from tests.test_rewards_unifiedreward import chat_response, server  # noqa: F401 (the fixture)

INSTRUCTIONS = ["make the circle red", "remove the square"]


def batch(n=2):
    generator = torch.Generator().manual_seed(1)
    samples, sources = torch.rand(n, 3, 8, 8, generator=generator), torch.rand(n, 3, 8, 8, generator=generator)
    return samples, INSTRUCTIONS[:n], [{"source_image": source} for source in sources]


def sent_images(request):
    """The images of a chat request, decoded, as uint8 tensors [3, H, W], in the order sent."""
    found = []
    for part in request["messages"][0]["content"]:
        if part["type"] == "image_url":
            data = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
            found.append(torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()).permute(2, 0, 1))
    return found


def instruction_of(request):
    text = request["messages"][0]["content"][-1]["text"]
    return text.split("Editing instruction: ")[1]


def edit_reward(server, **args):
    return rewards.build("unifiedreward", {"unifiedreward": {"base_url": server.base_url, "mode": "edit", **args}})


def test_parse_rule():
    reply = '{"reasoning": "a score of 3 would be unfair", "score": [20, 12.5]}'
    assert parse_edit_scores(reply, 25) == pytest.approx((0.8, 0.5))
    assert parse_edit_scores("Score: [1, 2] ... final SCORE = [25, 0]", 25) == (1.0, 0.0)  # the last list
    with pytest.raises(ValueError, match="no score list"):
        parse_edit_scores("Final Score: 4", 25)
    with pytest.raises(ValueError, match="outside"):
        parse_edit_scores('"score": [26, 3]', 25)


def test_edit_mode_sends_source_then_sample_and_logs_both_scores(server):
    replies = {INSTRUCTIONS[0]: '{"reasoning": "ok", "score": [25, 20]}', INSTRUCTIONS[1]: '"score": [5, 15]'}
    server.reply = lambda request: (200, chat_response(replies[instruction_of(request)]))
    samples, prompts, metadata = batch()
    out = edit_reward(server)(samples, prompts, metadata)
    assert out.components["edit"].tolist() == pytest.approx([1.0, 0.2])
    assert out.components["preserve"].tolist() == pytest.approx([0.8, 0.6])
    assert out.score.tolist() == pytest.approx([0.9, 0.4])  # 0.5 / 0.5
    assert len(server.requests) == 2
    for _, request in server.requests:
        index = prompts.index(instruction_of(request))
        source, sample = sent_images(request)
        assert torch.equal(source, (metadata[index]["source_image"] * 255).round().byte())
        assert torch.equal(sample, (samples[index] * 255).round().byte())
        assert request["messages"][0]["content"][-1]["text"] == EDIT_TEMPLATE.format(prompt=prompts[index])


def test_weights_and_an_own_template(server):
    server.reply = lambda request: (200, chat_response('"score": [25, 0]'))
    samples, prompts, metadata = batch(1)
    out = edit_reward(server, edit_weight=1, preserve_weight=3, template="Edit: {prompt}. Two scores.")(
        samples, prompts, metadata)
    assert out.score.tolist() == pytest.approx([0.25])
    assert server.requests[-1][1]["messages"][0]["content"][-1]["text"] == "Edit: make the circle red. Two scores."
    with pytest.raises(ConfigError, match="edit_weight and preserve_weight must be finite numbers >= 0"):
        UnifiedReward(base_url=server.base_url, mode="edit", edit_weight=0, preserve_weight=0)


def test_image_mode_is_unchanged_by_the_edit_mode(server):
    samples, prompts, metadata = batch(1)
    out = UnifiedReward(base_url=server.base_url)(samples, ["a cat"], metadata)  # the default reply: Final Score: 4
    assert out.score.tolist() == pytest.approx([0.8]) and out.components == {}
    assert len(sent_images(server.requests[-1][1])) == 1


def test_missing_source_is_one_line_before_any_request(server):
    samples, prompts, metadata = batch()
    with pytest.raises(ConfigError) as error:
        edit_reward(server)(samples, prompts, [metadata[0], {}])
    message = str(error.value)
    assert "\n" not in message and "unifiedreward" in message and "'remove the square'" in message
    assert "no source image in metadata['source_image']" in message and server.requests == []


def test_a_reply_without_two_scores_is_one_line_after_the_retries(server):
    server.reply = lambda request: (200, chat_response("Final Score: 4"))
    samples, prompts, metadata = batch(1)
    with pytest.raises(RewardError) as error:
        edit_reward(server, retries=1, retry_wait_s=0.01)(samples, prompts, metadata)
    assert "\n" not in str(error.value) and len(server.requests) == 2
    assert "unifiedreward" in str(error.value) and "2 attempts" in str(error.value) and "no score list" in str(error.value)


def test_bad_mode_names_the_choices():
    with pytest.raises(ConfigError, match="mode 'edits' is not one of image, edit"):
        UnifiedReward(mode="edits")
