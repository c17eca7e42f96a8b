"""flowzoo.benchmark.render.report_check: missing images, broken links and a first screen without
the page's answer (a figure or a table) fail; the browser part
runs where Chromium is installed (skipped with the reason elsewhere) and the static part everywhere."""

import pytest

from flowzoo.benchmark.render import report_check
from flowzoo.benchmark.render.markdown_html import markdown_to_html
from tests.test_report import _small_runs


def _page(root, markdown, figure=True):
    root.mkdir(parents=True, exist_ok=True)
    if figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(4, 2))
        fig.savefig(root / "f.png", dpi=192)
        plt.close(fig)
    (root / "index.html").write_text(markdown_to_html(markdown, base_dir=root))
    return root


GOOD = "# R\n\n![figure](f.png)\n\n## A b\n\n[to A](#a-b) [file](f.png)\n\n| x | y |\n|---|---|\n| 1 | 2 |\n"


@pytest.fixture
def no_browser(monkeypatch):
    monkeypatch.setattr(report_check, "find_browser", lambda: None)


def test_static_checks_pass_a_good_page_and_say_the_browser_was_skipped(tmp_path, no_browser, capsys):
    assert report_check.main([str(_page(tmp_path / "good", GOOD))]) == 0
    out = capsys.readouterr().out
    assert "browser part skipped: no Chromium on PATH" in out and "1 passed, 0 failed" in out


@pytest.mark.parametrize("markdown, failure", [
    (GOOD.replace("![figure](f.png)", "![figure](gone.png)"), "missing image gone.png"),
    (GOOD.replace("[file](f.png)", "[file](gone.md)"), "broken link gone.md"),
    (GOOD.replace("(#a-b)", "(#nowhere)"), "broken in-page link #nowhere"),
    ("# R\n\ntext\n\n## Section\n\n| x |\n|---|\n| 1 |\n\n![figure](f.png)\n",
     "no figure or table before the first section heading"),
])
def test_static_failures(tmp_path, no_browser, capsys, markdown, failure):
    assert report_check.main([str(_page(tmp_path / "bad", markdown))]) == 1
    assert failure in capsys.readouterr().out


def test_an_answer_table_before_the_first_section_opens_the_page(tmp_path, no_browser, capsys):
    answer = "# R\n\nThe answer.\n\n| claim | verdict |\n|---|---|\n| c | reproduced |\n\n## Section\n\n![figure](f.png)\n"
    assert report_check.main([str(_page(tmp_path / "answer", answer))]) == 0
    assert report_check.leads_with_answer(["table", "h2", "img"])
    assert report_check.leads_with_answer(["img"])
    assert not report_check.leads_with_answer(["h2", "table", "img"])
    assert not report_check.leads_with_answer([])


def test_a_tables_only_report_is_checked_for_links_only(tmp_path, no_browser, capsys):
    root = tmp_path / "study"
    root.mkdir()
    (root / "README.md").write_text("# Study\n\n| a |\n|---|\n| [runs](runs.csv) |\n")
    (root / "runs.csv").write_text("a\n")
    assert report_check.main(["--no-figure", str(root), str(_page(tmp_path / "good", GOOD))]) == 0
    assert "tables-only page" in capsys.readouterr().out
    assert sorted(p.name for p in root.iterdir()) == ["README.md", "runs.csv"]  # the temporary page is gone
    (root / "runs.csv").unlink()
    assert report_check.main(["--no-figure", str(root), str(_page(tmp_path / "good", GOOD))]) == 1


def test_a_missing_directory_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        report_check.main([str(tmp_path / "nope")])
    assert exit_.value.code == 2


@pytest.fixture
def browser():
    found = report_check.find_browser()
    if found is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium): the browser checks cannot run here")
    return found


def test_a_real_report_renders_with_a_figure_on_its_first_screen(tmp_path, browser, capsys):
    from flowzoo.benchmark.render.report import write_report

    out = write_report(_small_runs(tmp_path / "runs"), tmp_path / "report").parent
    assert report_check.main([str(out), "--screenshots", str(tmp_path / "shots")]) == 0
    assert "rendering in" in capsys.readouterr().out
    shot = tmp_path / "shots" / "report-report-first-screen.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_browser_finds_a_first_screen_without_a_figure(tmp_path, browser, capsys):
    tall = ("# R\n\n" + "\n\n".join(f"paragraph {i}" for i in range(60))
            + "\n\n| x |\n|---|\n| 1 |\n\n![figure](f.png)\n")
    assert report_check.main([str(_page(tmp_path / "late", tall))]) == 1
    assert "the first screen (1280 x 800) holds no figure and no table's first rows" in capsys.readouterr().out


def test_the_browser_finds_an_image_that_does_not_load(tmp_path, browser, capsys):
    root = _page(tmp_path / "broken", GOOD)
    (root / "f.png").write_bytes(b"not a png")
    assert report_check.main([str(root)]) == 1
    assert "image f.png did not load in the browser" in capsys.readouterr().out
