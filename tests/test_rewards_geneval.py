"""GenEval checks on hand-made detections, and the transformers detector path on a tiny random YOLOS."""

import pytest
import torch

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.rewards.geneval import Detection, GenEval, TransformersDetector, dominant_color, geneval_checks, relative_position

H, W = 64, 96


def canvas(*patches):
    """A grey image with solid colour rectangles: patches are ((r, g, b), (x0, y0, x1, y1))."""
    image = torch.full((3, H, W), 0.5)
    for rgb, (x0, y0, x1, y1) in patches:
        image[:, y0:y1, x0:x1] = torch.tensor(rgb).view(3, 1, 1)
    return image


RED, BLUE = (0.9, 0.1, 0.1), (0.1, 0.2, 0.9)
CAT_LEFT = Detection("cat", 0.95, (4.0, 20.0, 30.0, 50.0))
DOG_RIGHT = Detection("dog", 0.95, (60.0, 20.0, 90.0, 50.0))


def test_relative_position_follows_geneval():
    assert relative_position(CAT_LEFT, DOG_RIGHT) == {"left of"}
    assert relative_position(DOG_RIGHT, CAT_LEFT) == {"right of"}
    top = Detection("cat", 1.0, (10.0, 0.0, 20.0, 10.0))
    bottom = Detection("dog", 1.0, (10.0, 40.0, 20.0, 50.0))
    assert relative_position(top, bottom) == {"above"}
    overlapping = Detection("dog", 1.0, (6.0, 22.0, 32.0, 52.0))  # offset smaller than 0.1 x box sizes
    assert relative_position(CAT_LEFT, overlapping) == set()


@pytest.mark.parametrize(
    "rgb,name",
    [((0.9, 0.1, 0.1), "red"), ((0.1, 0.8, 0.2), "green"), ((0.1, 0.2, 0.9), "blue"), ((0.95, 0.9, 0.1), "yellow"),
     ((0.02, 0.02, 0.02), "black"), ((0.97, 0.97, 0.97), "white"), ((0.95, 0.55, 0.05), "orange"),
     ((0.55, 0.1, 0.8), "purple")],
)
def test_dominant_color(rgb, name):
    assert dominant_color(canvas((rgb, (10, 10, 40, 40))), Detection("x", 1.0, (10.0, 10.0, 40.0, 40.0))) == name


def test_two_objects_with_colour_and_position_all_satisfied():
    image = canvas((RED, (4, 20, 30, 50)), (BLUE, (60, 20, 90, 50)))
    meta = {"tag": "position", "include": [{"class": "dog", "count": 1, "color": "blue"},
                                           {"class": "cat", "count": 1, "color": "red", "position": ["left of", 0]}]}
    result = geneval_checks(image, [CAT_LEFT, DOG_RIGHT], meta)
    assert (result.passed, result.total, result.strict) == (5, 5, True)


def test_partial_credit_counts_failed_checks():
    image = canvas((RED, (4, 20, 30, 50)), (BLUE, (60, 20, 90, 50)))
    # cat is red (not blue) and left of the dog (not right of): count ok, colour fails, position skipped -> 1/3;
    # dog found -> 1/1. Total 2 of 4.
    meta = {"tag": "position", "include": [{"class": "dog", "count": 1},
                                           {"class": "cat", "count": 1, "color": "blue", "position": ["right of", 0]}]}
    result = geneval_checks(image, [CAT_LEFT, DOG_RIGHT], meta)
    assert (result.passed, result.total, result.strict) == (2, 4, False)
    wrong_side = {"tag": "position", "include": [{"class": "dog", "count": 1},
                                                 {"class": "cat", "count": 1, "position": ["right of", 0]}]}
    assert geneval_checks(image, [CAT_LEFT, DOG_RIGHT], wrong_side).passed == 2  # 2 of 3: position fails


def test_counting_uses_the_high_threshold_and_exclude():
    cats = [Detection("cat", c, (0.0, 0.0, 5.0, 5.0)) for c in (0.99, 0.95, 0.5)]
    counting = {"tag": "counting", "include": [{"class": "cat", "count": 2}], "exclude": [{"class": "cat", "count": 3}]}
    assert geneval_checks(canvas(), cats, counting).strict  # the 0.5 cat is below the 0.9 counting threshold
    three = cats[:2] + [Detection("cat", 0.92, (0.0, 0.0, 5.0, 5.0))]
    result = geneval_checks(canvas(), three, counting)
    assert (result.passed, result.total) == (1, 2)  # too many cats: exclude fails
    single = {"tag": "single_object", "include": [{"class": "cat", "count": 1}]}
    assert geneval_checks(canvas(), [Detection("cat", 0.31, (0.0, 0.0, 5.0, 5.0))], single).strict
    assert not geneval_checks(canvas(), [Detection("cat", 0.29, (0.0, 0.0, 5.0, 5.0))], single).strict


def test_reward_with_a_pluggable_detector_reports_partial_and_strict():
    images = torch.stack([canvas((RED, (4, 20, 30, 50))), canvas()])
    detections = [[CAT_LEFT], []]
    reward = GenEval(detector=lambda batch: detections)
    meta = {"tag": "color_attr", "include": [{"class": "cat", "count": 1, "color": "red"},
                                             {"class": "dog", "count": 1}]}
    out = reward(images, ["a red cat and a dog"] * 2, [meta, meta])
    assert out.score.tolist() == pytest.approx([2 / 3, 0.0])
    assert out.components["strict_accuracy"].tolist() == [0.0, 0.0]
    with pytest.raises(ConfigError, match="a prompt"):
        reward(images[:1], ["a prompt"], [{"tag": "single_object"}])
    assert rewards.get("geneval") is GenEval


@pytest.fixture(scope="module")
def detector_dir(tmp_path_factory):
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    directory = tmp_path_factory.mktemp("tiny_yolos")
    config = YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=37, num_detection_tokens=5, id2label={0: "Cat", 1: "dog"},
                         label2id={"Cat": 0, "dog": 1})
    torch.manual_seed(0)
    YolosForObjectDetection(config).save_pretrained(directory)
    YolosImageProcessor(size={"shortest_edge": 32, "longest_edge": 64}).save_pretrained(directory)
    return directory


def test_transformers_detector_path(detector_dir, monkeypatch):
    images = torch.rand(2, 3, 40, 48, generator=torch.Generator().manual_seed(0))
    detector = TransformersDetector(detector_dir, min_confidence=0.0)
    first, second = detector(images), detector(images)
    assert len(first) == 2 and first == second
    assert len(first[0]) == 5  # threshold 0 keeps all 5 detection tokens
    for det in first[0]:
        assert det.label in {"cat", "dog"}  # id2label, lower-cased
        x0, y0, x1, y1 = det.box
        assert -1 <= x0 <= x1 <= 49 and -1 <= y0 <= y1 <= 41  # boxes in input pixels
    monkeypatch.setenv("FLOWZOO_GENEVAL_DETECTOR_PATH", str(detector_dir))
    out = GenEval()(images, ["a cat"] * 2, [{"tag": "single_object", "include": [{"class": "cat", "count": 1}]}] * 2)
    assert out.score.shape == (2,) and torch.isfinite(out.score).all()
    assert set(out.components) == {"strict_accuracy"}


def test_missing_detector_directory_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.delenv("FLOWZOO_GENEVAL_DETECTOR_PATH", raising=False)
    with pytest.raises(ConfigError) as error:
        GenEval(path=tmp_path / "no_detector")
    assert "\n" not in str(error.value) and "no_detector" in str(error.value)
    assert "FLOWZOO_GENEVAL_DETECTOR_PATH" in str(error.value)
