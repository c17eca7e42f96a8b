"""Pictures of samples for run directories: a scatter plot for points, a grid for images, first frames for video."""

from __future__ import annotations

import io
import math
from pathlib import Path

import torch

from flowzoo.io import atomic_write


def image_grid(images: torch.Tensor, columns: int | None = None) -> "PIL.Image.Image":  # noqa: F821
    """[B, C, H, W] in [0, 1] -> one PIL image with the samples in a grid."""
    from PIL import Image

    b, c, h, w = images.shape
    columns = columns or math.ceil(math.sqrt(b))
    rows = math.ceil(b / columns)
    grid = torch.ones(c, rows * h, columns * w)
    for i in range(b):
        r, col = divmod(i, columns)
        grid[:, r * h : (r + 1) * h, col * w : (col + 1) * w] = images[i].float().clamp(0, 1)
    array = (grid.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    return Image.fromarray(array[..., 0] if c == 1 else array)


def save_samples(samples: torch.Tensor, kind: str, path: str | Path, labels: list[str] | None = None) -> None:
    """Write a PNG of ``samples`` (as ``FlowModel.decode`` returns them) atomically."""
    buffer = io.BytesIO()
    if kind == "points":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(4, 4), dpi=80)
        points = samples.float().cpu()
        if labels is not None:
            for label in sorted(set(labels)):
                mask = torch.tensor([lab == label for lab in labels])
                ax.scatter(points[mask, 0], points[mask, 1], s=4, label=label)
            ax.legend(fontsize=6, loc="upper right")
        else:
            ax.scatter(points[:, 0], points[:, 1], s=4)
        ax.set_xlim(-3.2, 3.2)
        ax.set_ylim(-3.2, 3.2)
        ax.set_aspect("equal")
        fig.tight_layout()
        fig.savefig(buffer, format="png")
        plt.close(fig)
    else:
        images = samples[:, 0] if kind == "video" else samples
        image_grid(images[:64]).save(buffer, format="PNG")
    atomic_write(path, lambda f: f.write(buffer.getvalue()), mode="wb")
