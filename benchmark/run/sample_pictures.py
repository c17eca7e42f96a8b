"""Pictures of samples for run directories: a scatter plot for points, a grid for images, first frames for video.

Beside every ``samples/step_N.png`` goes ``samples/step_N.json``, what a reader needs to caption or redraw it:
``kind``, ``prompts`` (the prompt of each sample, in the order the grid shows them: row by row), for image and
video grids ``columns`` and ``shown`` (how many samples the grid holds), for points the coordinates ``points``
(rounded to 1e-5). Trackers caption the grid with the prompts; the report redraws the toy tier's points with the
rewarded region and each sample's reward (:mod:`benchmark.render.samples`).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import torch

from flowzoo.io import atomic_write, atomic_write_text

#: the samples an image or video grid shows at most
MAX_GRID = 64
#: the toy tier's scatter plot spans [-LIMIT, LIMIT] on both axes; points beyond are drawn on the border as triangles
LIMIT = 3.2


def image_grid(images: torch.Tensor, columns: int | None = None) -> "PIL.Image.Image":  # noqa: F821
    """[B, C, H, W] in [0, 1] -> one PIL image with the samples in a grid."""
    from PIL import Image

    b, c, h, w = images.shape
    columns = columns or grid_columns(b)
    rows = math.ceil(b / columns)
    grid = torch.ones(c, rows * h, columns * w)
    for i in range(b):
        r, col = divmod(i, columns)
        grid[:, r * h : (r + 1) * h, col * w : (col + 1) * w] = images[i].float().clamp(0, 1)
    array = (grid.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    return Image.fromarray(array[..., 0] if c == 1 else array)


def grid_columns(count: int) -> int:
    """Columns of a grid of ``count`` samples (a square as near as possible)."""
    return max(1, math.ceil(math.sqrt(count)))


def outside(points: torch.Tensor, limit: float) -> torch.Tensor:
    """Which points lie outside the square [-limit, limit]^2 (NaN/inf included)."""
    finite = torch.isfinite(points).all(dim=1)
    return ~finite | (points.abs() > limit).any(dim=1)


def on_border(points: torch.Tensor, limit: float) -> torch.Tensor:
    """Points pulled onto the border of [-limit, limit]^2 along their direction from the origin (non-finite -> a
    corner), so a point outside the axes is drawn where it left them."""
    points = torch.nan_to_num(points.float(), nan=limit, posinf=limit, neginf=-limit)
    scale = points.abs().amax(dim=1, keepdim=True).clamp_min(limit) / limit
    return points / scale


def save_samples(samples: torch.Tensor, kind: str, path: str | Path, labels: list[str] | None = None,
                 rewards: list[float] | None = None) -> None:
    """Write a PNG of ``samples`` (as ``FlowModel.decode`` returns them) and its JSON sidecar, each atomically; the
    sidecar holds each sample's prompt (``labels``) and, when given, its reward (``rewards``, in sample order)."""
    path = Path(path)
    buffer = io.BytesIO()
    sidecar: dict = {"kind": kind, "prompts": list(labels) if labels is not None else None}
    if rewards is not None:
        sidecar["rewards"] = [round(float(r), 5) if math.isfinite(r) else str(r) for r in rewards]
    if kind == "points":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(4, 4), dpi=80)
        points = samples.float().cpu()
        out = outside(points, LIMIT)
        shown = on_border(points, LIMIT)
        groups = [(label, torch.tensor([lab == label for lab in labels])) for label in sorted(set(labels))] \
            if labels is not None else [(None, torch.ones(len(points), dtype=torch.bool))]
        for label, mask in groups:
            inside = mask & ~out
            dots = ax.scatter(shown[inside, 0], shown[inside, 1], s=4, label=label)
            if (mask & out).any():
                ax.scatter(shown[mask & out, 0], shown[mask & out, 1], s=28, marker="^", color=dots.get_facecolor(),
                           edgecolors="black", linewidths=0.5, clip_on=False)
        if labels is not None:
            ax.legend(fontsize=6, loc="upper right")
        if out.any():
            ax.set_title(f"{int(out.sum())} of {len(points)} samples outside the axes (triangles)", fontsize=7,
                         color="#b00020")
        ax.set_xlim(-LIMIT, LIMIT)
        ax.set_ylim(-LIMIT, LIMIT)
        ax.set_aspect("equal")
        fig.tight_layout()
        fig.savefig(buffer, format="png")
        plt.close(fig)
        sidecar["points"] = [[round(float(v), 5) if math.isfinite(v) else str(v) for v in p] for p in points.tolist()]
    else:
        images = (samples[:, 0] if kind == "video" else samples)[:MAX_GRID]
        columns = grid_columns(len(images))
        image_grid(images, columns).save(buffer, format="PNG")
        sidecar.update(columns=columns, shown=len(images))
        if labels is not None:
            sidecar["prompts"] = list(labels)[:MAX_GRID]
        if rewards is not None:
            sidecar["rewards"] = sidecar["rewards"][:MAX_GRID]
    atomic_write(path, lambda f: f.write(buffer.getvalue()), mode="wb")
    atomic_write_text(path.with_suffix(".json"), json.dumps(sidecar) + "\n")
