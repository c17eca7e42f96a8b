"""The report's ``index.html``: its markdown rendered by markdown-it-py (CommonMark + tables), in one page with an
inline style sheet (no network, no JavaScript). Raw HTML in the markdown is escaped, not passed through."""

from __future__ import annotations

import html

from markdown_it import MarkdownIt

_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #bbb;padding:3px 8px;text-align:left}"
    "img{max-width:100%}td img{max-width:256px}code{background:#f3f3f3}"
)


def markdown_to_html(markdown: str, title: str = "FlowZoo report") -> str:
    """A standalone HTML page of ``markdown`` (CommonMark with GitHub-style tables)."""
    body = MarkdownIt("commonmark", {"html": False, "xhtmlOut": False}).enable("table").render(markdown)
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
