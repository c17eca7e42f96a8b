"""Text-rendering rewards: ``ocr`` for images and ``video_ocr`` for videos.

The reward follows Flow-GRPO's OCR scorer (Liu et al. 2025, "Flow-GRPO", ``flow_grpo/ocr.py``):

* the target text is what the prompt puts between its first pair of double quotes
  (``'A sign that says "Open 24 hours"'`` -> ``Open 24 hours``);
* the recognised text is every OCR line of the image joined in reading order;
* both are normalised by dropping spaces and lower-casing (so ``"Open 24"`` and ``"OPEN24"`` match);
* if the target occurs inside the recognised text the distance is 0 (extra text elsewhere in the image is not
  penalised), otherwise it is the Levenshtein distance between the two normalised strings;
* ``score = 1 - min(distance, len(target)) / len(target)``, in [0, 1]; component ``exact_match`` = 1 where the score
  is 1 (the evaluation's strict figure).

The OCR engine is rapidocr-onnxruntime (PP-OCRv4 detection + recognition ONNX models shipped in its wheel), so
this reward runs on CPU with no download. One engine is created lazily per process and shared by every instance.

Unlike Flow-GRPO, which scores 0 when OCR throws, a prompt without quoted text raises ``ValueError`` naming the
prompt: it is a dataset bug, and training on a silent 0 would hide it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from flowzoo.errors import ConfigError
from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput

_ENGINE: Any = None
_ENGINE_LOCK = threading.Lock()


def ocr_engine() -> Any:
    """The process-wide RapidOCR engine, created on first use (loading takes about a second)."""
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            from rapidocr_onnxruntime import RapidOCR

            _ENGINE = RapidOCR()
        return _ENGINE


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions each cost 1), two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def quoted_target(prompt: str) -> str:
    """The text between the first pair of double quotes; ValueError when there is none (or it is empty)."""
    parts = prompt.split('"')
    if len(parts) < 3 or not normalise_text(parts[1]):
        raise ValueError(f"ocr reward: prompt has no non-empty text between double quotes: {prompt!r}")
    return parts[1]


def normalise_text(text: str) -> str:
    """Spaces removed, lower-cased (Flow-GRPO's normalisation)."""
    return text.replace(" ", "").lower()


def text_match_score(recognised: str, target: str) -> float:
    """Flow-GRPO's score: 1 - min(levenshtein, len(target)) / len(target) on normalised strings."""
    recognised, target = normalise_text(recognised), normalise_text(target)
    if not target:
        raise ValueError("ocr reward: empty target text")
    distance = 0 if target in recognised else levenshtein(recognised, target)
    return 1.0 - min(distance, len(target)) / len(target)


def to_uint8_bgr(image: torch.Tensor) -> Any:
    """[3, H, W] float in [0, 1] -> contiguous uint8 [H, W, 3] in BGR order (what RapidOCR expects of arrays)."""
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"ocr reward: expected an RGB image [3, H, W], got shape {tuple(image.shape)}")
    hwc = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return hwc[:, :, ::-1].copy()


def recognise(image: torch.Tensor, upscale: int = 1, pad: int = 0) -> str:
    """All text lines the OCR engine finds in one image, joined in its reading order ('' when none).

    Small images (the tiny tier's 16x48 strips) need help: ``pad`` replicates the border ``pad`` pixels outwards
    (PP-OCR's detector drops characters that touch the edge) and ``upscale`` > 1 then enlarges the image (bicubic)."""
    if pad > 0:
        image = torch.nn.functional.pad(image[None].float(), (pad, pad, pad, pad), mode="replicate")[0]
    if upscale > 1:
        image = torch.nn.functional.interpolate(image[None].float(), scale_factor=upscale, mode="bicubic")[0]
    result, _ = ocr_engine()(to_uint8_bgr(image), use_cls=False)
    if not result:
        return ""
    return "".join(line[1] for line in result)


@register("ocr")
class OcrReward(Reward):
    """Flow-GRPO's OCR reward on images [B, 3, H, W] in [0, 1]; see the module docstring for the exact rule."""

    accepts = ("image",)
    bounds = (0.0, 1.0)

    def __init__(self, upscale: int = 1, pad: int = 0):
        if not isinstance(upscale, int) or upscale < 1:
            raise ConfigError(f"ocr reward: upscale must be a positive integer, got {upscale!r}")
        if not isinstance(pad, int) or pad < 0:
            raise ConfigError(f"ocr reward: pad must be a non-negative integer, got {pad!r}")
        self.upscale, self.pad = upscale, pad  # the tiny tier's 16x48 glyph strips: upscale=2, pad=4

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        targets = [quoted_target(p) for p in prompts]  # fail before running OCR on anything
        scores = [text_match_score(recognise(image, self.upscale, self.pad), target) for image, target in zip(samples, targets)]
        score = torch.tensor(scores, dtype=torch.float32)
        return RewardOutput(score, {"exact_match": (score == 1).float()})  # the target read without an error


@register("video_ocr")
class VideoOcrReward(Reward):
    """The OCR reward on videos [B, F, 3, H, W]: frames 0, k, 2k, ... are scored and averaged (k = ``frame_stride``)."""

    accepts = ("video",)
    bounds = (0.0, 1.0)  # the mean of frames' OCR scores

    def __init__(self, frame_stride: int = 4):
        if not isinstance(frame_stride, int) or frame_stride < 1:
            raise ConfigError(f"video_ocr reward: frame_stride must be a positive integer, got {frame_stride!r}")
        self.frame_stride = frame_stride

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        if samples.ndim != 5:
            raise ValueError(f"video_ocr reward: expected videos [B, F, C, H, W], got shape {tuple(samples.shape)}")
        targets = [quoted_target(p) for p in prompts]
        scores = []
        for video, target in zip(samples, targets):
            frames = video[:: self.frame_stride]
            scores.append(sum(text_match_score(recognise(frame), target) for frame in frames) / len(frames))
        return RewardOutput(torch.tensor(scores, dtype=torch.float32))
