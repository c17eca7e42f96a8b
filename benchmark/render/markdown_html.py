"""The report's ``index.html``: its markdown rendered by markdown-it-py (CommonMark + tables), in one page with an
inline style sheet (no network, no JavaScript). Raw HTML in the markdown is escaped, not passed through.

Two things are added to what markdown-it renders:

* every heading gets the ``id`` GitHub gives it (:func:`heading_id`; repeated ones get ``-1``, ``-2``, ...), so the
  report's in-page links work in the HTML page and in the markdown on GitHub alike;
* an image whose PNG records its resolution (matplotlib writes it) gets ``width`` = its physical width at 96 CSS px
  an inch, so a figure saved at 144 dpi is shown at the size its fonts were chosen for (capped by the page width).
"""

from __future__ import annotations

import html
import re
import struct
from pathlib import Path

from markdown_it import MarkdownIt

_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.4}"
    "table{border-collapse:collapse;margin:1em 0;display:block;overflow-x:auto;max-width:100%}"
    "th,td{border:1px solid #bbb;padding:3px 8px;text-align:left}"
    "img{max-width:100%;height:auto}td img{max-width:256px}code{background:#f3f3f3}"
)
CSS_PX_PER_INCH = 96


def heading_id(text: str) -> str:
    """GitHub's anchor of a heading: lower case, characters other than letters, digits, spaces, ``-`` and ``_``
    dropped, spaces turned into ``-``."""
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def png_display_width(path: Path) -> int | None:
    """The CSS width of a PNG at its recorded resolution (``pHYs`` in pixels per metre), or None when the file is not
    a PNG or records none (then the browser shows it at its pixel size)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    width = struct.unpack(">I", data[16:20])[0]
    position = 8
    while position + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        if kind == b"pHYs" and length >= 9:
            per_metre, _, unit = struct.unpack(">IIB", data[position + 8:position + 17])
            if unit != 1 or per_metre <= 0:
                return None
            return round(width / (per_metre * 0.0254) * CSS_PX_PER_INCH)
        if kind == b"IDAT":
            return None
        position += 12 + length
    return None


def _text(inline) -> str:
    return "".join(child.content for child in (inline.children or []) if child.type in ("text", "code_inline"))


def markdown_to_html(markdown: str, title: str = "FlowZoo report", base_dir: str | Path | None = None) -> str:
    """A standalone HTML page of ``markdown`` (CommonMark with GitHub-style tables). ``base_dir``: where the
    markdown's relative image paths point (for their display widths); without it images keep their pixel size."""
    md = MarkdownIt("commonmark", {"html": False, "xhtmlOut": False}).enable("table")
    tokens = md.parse(markdown)
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            base = heading_id(_text(tokens[i + 1]))
            count = seen.get(base, 0)
            seen[base] = count + 1
            token.attrSet("id", base if count == 0 else f"{base}-{count}")
        if token.type == "inline" and base_dir is not None:
            for child in token.children or []:
                src = child.attrGet("src") if child.type == "image" else None
                if src and "://" not in src:
                    width = png_display_width(Path(base_dir) / src)
                    if width:
                        child.attrSet("width", str(width))
    body = md.renderer.render(tokens, md.options, {})
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        f'<head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_STYLE}</style></head>',
        "<body>",
        body.rstrip("\n"),
        "</body>",
        "</html>",
        "",
    ])
