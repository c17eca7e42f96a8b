"""The OCR rewards with the real RapidOCR model on text rendered by PIL."""

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.rewards.ocr import OcrReward, VideoOcrReward, levenshtein, quoted_target, text_match_score


def render(text: str) -> torch.Tensor:
    """Black text on white, as an RGB tensor [3, H, W] in [0, 1]. Square: the detector upscales the short side to
    736 px, so a wide strip would cost several times more CPU."""
    image = Image.new("RGB", (192, 192), "white")
    try:
        font = ImageFont.truetype("DejaVuSans.ttf", 24)
    except OSError:
        font = ImageFont.load_default(size=24)
    ImageDraw.Draw(image).text((12, 80), text, fill="black", font=font)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255


@pytest.fixture(scope="module")
def ocr_reward():
    return OcrReward()  # all instances share one lazily created engine


def test_levenshtein_matches_hand_computed_distances():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert levenshtein("flaw", "lawn") == 2
    assert levenshtein("same", "same") == 0


def test_text_match_score_normalises_and_clips():
    assert text_match_score("Hello World", "helloworld") == 1.0  # case and spaces ignored
    assert text_match_score("a big HELLO sign", "hello") == 1.0  # target inside the recognised text
    assert text_match_score("helo", "hello") == pytest.approx(0.8)
    assert text_match_score("completely different text", "abc") == 0.0  # distance clipped at len(target)
    assert text_match_score("", "abcd") == 0.0


def test_target_is_first_quoted_span_and_missing_quotes_raise():
    assert quoted_target('a sign saying "OPEN" and "CLOSED"') == "OPEN"
    with pytest.raises(ValueError, match="a cat on a mat"):
        quoted_target("a cat on a mat")
    with pytest.raises(ValueError, match="empty"):
        quoted_target('a blank sign ""')


def test_registered_names():
    assert rewards.get("ocr") is OcrReward
    assert rewards.get("video_ocr") is VideoOcrReward


def test_real_ocr_exact_partial_and_blank(ocr_reward):
    hello = render("HELLO WORLD")
    samples = torch.stack([hello, hello, render("")])
    prompts = [
        'a poster that says "hello world"',  # exact (normalised) -> 1
        'a poster that says "HELLO WORLX"',  # one substitution over 10 characters -> 0.9
        'a poster that says "HELLO"',  # nothing to read -> 0
    ]
    out = ocr_reward(samples, prompts)
    assert out.score.dtype == torch.float32
    assert out.score.tolist() == pytest.approx([1.0, 0.9, 0.0])
    assert out.components["exact_match"].tolist() == [1.0, 0.0, 0.0]


def test_prompt_without_quotes_is_an_error_naming_it(ocr_reward):
    with pytest.raises(ValueError, match="no quotes here"):
        ocr_reward(torch.stack([render("HELLO")]), ["no quotes here"])


def test_video_ocr_averages_every_kth_frame():
    video = torch.stack([render("HELLO"), render("")]).unsqueeze(0)  # [1, F=2, 3, H, W]
    prompt = ['a video of the word "hello"']
    assert VideoOcrReward(frame_stride=1)(video, prompt).score.tolist() == pytest.approx([0.5])
    assert VideoOcrReward(frame_stride=2)(video, prompt).score.tolist() == pytest.approx([1.0])
    with pytest.raises(ConfigError, match="frame_stride"):
        VideoOcrReward(frame_stride=0)
