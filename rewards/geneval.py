"""``geneval``: GenEval-style compositional reward (Ghosh et al. 2023, "GenEval"), with partial credit for training.

Each sample's metadata is a GenEval record: ``tag`` (single_object, two_object, counting, colors, position,
color_attr), ``include`` [{class, count, color?, position?: [relation, index of an earlier include]}] and
``exclude`` [{class, count}]. The image goes through an object detector, then the checks of GenEval's
``evaluate_images.py`` run on the detections:

* detections below the confidence threshold are dropped (0.3, or 0.9 for ``counting`` prompts, as GenEval), the rest
  are sorted by confidence and at most 16 kept per class;
* include: at least ``count`` objects of the class (the ``count`` most confident are "found"); if a ``color`` is
  asked, at least ``count`` of the found objects have it; if a ``position`` is asked, every found object stands in
  that relation to every found object of the referenced include (which must itself have passed);
* exclude: fewer than ``count`` objects of the class;
* relation of A to B: centre offset shrunk by 0.1 x (sum of box sizes) per axis, normalised; "left of"/"right of"
  when its x part < -0.5 / > 0.5, "above"/"below" likewise in y (image y grows downwards).

``score`` is the fraction of checks satisfied (count, colour and position of each include, each exclude) -- a dense
training signal; a colour or position check whose object was not found counts as failed -- and component
``strict_accuracy`` is GenEval's 0/1 "all satisfied"; argument ``score: strict`` makes the 0/1 the score (a sparse
reward) and logs the partial credit as component ``partial_score``.

Pluggable parts, so the checks can be tested without a model:

* ``detector``: ``images [B, 3, H, W] -> list (per image) of Detection``; by default ``TransformersDetector``, any
  ``AutoModelForObjectDetection`` directory (``path`` or ``FLOWZOO_GENEVAL_DETECTOR_PATH``; e.g. a DETR/OWL/YOLOS
  COCO detector). GenEval itself uses Mask2Former from mmdetection, so absolute numbers differ from the paper's.
* ``color_of``: ``(image [3, H, W], Detection) -> colour name``. The default, ``dominant_color``, is a hue/saturation/
  value rule on the median pixel of the box's central half -- a documented heuristic, not GenEval's CLIP zero-shot
  colour classifier on the segmentation mask.
"""

from __future__ import annotations

import colorsys
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from flowzoo.errors import ConfigError
from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput
from flowzoo.rewards.weights import local_weights, to_pil_images

THRESHOLD = 0.3
COUNTING_THRESHOLD = 0.9
MAX_OBJECTS = 16
POSITION_THRESHOLD = 0.1
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")


@dataclass(frozen=True)
class Detection:
    label: str  # class name as GenEval spells it (COCO names, lower case)
    confidence: float
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels


def relative_position(a: Detection, b: Detection) -> set[str]:
    """Relations of A to B ("left of", "right of", "above", "below"), GenEval's rule (module docstring)."""
    center_a = ((a.box[0] + a.box[2]) / 2, (a.box[1] + a.box[3]) / 2)
    center_b = ((b.box[0] + b.box[2]) / 2, (b.box[1] + b.box[3]) / 2)
    size_sum = (
        abs(a.box[2] - a.box[0]) + abs(b.box[2] - b.box[0]),
        abs(a.box[3] - a.box[1]) + abs(b.box[3] - b.box[1]),
    )
    offset = [center_a[i] - center_b[i] for i in range(2)]
    revised = [
        max(abs(offset[i]) - POSITION_THRESHOLD * size_sum[i], 0.0) * (1 if offset[i] > 0 else -1) for i in range(2)
    ]
    if all(abs(r) < 1e-3 for r in revised):
        return set()
    norm = (offset[0] ** 2 + offset[1] ** 2) ** 0.5
    dx, dy = revised[0] / norm, revised[1] / norm
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


def dominant_color(image: torch.Tensor, detection: Detection) -> str:
    """Colour name of the median pixel in the central half of the box (hue/saturation/value thresholds)."""
    height, width = image.shape[-2:]
    x0, y0, x1, y1 = detection.box
    cx0, cx1 = x0 + (x1 - x0) / 4, x1 - (x1 - x0) / 4
    cy0, cy1 = y0 + (y1 - y0) / 4, y1 - (y1 - y0) / 4
    left, right = max(0, int(cx0)), min(width, max(int(cx1 + 0.5), int(cx0) + 1))
    top, bottom = max(0, int(cy0)), min(height, max(int(cy1 + 0.5), int(cy0) + 1))
    crop = image[:, top:bottom, left:right].reshape(3, -1)
    if crop.shape[1] == 0:
        return "unknown"
    red, green, blue = crop.float().median(dim=1).values.clamp(0, 1).tolist()
    hue, saturation, value = colorsys.rgb_to_hsv(red, green, blue)
    hue *= 360
    if value < 0.2:
        return "black"
    if saturation < 0.2:
        return "white" if value > 0.75 else ("black" if value < 0.35 else "gray")
    if hue < 15 or hue >= 345:
        return "pink" if saturation < 0.5 and value > 0.7 else ("brown" if value < 0.55 else "red")
    if hue < 45:
        return "brown" if value < 0.65 else "orange"
    if hue < 70:
        return "yellow"
    if hue < 170:
        return "green"
    if hue < 260:
        return "blue"
    if hue < 290:
        return "purple"
    return "pink"


@dataclass
class CheckResult:
    passed: int
    total: int
    reasons: list[str]

    @property
    def strict(self) -> bool:
        return self.passed == self.total


def geneval_checks(
    image: torch.Tensor, detections: Sequence[Detection], metadata: dict, color_of: Callable = dominant_color
) -> CheckResult:
    """Run GenEval's include/exclude checks on one image's detections; count passed checks for partial credit."""
    threshold = COUNTING_THRESHOLD if metadata.get("tag") == "counting" else THRESHOLD
    objects: dict[str, list[Detection]] = {}
    for det in sorted(detections, key=lambda d: -d.confidence):
        if det.confidence > threshold and len(objects.setdefault(det.label.lower(), [])) < MAX_OBJECTS:
            objects[det.label.lower()].append(det)

    passed, total, reasons = 0, 0, []
    matched_groups: list[list[Detection] | None] = []
    for req in metadata.get("include", []):
        name, count = req["class"].lower(), int(req["count"])
        found = objects.get(name, [])[:count]
        matched = len(found) >= count
        total += 1 + ("color" in req) + ("position" in req)
        if matched:
            passed += 1
        else:
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        if "color" in req:
            colors = [color_of(image, det) for det in found]
            if matched and colors.count(req["color"]) >= count:
                passed += 1
            else:
                matched = False
                reasons.append(f"expected {req['color']} {name}>={count}, found colours {colors}")
        if "position" in req:
            relation, target_index = req["position"]
            targets = matched_groups[target_index] if target_index < len(matched_groups) else None
            if not matched:
                reasons.append(f"{name} position not checked: object or colour check failed")
            elif targets is None:
                matched = False
                reasons.append(f"no target for {name} to be {relation}")
            elif all(relation in relative_position(obj, target) for obj in found for target in targets):
                passed += 1
            else:
                matched = False
                reasons.append(f"expected {name} {relation} target")
        matched_groups.append(found if matched else None)
    for req in metadata.get("exclude", []):
        name, count = req["class"].lower(), int(req["count"])
        total += 1
        if len(objects.get(name, [])) < count:
            passed += 1
        else:
            reasons.append(f"expected {name}<{count}, found {len(objects.get(name, []))}")
    return CheckResult(passed, total, reasons)


class TransformersDetector:
    """Any ``AutoModelForObjectDetection`` + ``AutoImageProcessor`` directory -> per-image Detection lists."""

    def __init__(self, directory: str | os.PathLike, device: str = "cpu", min_confidence: float = THRESHOLD):
        from transformers import AutoImageProcessor, AutoModelForObjectDetection

        self.device = torch.device(device)
        self.model = AutoModelForObjectDetection.from_pretrained(directory).to(self.device).eval()
        self.processor = AutoImageProcessor.from_pretrained(directory)
        self.min_confidence = min_confidence

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> list[list[Detection]]:
        pil = to_pil_images(images, "geneval")
        inputs = self.processor(images=pil, return_tensors="pt").to(self.device)
        outputs = self.model(**inputs)
        sizes = [(image.height, image.width) for image in pil]
        results = self.processor.post_process_object_detection(
            outputs, threshold=self.min_confidence, target_sizes=sizes
        )
        id2label = self.model.config.id2label
        return [
            [
                Detection(str(id2label[int(label)]).lower(), float(score), tuple(float(v) for v in box))
                for score, label, box in zip(result["scores"], result["labels"], result["boxes"])
            ]
            for result in results
        ]


#: what a GenEval reward returns as its score: the fraction of checks passed (GenEval's partial credit, the default)
#: or 1 only when every check passes (GenEval's strict accuracy: a sparse binary reward; ours for the tiny tier's
#: sparse task, docs/tiny.md). The other is logged as a component either way.
SCORE_KINDS = ("partial", "strict")


def check_score_kind(score: str, reward: str) -> str:
    if score not in SCORE_KINDS:
        raise ConfigError(f"{reward} reward: unknown score {score!r}; valid: {', '.join(SCORE_KINDS)}")
    return score


@register("geneval")
class GenEval(Reward):
    accepts = ("image",)
    bounds = (0.0, 1.0)  # strict: 0 or 1; partial: the share of checks passed
    #: an image without any detection scores 0 partial credit (else an empty canvas earns the exclude checks' credit)
    empty_image_scores_zero: ClassVar[bool] = False
    #: what the error about missing metadata suggests
    metadata_hint: ClassVar[str] = "expected GenEval records with tag/include/exclude"

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        device: str = "cpu",
        detector: Callable[[torch.Tensor], list[list[Detection]]] | None = None,
        color_of: Callable[[torch.Tensor, Detection], str] = dominant_color,
        score: str = "partial",
    ):
        self.score_kind = check_score_kind(score, self.name)
        if detector is None:
            detector = TransformersDetector(local_weights(self.name, path, "FLOWZOO_GENEVAL_DETECTOR_PATH"), device)
        self.detector = detector
        self.color_of = color_of

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        for prompt, meta in zip(prompts, metadata):
            if not meta.get("include"):
                raise ConfigError(
                    f"{self.name} reward: metadata of prompt {prompt!r} has no 'include' list "
                    f"({self.metadata_hint}), got keys {sorted(meta)}"
                )
        detections = self.detector(samples)
        if len(detections) != samples.shape[0]:
            raise ValueError(
                f"{self.name} reward: detector returned {len(detections)} results for {samples.shape[0]} images"
            )
        results = [
            geneval_checks(image, dets, meta, self.color_of)
            for image, dets, meta in zip(samples, detections, metadata)
        ]
        partial = torch.tensor(
            [0.0 if self.empty_image_scores_zero and not dets else r.passed / r.total for r, dets in zip(results, detections)],
            dtype=torch.float32,
        )
        strict = torch.tensor([float(r.strict) for r in results], dtype=torch.float32)
        if self.score_kind == "strict":
            return RewardOutput(strict, {"strict_accuracy": strict, "partial_score": partial})
        return RewardOutput(partial, {"strict_accuracy": strict})
