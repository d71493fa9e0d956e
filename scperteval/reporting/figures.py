"""The report's figures, drawn on matplotlib ``Figure`` objects (no pyplot, no global backend).

Each ``*_figure`` function returns a figure or ``None`` when the result holds
nothing to draw (for example calibration figures in plain mode).
:func:`draw_figures` collects them and :func:`render` turns one into PNG and
SVG bytes.
"""

from __future__ import annotations

import io
import math
from types import MappingProxyType
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from scperteval.reporting.drawing import (
    CALIBRATED_LIMIT,
    UNTRUSTED_COLOUR,
    annotate_cells,
    bottom_legend,
    calibrated_image,
    grey_out,
)
from scperteval.reporting.formatting import excluded_protocols
from scperteval.reporting.pages import per_perturbation_figures, versus_figure
from scperteval.reporting.panels import distribution_figure, positive_figure

__all__ = ["FIGURES", "draw_figures", "render", "heatmap_figure", "calibration_figure"]

FIGURES = MappingProxyType(
    {
        "heatmap": "Aggregate score of each entry (columns) on each protocol (rows), the headline "
        "score first.",
        "calibration": "DRF and BDS of each protocol, with the trust thresholds.",
        "distributions": "Per-perturbation scores of each model.",
        "versus_positive": "Each model's per-perturbation value against the positive control's.",
        "versus": "Model against model: wins minus losses over the trusted protocols.",
    }
)
TRUSTED_COLOUR = "#3b6ea8"
_HATCH: MappingProxyType[str, Any] = MappingProxyType(
    {"fill": False, "hatch": "///", "edgecolor": UNTRUSTED_COLOUR, "linewidth": 0}
)
_THRESHOLD = MappingProxyType({"color": "#c0392b", "linestyle": "--"})
_TICKS = (-CALIBRATED_LIMIT, -1.0, 0.0, 1.0, CALIBRATED_LIMIT)


def _plain_colours(table: pd.DataFrame, columns: list[str], board: Any) -> np.ndarray:
    """Rank of each value within its column (1 = best), for colouring raw values."""
    ranks = np.full((len(table), len(columns)), np.nan)
    for j, column in enumerate(columns):
        lower = column == "score" or board.better.get(column) == "lower"
        ranks[:, j] = table[column].rank(ascending=lower, method="average").to_numpy()
    return ranks


def heatmap_figure(result: Any) -> Figure | None:
    """Heatmap of protocols (rows, the overall score first) by entries (columns).

    Calibrated mode colours calibrated scores with a diverging map centred at 0
    (the negative control) on a fixed symmetric range of +-2, 1 (the positive
    control) marked on the colour bar, the clipped tails labelled on it and
    values beyond the range starred; every cell is annotated (3 significant
    digits); protocols excluded from the score are hatched and their labels
    greyed. Plain mode colours each protocol's ranks and prints the raw values.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.

    Returns
    -------
    matplotlib.figure.Figure or None
        ``None`` when the leaderboard is empty.

    """
    board = result.leaderboard
    table = board.table
    rows = ["score", *board.protocols]
    if table.empty or not board.protocols:
        return None
    values = table[rows].to_numpy(dtype=np.float64).T
    n_rows, n_cols = values.shape
    fig = Figure(figsize=(3.6 + 0.85 * n_cols, 1.8 + 0.3 * n_rows), layout="constrained")
    ax = fig.add_subplot()
    if board.calibrated:
        image, bar = calibrated_image(fig, ax, values, _TICKS, shrink=0.6, aspect=30)
        bar.set_label("calibrated score (0 = negative control, 1 = positive control)")
    else:
        ranks = _plain_colours(table, rows, board).T
        cmap = mpl.colormaps["viridis_r"].with_extremes(bad="#e6e6e6")
        image = ax.imshow(ranks, cmap=cmap, aspect="auto", vmin=1, vmax=max(n_cols, 2))
        bar = fig.colorbar(image, ax=ax, shrink=0.6)
        bar.set_label("rank within protocol (1 = best)")
    annotate_cells(ax, image, values, 7.5, CALIBRATED_LIMIT if board.calibrated else math.inf)
    excluded = excluded_protocols(board)
    for i, row in enumerate(rows):
        if row in excluded:
            ax.add_patch(Rectangle((-0.5, i - 0.5), n_cols, 1, **_HATCH))
    ax.axhline(0.5, color="white", linewidth=3)
    ax.xaxis.tick_top()
    names = [str(m) for m in table["model"]]
    ax.set_xticks(range(n_cols), names, rotation=35, ha="left", rotation_mode="anchor")
    ax.set_yticks(range(n_rows), [r + (" \u2020" if r in excluded else "") for r in rows])
    for label, row in zip(ax.get_yticklabels(), rows, strict=True):
        if row == "score":
            label.set_fontweight("bold")
        elif row in excluded:
            grey_out(label)
    for label, kind in zip(ax.get_xticklabels(), table["kind"], strict=True):
        if kind != "model":
            label.set_color("#555555")
    title = (
        f"{board.aggregate} calibrated score; colours clipped at "
        f"\u00b1{CALIBRATED_LIMIT:g} (* beyond)"
        if board.calibrated
        else f"{board.aggregate} raw value"
    )
    if excluded:
        title += "\nhatched, \u2020: excluded from the score"
    ax.set_title(title, fontsize=10)
    return fig


def calibration_figure(result: Any) -> Figure | None:
    """DRF (median bar, mean marker) and BDS per protocol, with the trust thresholds.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.

    Returns
    -------
    matplotlib.figure.Figure or None
        ``None`` in plain mode (no calibration table).

    """
    calibration = result.calibration
    if calibration.empty or "covariate" not in calibration:
        return None
    overall = calibration[calibration["covariate"].astype(str) == "all"].set_index("protocol")
    order = [p for p in result.leaderboard.protocols if p in overall.index]
    order += [p for p in overall.index if p not in order]
    if not order:
        return None
    overall = overall.loc[order]
    thresholds = result.thresholds
    positions = np.arange(len(order))
    colours = [TRUSTED_COLOUR if bool(t) else UNTRUSTED_COLOUR for t in overall["trusted"]]
    fig = Figure(figsize=(9.0, 1.4 + 0.3 * len(order)), layout="constrained")
    drf_ax, bds_ax = fig.subplots(1, 2, sharey=True)
    drf_ax.barh(positions, overall["drf_median"], color=colours, height=0.7, label="median DRF")
    drf_ax.scatter(
        overall["drf_mean"], positions, marker="D", s=22, color="black", zorder=3, label="mean DRF"
    )
    drf_label = f"threshold ({thresholds.drf_statistic} >= {thresholds.drf_min})"
    drf_ax.axvline(thresholds.drf_min, label=drf_label, **_THRESHOLD)
    drf_ax.axvline(0.0, color="black", linewidth=0.8)
    drf_ax.set_xlim(-1.05, 1.05)
    drf_ax.set_xlabel("DRF (dynamic range fraction)")
    bds_ax.barh(positions, overall["bds"], color=colours, height=0.7)
    bds_ax.axvline(thresholds.bds_min, label=f"threshold (>= {thresholds.bds_min})", **_THRESHOLD)
    bds_ax.set_xlim(0.0, 1.02)
    bds_ax.set_xlabel("BDS (fraction positive beats negative)")
    handles, labels = drf_ax.get_legend_handles_labels()
    more_handles, more_labels = bds_ax.get_legend_handles_labels()
    labels = [f"DRF {label}" if label.startswith("threshold") else label for label in labels]
    bottom_legend(fig, handles + more_handles, labels + [f"BDS {m}" for m in more_labels], 4)
    drf_ax.set_yticks(positions, order)
    drf_ax.invert_yaxis()
    for label, trusted in zip(drf_ax.get_yticklabels(), overall["trusted"], strict=True):
        if not bool(trusted):
            grey_out(label)
    fig.suptitle("Calibration over all perturbations (grey: not trusted)", fontsize=10)
    return fig


def draw_figures(result: Any) -> dict[str, Figure]:
    """Draw every figure the result supports.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.

    Returns
    -------
    dict
        Name (a key of ``FIGURES``) to figure, in report order; figures with
        nothing to show are left out.

    """
    makers = {
        "heatmap": heatmap_figure,
        "calibration": calibration_figure,
        "distributions": distribution_figure,
        "versus_positive": positive_figure,
        "versus": versus_figure,
    }
    drawn = {name: maker(result) for name, maker in makers.items()}
    figures = {name: figure for name, figure in drawn.items() if figure is not None}
    figures.update(per_perturbation_figures(result))
    return figures


def caption(name: str, figure: Figure) -> str:
    """A figure's caption: the fixed one of its name, else the figure's label."""
    return FIGURES.get(name) or str(figure.get_label())


def render(figure: Figure, svg: bool = True) -> tuple[bytes, bytes]:
    """PNG and SVG bytes of a figure, without timestamps (reproducible files).

    Parameters
    ----------
    figure
        The figure to save.
    svg
        Also render the SVG (empty bytes otherwise).

    Returns
    -------
    tuple of bytes
        PNG, SVG.

    """
    png, vector = io.BytesIO(), io.BytesIO()
    figure.savefig(png, format="png", dpi=110, metadata={"Software": None})
    if svg:
        with mpl.rc_context({"svg.hashsalt": "scperteval", "svg.fonttype": "path"}):
            figure.savefig(vector, format="svg", metadata={"Date": None})
    return png.getvalue(), vector.getvalue()
