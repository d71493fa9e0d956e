"""Figures of distance tables: a heatmap of a pairwise table, bars of a one-sided one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

__all__ = ["distance_figure"]

# Beyond this many groups the tick labels are left out (they would overlap).
_MAX_LABELLED = 60


def distance_figure(table: pd.DataFrame | pd.Series, title: str = "") -> Any:
    """A matplotlib figure of a :func:`pairwise` table (heatmap) or :func:`onesided` series (bars).

    Parameters
    ----------
    table
        Groups x groups DataFrame, or a Series of one value per group; with a
        covariate level in the index, one panel per covariate value.
    title
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure
        The figure (not shown; save it with ``savefig``).

    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    parts = _parts(table)
    is_matrix = isinstance(table, pd.DataFrame)
    size = max(len(part) for _, part in parts)
    side = float(np.clip(0.18 * size + 2.5, 4.0, 14.0))
    figure = Figure(figsize=(side * len(parts), side if is_matrix else 0.6 * side + 1.0))
    axes = figure.subplots(1, len(parts), squeeze=False)[0]
    for ax, (name, part) in zip(axes, parts, strict=True):
        labels = [str(v) for v in part.index]
        if is_matrix:
            values = part.to_numpy(dtype=float)
            image = ax.imshow(values, cmap="viridis", interpolation="nearest")
            figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
            if len(labels) <= _MAX_LABELLED:
                ax.set_xticks(range(len(part.columns)), [str(c) for c in part.columns])
                ax.set_yticks(range(len(labels)), labels)
                ax.tick_params(axis="x", labelrotation=90, labelsize=6)
                ax.tick_params(axis="y", labelsize=6)
        else:
            ordered = part.sort_values(ascending=False)
            ax.bar(range(len(ordered)), ordered.to_numpy(dtype=float), color="#4477aa")
            if len(ordered) <= _MAX_LABELLED:
                ax.set_xticks(range(len(ordered)), [str(v) for v in ordered.index])
                ax.tick_params(axis="x", labelrotation=90, labelsize=6)
            ax.set_ylabel(str(table.name or "distance"))
        if name is not None:
            ax.set_title(str(name), fontsize=9)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def _parts(table: pd.DataFrame | pd.Series) -> list[tuple[Any, Any]]:
    if isinstance(table.index, pd.MultiIndex):
        parts = []
        for key in dict.fromkeys(table.index.get_level_values(0)):
            part = table.xs(key, level=0)
            if isinstance(part, pd.DataFrame):
                part = part.loc[:, [c for c in part.index if c in part.columns]]
            parts.append((key, part))
        return parts
    return [(None, table)]
