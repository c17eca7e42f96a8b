"""The report's HTML page: markdown-it-py's rendering of the markdown the report writes."""

from flowzoo.benchmark.render.markdown_html import markdown_to_html


def test_report_markdown_renders_headings_code_lists_tables_images():
    page = markdown_to_html("# T\n\npara `a_b` **bold** <x>\n\n- item [l](x.svg)\n\n| a | b |\n|---|---|\n"
                            "| ![i](p.png) | 1 |\n", title="R & D")
    assert page.startswith("<!DOCTYPE html>\n") and "<title>R &amp; D</title>" in page
    assert '<h1 id="t">T</h1>' in page
    assert "<p>para <code>a_b</code> <strong>bold</strong> &lt;x&gt;</p>" in page  # raw HTML escaped
    assert '<li>item <a href="x.svg">l</a></li>' in page
    assert "<th>a</th>\n<th>b</th>" in page
    assert '<td><img src="p.png" alt="i"></td>\n<td>1</td>' in page
    assert "<script" not in page and "http" not in page


def test_underscores_and_stars_inside_code_stay_literal():
    page = markdown_to_html("`op_grpo_no_truncation` and `a*b*c`\n")
    assert "<code>op_grpo_no_truncation</code>" in page and "<code>a*b*c</code>" in page and "<em>" not in page


def test_headings_get_githubs_ids_and_figures_their_physical_width(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(5, 2))
    fig.savefig(tmp_path / "f.png", dpi=192)  # 960 px recorded at 192 dpi: 5 in, 480 CSS px
    plt.close(fig)
    plt.imsave(tmp_path / "plain.png", [[0.0, 1.0]])  # no resolution recorded beyond the default
    page = markdown_to_html("## Headline: cost, relative!\n\n### `toy_a`\n\n### `toy_a`\n\n![f](f.png)\n",
                            base_dir=tmp_path)
    assert '<h2 id="headline-cost-relative">' in page
    assert '<h3 id="toy_a">' in page and '<h3 id="toy_a-1">' in page
    assert '<img src="f.png" alt="f" width="480">' in page
