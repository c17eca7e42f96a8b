"""Check report pages as a reader opens them:
``flowzoo check-report REPORT_DIR ... [--no-figure DIR] [--screenshots DIR]`` (``make report-check`` runs it on the
committed example reports; ``python -m flowzoo.benchmark.render.report_check`` is its older spelling, an alias).

For each report directory the page is its ``index.html`` or, for a report written as markdown only (``README.md``,
``index.md``), that markdown rendered like ``flowzoo report`` renders its page, into a temporary file beside it so
that relative paths resolve. Then:

* statically: every ``<img>`` names an existing file, every relative link an existing file, every in-page link
  (``#id``) an element of the page; links to other sites are listed, not fetched (no network);
* in headless Chromium (the ``chromium`` of the OS packages; ``make report-check`` installs it when it can), the page
  at a 1280 x 800 window: every image loaded (decoded with a size), the first screen holds the page's answer (a figure
  whose box starts above the window's bottom edge, or a table, the study pages' answer table, whose first rows do:
  its top at least :data:`TABLE_ROWS_PX` above that edge), and no figure outside a table cell is shown narrower than 90% of its
  drawn width (its fonts would fall below the sizes they were drawn at); with ``--screenshots DIR`` a PNG of the first screen is written to
  ``DIR/report-<name>-first-screen.png``.

Without a browser the static checks run alone, with "a figure or a table before the first section heading"
(``h2``) standing in for the first-screen rule, and the output says in one line that the browser part was skipped and why. A page in
``--no-figure`` is not required to show a figure (a tables-only report); the output says so. Exit status 1 when a
check fails, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

from flowzoo.command_line import run_alias

WINDOW = (1280, 800)
#: a table counts as shown on the first screen when its top is this far above the window's bottom edge (its header
#: and about two rows)
TABLE_ROWS_PX = 90
MIN_SCALE = 0.9
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PROBE_ID = "flowzoo-report-check"
#: run after the page has loaded; writes what the checks need into the page, which --dump-dom then prints
PROBE = """<script>
window.addEventListener("load", function () {
  var images = Array.prototype.map.call(document.images, function (img) {
    var box = img.getBoundingClientRect();
    return {src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0, top: box.top,
            bottom: box.bottom, shown: box.width, drawn: Number(img.getAttribute("width")) || img.naturalWidth,
            thumbnail: !!img.closest("td")};
  });
  var first = document.querySelector("table");
  var out = document.createElement("pre");
  out.id = "%s";
  out.textContent = JSON.stringify({height: window.innerHeight, width: window.innerWidth, images: images,
                                    table_top: first ? first.getBoundingClientRect().top : null});
  document.body.appendChild(out);
});
</script>""" % PROBE_ID


class _Page(HTMLParser):
    """The images, links, element ids and the order of images and tables of an HTML page."""

    def __init__(self):
        super().__init__()
        self.images, self.links, self.ids, self.order = [], [], set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "img":
            self.images.append(attrs.get("src") or "")
            self.order.append("img")
        elif tag == "a" and attrs.get("href") is not None:
            self.links.append(attrs["href"])
        elif tag in ("table", "h2"):
            self.order.append(tag)


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def page_of(report: Path) -> tuple[Path, bool]:
    """(the page to check, whether it is a temporary rendering of the report's markdown)."""
    if (report / "index.html").is_file():
        return report / "index.html", False
    for name in ("README.md", "index.md"):
        if (report / name).is_file():
            from flowzoo.benchmark.render.markdown_html import markdown_to_html

            html = markdown_to_html((report / name).read_text(), title=report.name, base_dir=report)  # before the
            fd, tmp = tempfile.mkstemp(prefix=".report-check-", suffix=".html", dir=report)  # file: none left on error
            with os.fdopen(fd, "w") as f:
                f.write(html)
            return Path(tmp), True
    raise FileNotFoundError(f"{report} holds no index.html, README.md or index.md")


def static_checks(page: Path) -> tuple[list[str], _Page, list[str]]:
    """(failures, the parsed page, external links) of the page's images and links."""
    parsed = _Page()
    parsed.feed(page.read_text())
    failures, external = [], []
    for src in parsed.images:
        if urlparse(src).scheme:
            failures.append(f"image {src} is not a file of the report")
        elif not (page.parent / unquote(src)).is_file():
            failures.append(f"missing image {src}")
    for href in parsed.links:
        url = urlparse(href)
        if url.scheme in ("http", "https", "mailto"):
            external.append(href)
        elif url.scheme:
            failures.append(f"link {href}: unsupported scheme")
        elif not url.path:
            if url.fragment and url.fragment not in parsed.ids:
                failures.append(f"broken in-page link #{url.fragment}")
        else:
            target = (page.parent / unquote(url.path)).resolve()
            if not target.exists():
                failures.append(f"broken link {href}")
    return failures, parsed, external


def leads_with_answer(order: list[str]) -> bool:
    """Whether a figure or a table comes before the page's first section heading (``h2``): its answer opens it."""
    opening = order[:order.index("h2")] if "h2" in order else order
    return "img" in opening or "table" in opening


def browser_checks(browser: str, page: Path, screenshot: Path | None, need_figure: bool) -> list[str]:
    """Render the page headless; failures of the loaded images, the first screen and the figures' widths."""
    width, height = WINDOW
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
             "--no-first-run", f"--window-size={width},{height}", "--virtual-time-budget=15000"]
    fd, probe = tempfile.mkstemp(prefix=".report-check-", suffix=".html", dir=page.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(page.read_text().replace("</body>", PROBE + "\n</body>"))
        done = subprocess.run(flags + ["--dump-dom", Path(probe).resolve().as_uri()], capture_output=True, text=True,
                              timeout=180)
    finally:
        os.unlink(probe)
    match = re.search(rf'<pre id="{PROBE_ID}">(.*?)</pre>', done.stdout, re.S)
    if not match:
        return [f"the browser did not render the page (exit {done.returncode}): {done.stderr.strip()[-300:]}"]
    import html

    state = json.loads(html.unescape(match[1]))
    failures = [f"image {i['src']} did not load in the browser" for i in state["images"] if not i["loaded"]]
    figures = [i for i in state["images"] if i["loaded"]]
    shows_table = state["table_top"] is not None and state["table_top"] < state["height"] - TABLE_ROWS_PX
    if need_figure and not shows_table and not any(i["top"] < state["height"] and i["bottom"] > 0 for i in figures):
        failures.append(f"the first screen ({width} x {height}) holds no figure and no table's first rows")
    for i in figures:  # thumbnails in table cells are scaled by design
        if not i["thumbnail"] and i["drawn"] and i["shown"] < MIN_SCALE * min(i["drawn"], state["width"]):
            failures.append(f"figure {i['src']} is shown at {i['shown']:.0f} px of its {i['drawn']} px: its fonts "
                            "shrink below their drawn size")
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{screenshot.name}.", suffix=".png", dir=screenshot.parent)
        os.close(fd)
        try:
            shot = subprocess.run(flags + [f"--screenshot={tmp}", page.resolve().as_uri()], capture_output=True,
                                  text=True, timeout=180)
            if shot.returncode == 0 and os.path.getsize(tmp):
                os.replace(tmp, screenshot)
            else:
                failures.append(f"no screenshot (exit {shot.returncode})")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return failures


def check(report: Path, browser: str | None, screenshots: Path | None, need_figure: bool) -> list[str]:
    page, temporary = page_of(report)
    try:
        failures, parsed, external = static_checks(page)
        print(f"{report}: {len(parsed.images)} images, {len(parsed.links)} links ({len(external)} to other sites, "
              "not fetched)")
        if not need_figure:
            print(f"{report}: a tables-only page: the first-screen figure rule is not applied")
        if browser is None:
            if need_figure and not leads_with_answer(parsed.order):
                failures.append("no figure or table before the first section heading (static stand-in for the "
                                "first-screen check)")
        else:
            shot = screenshots / f"report-{report.name}-first-screen.png" if screenshots else None
            failures += browser_checks(browser, page, shot, need_figure)
            if shot is not None and shot.is_file():
                print(f"{report}: first screen -> {shot}")
        return failures
    finally:
        if temporary:
            page.unlink()


DESCRIPTION = ("Each page statically (images, links, in-page anchors) and, when a Chromium is on PATH, at a 1280 x "
               "800 window:\nimages loaded, the answer on the first screen, no figure squeezed. Exit 1 when a check "
               "fails.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo check-report``'s arguments."""
    parser.add_argument("reports", nargs="*", type=Path, help="report directories")
    parser.add_argument("--no-figure", action="append", type=Path, default=[], metavar="DIR",
                        help="a report directory that is tables only (no first-screen figure required); repeatable")
    parser.add_argument("--screenshots", type=Path, metavar="DIR",
                        help="write each page's first screen here (browser only)")


def run(args: argparse.Namespace) -> int:
    """``flowzoo check-report``: every named report checked; exit 1 when one fails."""
    if not args.reports and not args.no_figure:
        args.command_parser.error("name at least one report directory")
    for report in args.reports + args.no_figure:
        if not report.is_dir():
            args.command_parser.error(f"report directory {str(report)!r} does not exist")
    if args.screenshots is not None and args.screenshots.exists() and not args.screenshots.is_dir():
        args.command_parser.error(f"--screenshots {str(args.screenshots)!r} is a file, not a folder to write the "
                                  f"screenshots into")
    browser = find_browser()
    if browser is None:
        print("report-check: browser part skipped: no Chromium on PATH (looked for "
              f"{', '.join(BROWSERS)}; on Debian/Ubuntu: apt-get install chromium); only the static checks ran")
    else:
        print(f"report-check: rendering in {browser} (headless, {WINDOW[0]} x {WINDOW[1]})")
    failed = 0
    for report, need in [(r, True) for r in args.reports] + [(r, False) for r in args.no_figure]:
        try:
            failures = check(report, browser, args.screenshots, need)
        except FileNotFoundError as error:  # no page in the folder: a failed report, not a traceback
            failures = [str(error)]
        except UnicodeDecodeError:
            failures = ["its page is not UTF-8 text"]
        for failure in failures:
            print(f"{report}: FAIL: {failure}")
        failed += bool(failures)
        if not failures:
            print(f"{report}: ok")
    print(f"report-check: {len(args.reports) + len(args.no_figure) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flowzoo.benchmark.render.report_check``: the older spelling of ``flowzoo check-report``."""
    return run_alias("flowzoo.benchmark.render.report_check", DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
