"""The report's formatters: numbers and intervals as its tables print them, file-name-safe labels, heading anchors,
the lines that show a figure, and the algorithms' colours."""

from __future__ import annotations

import math
import re
from pathlib import Path

from flowzoo.benchmark.analysis import stats
from flowzoo.benchmark.render import figures
from flowzoo.benchmark.render.markdown_html import heading_id


def anchor(title: str) -> str:
    """The fragment id of a heading, as GitHub makes it (lower case, punctuation dropped, spaces to hyphens) and as
    :mod:`benchmark.render.markdown_html` sets it."""
    return heading_id(title)


def slug(name: str) -> str:
    """A file-name-safe version of a task or algorithm label."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("_") or "unnamed"


def fmt_number(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def fmt_pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def fmt_ci(lo: float, hi: float, fmt=fmt_number, n: int | None = None) -> str:
    if n is not None and n < 2:
        return "n<2"
    return "n/a" if math.isnan(lo) or math.isnan(hi) else f"[{fmt(lo)}, {fmt(hi)}]"


def figure_lines(paths: list[Path], out_dir: Path, alt: str) -> list[str]:
    """A figure's lines: its PNG shown (``alt`` its text), then a link to each other format (SVG)."""
    png, *svg = (p.relative_to(out_dir).as_posix() for p in paths)
    return [f"![{alt}]({png})", ""] + [f"SVG: [{v}]({v})" for v in svg] + ([""] if svg else [])


def palette(analysis: stats.Analysis) -> dict:
    """Each algorithm's colour, line style and marker (:func:`benchmark.render.figures.styles`)."""
    return figures.styles(analysis.summary["algorithm"])
