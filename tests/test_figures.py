"""flowzoo.benchmark.render.figures: seaborn draws the seed means with the bands of stats.bootstrap_ci; its theme stays per figure."""

import matplotlib
import numpy as np
import pandas as pd
import pytest

from flowzoo.benchmark.render import figures
from flowzoo.benchmark.analysis import stats

#: three seeds at x = 0, 1, 2 and a lone seed at x = 3 (no band there: n < 2)
SEEDS = pd.DataFrame({"x": [0, 0, 0, 1, 1, 1, 2, 2, 2, 3],
                      "y": [0.1, 0.4, 0.2, 0.5, 0.9, 0.6, 1.0, 1.0, 1.3, 2.0]})


def test_draw_mean_line_is_the_seed_mean_and_band_is_the_stats_bootstrap():
    plt = figures.pyplot()
    fig, ax = plt.subplots()
    figures.draw_mean(ax, SEEDS, "x", "y", ("C0", "--"), "algo")
    (line,) = ax.lines
    assert line.get_label() == "algo" and line.get_linestyle() == "--"
    np.testing.assert_allclose(line.get_ydata(), [0.7 / 3, 2.0 / 3, 3.3 / 3, 2.0])
    vertices = np.concatenate([path.vertices for path in ax.collections[0].get_paths()])
    for x in (0, 1, 2):
        lo, hi = stats.bootstrap_ci(SEEDS.loc[SEEDS["x"] == x, "y"], np.mean, resamples=figures.PLOT_BOOTSTRAPS)
        at_x = vertices[np.isclose(vertices[:, 0], x), 1]
        assert lo < hi and at_x.min() == pytest.approx(lo) and at_x.max() == pytest.approx(hi)
    assert not np.isclose(vertices[:, 0], 3).any()
    plt.close(fig)


def test_theme_is_set_for_each_figure_only():
    @figures.themed
    def probe():
        return matplotlib.rcParams["axes.grid"], matplotlib.rcParams["axes.facecolor"]

    before = matplotlib.rcParams["axes.grid"], matplotlib.rcParams["axes.facecolor"]
    assert probe() == (True, "white") and before != (True, "white")  # seaborn's whitegrid inside, not outside
    assert (matplotlib.rcParams["axes.grid"], matplotlib.rcParams["axes.facecolor"]) == before
    for plot in (figures.plot_eval_curves, figures.plot_performance_profiles, figures.plot_diagnostics_over_training,
                 figures.plot_by_denoising_step):
        assert plot.__wrapped__, plot.__name__
