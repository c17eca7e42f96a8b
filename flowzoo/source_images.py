"""A prompt's source image: the input image of an instruction-editing model, carried in the prompt's metadata.

An edit prompt is an instruction (the prompt text) and a source image, ``metadata["source_image"]``: the absolute path
of an image file (what the prompt sources give: ``benchmark/prompts/files.py`` resolves a prompt file's relative
``image`` paths against the file's folder) or an in-memory image tensor [C, H, W] with values in [0, 1]. Metadata
already travels with every sample (rollouts, the replay buffer, evaluation, rewards), so the source stays with each
sample. Two edit prompts with the same instruction and different sources are different conditions:
:func:`condition_key` is what tells them apart (OP-GRPO's buffer keys its entries by it).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from flowzoo.errors import ConfigError
from flowzoo.io import file_digest

#: the metadata key of a prompt's source image
SOURCE_IMAGE = "source_image"


def source_of(metadata: dict | None) -> Any:
    """The source image of a prompt's metadata (a path string or a tensor), or None for a text-only prompt."""
    return None if metadata is None else metadata.get(SOURCE_IMAGE)


def condition_key(prompt: str, metadata: dict | None) -> str:
    """What identifies a prompt's condition: the prompt text, joined by its source image's identity when it has one
    (the path, or a digest of a tensor's values), so a text-only prompt's key is its text."""
    source = source_of(metadata)
    if source is None:
        return prompt
    if isinstance(source, (str, os.PathLike)):
        return f"{prompt}\x00{os.fspath(source)}"
    import torch

    if isinstance(source, torch.Tensor):
        digest = hashlib.sha256(source.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        return f"{prompt}\x00tensor{tuple(source.shape)}:{digest.hexdigest()[:16]}"
    raise ConfigError(f"metadata {SOURCE_IMAGE!r} of prompt {prompt!r} must be an image path or a [C, H, W] tensor, "
                      f"got {type(source).__name__}")


def portable_condition_key(prompt: str, metadata: dict | None) -> str:
    """:func:`condition_key` with a source image file named by a digest of its bytes instead of its path: the same
    for the same prompt and image wherever the file lies (another checkout, another machine), so what is written
    with it (``flowzoo eval --out``'s samples) pairs across them and holds no machine's paths."""
    source = source_of(metadata)
    if isinstance(source, (str, os.PathLike)):
        return f"{prompt}\x00file:{_file_digest(os.fspath(source))}"
    return condition_key(prompt, metadata)


_DIGESTS: dict[str, str] = {}


def _file_digest(path: str) -> str:
    """The first 16 hex digits of the file's sha256 (cached per path for the process); a missing file is a one-line
    ConfigError."""
    if path not in _DIGESTS:
        try:
            _DIGESTS[path] = file_digest(path)
        except OSError as err:
            raise ConfigError(f"source image {path!r} cannot be read ({err.strerror})") from None
    return _DIGESTS[path]


def check_image_file(path: Path, where: str) -> None:
    """A one-line ConfigError naming ``where`` unless ``path`` is an image file PIL can identify (its header only: a
    prompt file of thousands of pairs is checked without decoding them)."""
    if not path.is_file():
        raise ConfigError(f"{where}: source image {str(path)!r} does not exist")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path):  # reads the header only: the file is an image PIL can open
            pass
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise ConfigError(f"{where}: source image {str(path)!r} is not a readable image ({err})") from None


def read_source_image(metadata: dict | None, where: str):
    """The source image of a prompt as the pipelines' image processor takes it: an RGB PIL image (from a path) or a
    float tensor [1, C, H, W] in [0, 1]. A one-line ConfigError naming ``where`` when it is missing or unreadable."""
    source = source_of(metadata)
    if source is None:
        raise ConfigError(f"{where}: an edit model needs each prompt's source image in metadata[{SOURCE_IMAGE!r}] "
                          "(an image path, or a [C, H, W] tensor in [0, 1]); this prompt has none")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        check_image_file(path, where)
        from PIL import Image

        with Image.open(path) as image:
            return image.convert("RGB")
    import torch

    if not isinstance(source, torch.Tensor) or source.dim() != 3 or not source.is_floating_point():
        raise ConfigError(f"{where}: metadata[{SOURCE_IMAGE!r}] must be an image path or a float [C, H, W] tensor in "
                          f"[0, 1], got {type(source).__name__}{tuple(getattr(source, 'shape', ()))}")
    if source.numel() and (source.min() < 0 or source.max() > 1):
        raise ConfigError(f"{where}: the source image tensor's values must lie in [0, 1], got "
                          f"[{float(source.min()):.3g}, {float(source.max()):.3g}]")
    return source[None].float()
