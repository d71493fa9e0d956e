"""Drawing steps shared by the report's figures: panel grids, annotated heatmaps, legends."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from scperteval.reporting.formatting import significant

__all__ = ["CALIBRATED_LIMIT", "panel_grid", "calibrated_image", "annotate_cells", "cell_label"]

CALIBRATED_LIMIT = 2.0
UNTRUSTED_COLOUR = "#8c8c8c"
_TICK_NAMES = MappingProxyType(
    {
        -CALIBRATED_LIMIT: f"\u2264 {-CALIBRATED_LIMIT:g} (clipped)",
        -1.0: "-1",
        0.0: "0 negative",
        1.0: "1 positive",
        CALIBRATED_LIMIT: f"\u2265 {CALIBRATED_LIMIT:g} (clipped)",
    }
)


def panel_grid(
    count: int, max_columns: int, margin: tuple[float, float], panel: tuple[float, float]
) -> tuple[Figure, list[Axes], int]:
    """A figure of ``count`` panels, at most ``max_columns`` a row, the spare axes hidden.

    Parameters
    ----------
    count
        Number of panels.
    max_columns
        Most panels in a row.
    margin
        Width and height (inches) added to the panels'.
    panel
        Width and height (inches) of one panel.

    Returns
    -------
    tuple
        The figure, its ``count`` visible axes in reading order, the number of columns.

    """
    n_cols = min(max_columns, count)
    n_rows = math.ceil(count / n_cols)
    size = (margin[0] + panel[0] * n_cols, margin[1] + panel[1] * n_rows)
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, list(axes[:count]), n_cols


def bottom_legend(
    fig: Figure, handles: Sequence[Any], labels: Sequence[str], ncols: int, frameon: bool = False
) -> None:
    """A figure legend below the panels, in small type."""
    fig.legend(
        handles, labels, loc="outside lower center", ncols=ncols, fontsize=7, frameon=frameon
    )


def grey_out(label: Any) -> None:
    """Mark a tick label as untrusted or excluded: grey italics."""
    label.set_color(UNTRUSTED_COLOUR)
    label.set_fontstyle("italic")


def calibrated_image(
    fig: Figure, ax: Axes, values: np.ndarray, ticks: Sequence[float], **bar_options: Any
) -> tuple[Any, Any]:
    """Calibrated scores on a diverging map centred at 0, clipped at +-``CALIBRATED_LIMIT``.

    Parameters
    ----------
    fig, ax
        Where to draw.
    values
        The scores (rows by columns).
    ticks
        Colour bar ticks, among -limit, -1, 0, 1 and +limit; 1 (the positive control)
        is also drawn as a line.
    **bar_options
        Passed to ``Figure.colorbar``.

    Returns
    -------
    tuple
        The image and its colour bar.

    """
    cmap = mpl.colormaps["RdBu"].with_extremes(bad="#e6e6e6", under="#67001f", over="#053061")
    norm = TwoSlopeNorm(vmin=-CALIBRATED_LIMIT, vcenter=0.0, vmax=CALIBRATED_LIMIT)
    image = ax.imshow(values, cmap=cmap, norm=norm, aspect="auto")
    bar = fig.colorbar(image, ax=ax, extend="both", **bar_options)
    bar.ax.axhline(1.0, color="black", linewidth=2)
    bar.set_ticks(list(ticks))
    bar.set_ticklabels([_TICK_NAMES[tick] for tick in ticks])
    return image, bar


def cell_label(ax: Axes, row: int, column: int, text: str, size: float, dark: bool) -> None:
    """Centre ``text`` on a heatmap cell, white on a dark cell and black otherwise."""
    colour = "white" if dark else "black"
    ax.text(column, row, text, ha="center", va="center", fontsize=size, color=colour)


def annotate_cells(
    ax: Axes, image: Any, values: np.ndarray, size: float, star_beyond: float = math.inf
) -> None:
    """Print each finite value (3 significant digits) on its cell, starred beyond a limit."""
    colours = image.cmap(image.norm(image.get_array()))
    for i, j in zip(*np.nonzero(np.isfinite(values)), strict=True):
        red, green, blue = colours[i, j, :3]
        text = significant(values[i, j]) + ("*" if abs(values[i, j]) > star_beyond else "")
        cell_label(ax, i, j, text, size, 0.299 * red + 0.587 * green + 0.114 * blue < 0.5)
