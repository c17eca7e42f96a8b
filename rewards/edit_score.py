"""What the edit rewards (``shapes_edit``, ``unifiedreward_edit``) share: the source image each sample is compared
with, their two terms and how they combine.

The source image of a sample is its prompt's ``metadata["source_image"]`` (``flowzoo/source_images.py``: an image
path or a [C, H, W] tensor in [0, 1]); an edit reward without it raises a one-line ConfigError naming the reward and
the prompt.

Every edit reward scores two terms in [0, 1], logged as the components ``edit`` (the asked change is in the output:
instruction following) and ``preserve`` (what the instruction did not ask for is unchanged), so edit RL's own
failure, changing what was not asked, is measured apart from the edit itself. The score is their weighted mean,

    score = (edit_weight * edit + preserve_weight * preserve) / (edit_weight + preserve_weight),

so the weights are relative and the score stays in [0, 1] whatever they are. Defaults 0.5 / 0.5 (ours: neither term
dominates; a policy that does nothing scores 0.5 on a perfect preserve term, one that redraws the scene with the edit
also about 0.5, only the minimal edit reaches 1).
"""

from __future__ import annotations

import torch

from flowzoo.errors import ConfigError
from flowzoo.models.tiny_data import pil_to_tensor
from flowzoo.rewards.base import RewardOutput
from flowzoo.source_images import SOURCE_IMAGE, read_source_image, source_of

EDIT_WEIGHT = 0.5
PRESERVE_WEIGHT = 0.5


def check_weights(edit_weight: float, preserve_weight: float, reward: str) -> tuple[float, float]:
    """Both weights >= 0 and not both 0; a one-line ConfigError naming ``reward`` and the values otherwise."""
    try:
        weights = float(edit_weight), float(preserve_weight)
    except (TypeError, ValueError):
        weights = None
    if weights is None or min(weights) < 0 or sum(weights) <= 0 or not all(map(torch.isfinite, torch.tensor(weights))):
        raise ConfigError(f"{reward} reward: edit_weight and preserve_weight must be finite numbers >= 0, not both 0; "
                          f"got edit_weight={edit_weight!r}, preserve_weight={preserve_weight!r}")
    return weights


def edit_output(edit: torch.Tensor, preserve: torch.Tensor, weights: tuple[float, float]) -> RewardOutput:
    """The reward's output: the weighted mean of the two terms [B] as the score, both terms as components."""
    edit, preserve = edit.float(), preserve.float()
    score = (weights[0] * edit + weights[1] * preserve) / (weights[0] + weights[1])
    return RewardOutput(score, {"edit": edit, "preserve": preserve})


def source_image(metadata: dict | None, prompt: str, reward: str) -> torch.Tensor:
    """The prompt's source image as an RGB float tensor [3, H, W] in [0, 1]; a one-line ConfigError naming ``reward``
    and ``prompt`` when it is missing, unreadable or not RGB."""
    where = f"{reward} reward, prompt {prompt!r}"
    if source_of(metadata) is None:
        raise ConfigError(f"{where}: no source image in metadata[{SOURCE_IMAGE!r}] (an image path or a [C, H, W] "
                          "tensor in [0, 1]); an edit reward compares each sample with its prompt's source")
    image = read_source_image(metadata, where)
    if isinstance(image, torch.Tensor):
        image = image[0]
    else:  # a PIL image, already RGB
        image = pil_to_tensor(image)
    if image.shape[0] != 3:
        raise ConfigError(f"{where}: the source image must be RGB [3, H, W], got shape {tuple(image.shape)}")
    return image
