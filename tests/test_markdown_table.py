"""The one markdown table writer (flowzoo/markdown.py; benchmark/render/tables.py hands it to the pages): its lines,
the ``|`` a cell may hold, and no module writing a table rule by hand beside it."""

import re
from pathlib import Path

from flowzoo.benchmark.render import tables
from flowzoo.benchmark.render.markdown_html import markdown_to_html
from flowzoo.markdown import markdown_table

ROOT = Path(__file__).resolve().parents[1]


def test_a_table_is_its_header_its_rule_and_a_line_per_row():
    assert markdown_table(["a", "b"], [[1, "x"], ["", 2.5]]) == ["| a | b |", "|---|---|", "| 1 | x |", "|  | 2.5 |"]
    assert markdown_table(["only"], []) == ["| only |", "|---|"]
    assert tables.markdown_table is markdown_table  # the pages' writer is the one writer


def test_a_pipe_inside_a_cell_is_escaped_or_replaced_so_it_cannot_split_the_cell():
    rows = [["|log ratio|", "**a|b**"]]
    escaped = markdown_table(["unit", "x|y"], rows, pipe="\\|")
    assert escaped == ["| unit | x\\|y |", "|---|---|", "| \\|log ratio\\| | **a\\|b** |"]
    assert markdown_table(["unit"], [["a|b"]], pipe="/")[-1] == "| a/b |"
    assert markdown_table(["unit"], [["a|b"]])[-1] == "| a|b |"  # left as it is without ``pipe``
    page = markdown_to_html("\n".join(escaped) + "\n")
    assert page.count("<td>") == 2 and "|log ratio|" in page  # two cells: the escaped pipes stay text


def test_no_module_writes_a_table_rule_by_hand():
    """Every table goes through the writer: a ``|---`` rule written anywhere else is a second writer."""
    allowed = {"flowzoo/markdown.py"}
    found = []
    for package in ("algorithms", "benchmark", "flowzoo", "models", "rewards"):
        for path in (ROOT / package).rglob("*.py"):
            name = path.relative_to(ROOT).as_posix()
            if name not in allowed and re.search(r"""["']\|-{3}|-{3}\|["']""", path.read_text()):
                found.append(name)
    assert not found, f"tables written by hand (use flowzoo.markdown.markdown_table): {found}"
