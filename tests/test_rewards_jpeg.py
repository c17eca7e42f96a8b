"""JPEG (in)compressibility on real images: a flat image compresses far better than noise."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from flowzoo import rewards
from flowzoo.rewards.jpeg import JpegCompressibility, JpegIncompressibility


def images() -> torch.Tensor:
    flat = torch.full((3, 64, 64), 0.5)
    noise = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0))
    return torch.stack([flat, noise])


def test_flat_image_compresses_better_than_noise():
    size = JpegIncompressibility()(images(), ["", ""]).score
    assert size.shape == (2,)
    assert 0 < size[0] < size[1] / 3  # noise barely compresses
    assert torch.equal(JpegCompressibility()(images(), ["", ""]).score, -size)


def test_size_is_the_pil_quality_95_size_in_kb():
    noise = images()[1]
    array = (noise * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=95)
    size = JpegIncompressibility()(noise[None], [""]).score
    assert size.item() == pytest.approx(len(buffer.getvalue()) / 1000)


def test_registered_and_rejects_non_images():
    assert rewards.get("jpeg_compressibility") is JpegCompressibility
    assert rewards.get("jpeg_incompressibility") is JpegIncompressibility
    with pytest.raises(ValueError, match="RGB images"):
        JpegCompressibility()(torch.rand(2, 1, 8, 8), ["", ""])
