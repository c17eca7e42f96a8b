"""``shapes_geneval``: GenEval's checks (``rewards.geneval.geneval_checks``) on the tiny tier's shape scenes, with a
deterministic colour-segmentation detector instead of a learned one.

Detector (one image [3, H, W] in [0, 1]):

1. every pixel takes the nearest palette colour (``models.tiny_data.PALETTE``) if it lies within ``color_tolerance``
   (Euclidean RGB distance) of it, else it is background;
2. connected components (4-connectivity, ``scipy.ndimage.label``) of each colour;
3. a component is an object only if it passes the size/extent limits: area >= ``min_area`` of the frame, bounding
   box no wider/taller than ``max_extent`` of the frame, aspect ratio within ``max_aspect``. So a full-frame colour
   field, speckle/noise and an empty image contain no object at all;
4. shape from the fill ratio (area / box area) and the vertical offset of the centroid from the box centre (an
   apex-up triangle carries its mass low): square fill >= 0.86; circle 0.66-0.86 with a centred centroid; triangle
   0.36-0.68 with the centroid >= 0.06 box heights below centre; anything else is no object.

Every object gets confidence 1 (so GenEval's 0.9 counting threshold keeps it) and its segmentation colour as its
colour (``color_of``). Position uses GenEval's centre rule on the component boxes.

Score: GenEval's partial credit (fraction of count / colour / position / exclude checks passed), except that an
image with no object scores 0 -- GenEval would credit the "no third circle" exclude check of a counting prompt to
an empty canvas. ``strict_accuracy`` is GenEval's all-checks-passed; with ``score: strict`` it is the score
(a sparse 0/1 reward) and the partial credit is the component ``partial_score``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flowzoo.models.tiny_data import PALETTE
from flowzoo.rewards import register
from flowzoo.rewards.geneval import Detection, GenEval, check_score_kind

SQUARE_MIN_FILL = 0.86
CIRCLE_FILL = (0.66, 0.86)
TRIANGLE_FILL = (0.36, 0.68)
TRIANGLE_MIN_OFFSET = 0.06  # centroid below the box centre, in box heights (apex-up triangle: 1/6)
CIRCLE_MAX_OFFSET = 0.05


@dataclass(frozen=True)
class ColouredDetection(Detection):
    color: str = "unknown"


def detection_color(image: torch.Tensor, detection: Detection) -> str:
    """GenEval's ``color_of`` hook: the segmentation colour the detector found."""
    return getattr(detection, "color", "unknown")


def classify_shape(mask: np.ndarray) -> str | None:
    """'square', 'circle', 'triangle' or None for the pixels ``mask`` [h, w] of one component cropped to its box."""
    height, width = mask.shape
    fill = mask.sum() / mask.size
    rows = np.nonzero(mask)[0]
    offset = ((rows.mean() + 0.5) / height) - 0.5  # centroid below centre, in box heights
    if fill >= SQUARE_MIN_FILL:
        return "square"
    if CIRCLE_FILL[0] <= fill < CIRCLE_FILL[1] and abs(offset) <= CIRCLE_MAX_OFFSET:
        return "circle"
    if TRIANGLE_FILL[0] <= fill < TRIANGLE_FILL[1] and offset >= TRIANGLE_MIN_OFFSET:
        return "triangle"
    return None


class ColourSegmentationDetector:
    """images [B, 3, H, W] in [0, 1] -> per image a list of ColouredDetection (module docstring)."""

    def __init__(self, color_tolerance: float = 0.35, min_area: float = 0.015, max_extent: float = 0.6,
                 max_aspect: float = 1.6):
        self.palette = {name: torch.tensor(rgb) for name, rgb in PALETTE.items()}
        self.color_tolerance = float(color_tolerance)
        self.min_area = float(min_area)
        self.max_extent = float(max_extent)
        self.max_aspect = float(max_aspect)

    def colour_map(self, image: torch.Tensor) -> np.ndarray:
        """[H, W] index into the palette (-1 = background)."""
        colours = torch.stack(list(self.palette.values()))  # [K, 3]
        distance = (image.float().clamp(0, 1)[None] - colours[:, :, None, None]).norm(dim=1)  # [K, H, W]
        best, index = distance.min(dim=0)
        return torch.where(best <= self.color_tolerance, index, -1).numpy()

    def detect(self, image: torch.Tensor) -> list[ColouredDetection]:
        from scipy import ndimage

        if image.ndim != 3 or image.shape[0] != 3:
            raise ValueError(f"shapes_geneval: expected an RGB image [3, H, W], got shape {tuple(image.shape)}")
        height, width = image.shape[-2:]
        colour_index = self.colour_map(image)
        detections = []
        for k, name in enumerate(self.palette):
            labels, count = ndimage.label(colour_index == k)
            for i, box in enumerate(ndimage.find_objects(labels), start=1):
                mask = labels[box] == i
                h, w = mask.shape
                if mask.sum() < self.min_area * height * width:
                    continue
                if h > self.max_extent * height or w > self.max_extent * width:
                    continue
                if max(h, w) > self.max_aspect * min(h, w):
                    continue
                shape = classify_shape(mask)
                if shape is None:
                    continue
                y0, x0 = box[0].start, box[1].start
                detections.append(ColouredDetection(shape, 1.0, (float(x0), float(y0), float(x0 + w), float(y0 + h)), name))
        return detections

    def __call__(self, images: torch.Tensor) -> list[list[ColouredDetection]]:
        return [self.detect(image) for image in images.detach().cpu()]


@register("shapes_geneval")
class ShapesGenEval(GenEval):
    """GenEval partial credit (score) and strict accuracy (component) on shape scenes, with the deterministic
    colour-segmentation detector instead of a neural one; see the module docstring."""

    empty_image_scores_zero = True
    metadata_hint = "use the tiny_shapes prompt source"

    def __init__(self, color_tolerance: float = 0.35, min_area: float = 0.015, max_extent: float = 0.6,
                 max_aspect: float = 1.6, score: str = "partial"):
        self.score_kind = check_score_kind(score, self.name)
        self.detector = ColourSegmentationDetector(color_tolerance, min_area, max_extent, max_aspect)
        self.color_of = detection_color
