"""The one markdown table writer (GitHub's pipe tables), for every page, doc and printed table of the project.

It lives in ``flowzoo`` (the package every layer may import) so that the lower benchmark rooms (``config``: the
recipes page docs/recipes.md; ``run``: ``flowzoo memory``) write their tables with it too; the pages of
``benchmark/render`` and above import it through :mod:`benchmark.render.tables`."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def markdown_table(headers: Sequence[Any], rows: Iterable[Sequence[Any]], pipe: str | None = None) -> list[str]:
    """The lines of a pipe table: the header row, its ``|---|`` rule and one line per row, each cell through ``str``.

    ``pipe``: what a ``|`` inside a header or cell becomes, so it cannot split the cell (``"\\|"`` escapes it, ``"/"``
    replaces it); None leaves the text as it is (cells that cannot hold one, or that carry markdown of their own)."""
    def line(cells: Sequence[Any]) -> str:
        texts = [str(cell) if pipe is None else str(cell).replace("|", pipe) for cell in cells]
        return "| " + " | ".join(texts) + " |"

    return [line(headers), "|" + "|".join("---" for _ in headers) + "|", *(line(row) for row in rows)]
