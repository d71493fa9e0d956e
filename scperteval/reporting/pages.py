"""Figures over many protocols or entries: per-perturbation pages and the win/tie/loss matrix.

- :func:`per_perturbation_figures`: every trusted protocol (all protocols in
  plain mode), ``PROTOCOLS_PER_PAGE`` panels a page; each panel lists the
  perturbations (labelled) and shows each ranked model's calibrated score on
  it, with the controls' levels 0 and 1; values beyond the axis are drawn at
  its edge as triangles.
- :func:`versus_figure`: wins minus losses of each entry (row) against each
  other (column) over the trusted protocols, each cell annotated
  ``wins/ties/losses``.
"""

from __future__ import annotations

import itertools
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from scperteval.reporting.drawing import CALIBRATED_LIMIT, bottom_legend, cell_label, panel_grid
from scperteval.reporting.formatting import user_models, wins_by_pair

__all__ = ["per_perturbation_figures", "versus_figure", "PROTOCOLS_PER_PAGE", "MAX_LABELS"]

PROTOCOLS_PER_PAGE = 6
MAX_LABELS = 60
KEYS = ("covariate", "perturbation")


def _entries(result: Any) -> list[str]:
    """User models first (leaderboard order), then the ranked baselines."""
    table = result.leaderboard.table
    return user_models(table) or [str(m) for m in table["model"]][:6]


def _labels(index: pd.MultiIndex) -> list[str]:
    covariates = set(index.get_level_values(0))
    if len(covariates) == 1:
        return [str(p) for _, p in index]
    return [f"{p} ({c})" for c, p in index]


def _page(
    result: Any, protocols: list[str], entries: list[str], value: str, number: int, total: int
) -> Figure:
    results = result.results
    part = results[results["protocol"].isin(protocols) & results["source_name"].isin(entries)]
    order = part[list(KEYS)].drop_duplicates().sort_values(list(KEYS))
    shown_note = ""
    if len(order) > MAX_LABELS:
        # The perturbations where the entries disagree most, so the labels stay legible.
        spread = part.groupby(list(KEYS), observed=True)[value].std().sort_values(ascending=False)
        order = spread.index[:MAX_LABELS].to_frame(index=False).sort_values(list(KEYS))
        shown_note = f" ({MAX_LABELS} of {len(spread)} perturbations, most disputed)"
    index = pd.MultiIndex.from_frame(order)
    fig, axes, n_cols = panel_grid(len(protocols), 3, (1.2, 0.6), (4.2, 0.9 + 0.15 * len(index)))
    cmap = mpl.colormaps["tab10"]
    positions = np.arange(len(index))
    labels = _labels(index)
    for ax_number, (ax, protocol) in enumerate(zip(axes, protocols, strict=True)):
        frame = part[part["protocol"] == protocol]
        if value == "calibrated":
            ax.axvline(0.0, color="#7f7f7f", linestyle="--", linewidth=1)
            ax.axvline(1.0, color="#2e7d32", linestyle="--", linewidth=1)
            ax.set_xlim(-CALIBRATED_LIMIT - 0.15, CALIBRATED_LIMIT + 0.15)
        for k, entry in enumerate(entries):
            series = frame[frame["source_name"] == entry].set_index(list(KEYS))[value]
            series = series[~series.index.duplicated()].reindex(index)
            x = series.to_numpy(dtype=np.float64)
            y = positions + (k - (len(entries) - 1) / 2) * 0.12
            colour = cmap(k % 10)
            if value == "calibrated":
                inside = np.abs(x) <= CALIBRATED_LIMIT
                ax.scatter(x[inside], y[inside], s=14, color=colour, label=entry, zorder=3)
                for sign, marker in ((1, ">"), (-1, "<")):
                    beyond = np.isfinite(x) & (sign * x > CALIBRATED_LIMIT)
                    edge = np.full(beyond.sum(), sign * CALIBRATED_LIMIT)
                    ax.scatter(edge, y[beyond], s=22, marker=marker, color=colour, zorder=3)
            else:
                ax.scatter(x, y, s=14, color=colour, label=entry, zorder=3)
        ax.set_yticks(positions, labels if ax_number % n_cols == 0 else [""] * len(labels))
        ax.tick_params(axis="y", labelsize=6)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylim(len(index) - 0.5, -0.5)
        ax.grid(axis="y", color="#eeeeee", linewidth=0.5)
        trusted = protocol in result.leaderboard.trusted
        ax.set_title(protocol + ("" if trusted else " (not trusted)"), fontsize=8)
        ax.set_xlabel("calibrated score" if value == "calibrated" else "raw value", fontsize=7)
    handles, names = axes[0].get_legend_handles_labels()
    bottom_legend(fig, handles, names, min(len(names), 6), frameon=True)
    fig.suptitle(
        f"Per-perturbation scores, page {number} of {total}{shown_note}: dashed lines at 0 "
        f"(negative control) and 1 (positive control); triangles: beyond "
        f"\u00b1{CALIBRATED_LIMIT:g}",
        fontsize=9,
    )
    fig.set_label(f"Per-perturbation scores, page {number} of {total}: {', '.join(protocols)}.")
    return fig


def per_perturbation_figures(result: Any) -> dict[str, Figure]:
    """One figure per page of protocols, covering every trusted protocol.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.

    Returns
    -------
    dict
        ``per_perturbation_1``, ``per_perturbation_2``, ... to figures whose
        label (``Figure.get_label()``) is their caption; empty when there is
        nothing to draw.

    """
    board = result.leaderboard
    protocols = list(board.trusted) if board.calibrated else list(board.protocols)
    if result.results.empty or board.table.empty or not protocols:
        return {}
    entries = _entries(result)
    value = "calibrated" if board.calibrated else "value"
    pages = [
        protocols[i : i + PROTOCOLS_PER_PAGE] for i in range(0, len(protocols), PROTOCOLS_PER_PAGE)
    ]
    return {
        f"per_perturbation_{number}": _page(result, chosen, entries, value, number, len(pages))
        for number, chosen in enumerate(pages, start=1)
    }


def versus_figure(result: Any) -> Figure | None:
    """Wins minus losses of each entry against each other, annotated wins/ties/losses.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult` with a ``wins`` table.

    Returns
    -------
    matplotlib.figure.Figure or None
        ``None`` when no pair was compared.

    """
    wins = getattr(result, "wins", None)
    if wins is None or wins.empty:
        return None
    order, by_pair = wins_by_pair(result)
    n = len(order)
    shown = {
        (i, j): by_pair[a, b]
        for (i, a), (j, b) in itertools.product(enumerate(order), repeat=2)
        if (a, b) in by_pair and by_pair[a, b].n_protocols
    }
    balance = np.full((n, n), np.nan)
    for (i, j), row in shown.items():
        balance[i, j] = (row.wins - row.losses) / row.n_protocols
    fig = Figure(figsize=(2.4 + 0.75 * n, 1.6 + 0.5 * n), layout="constrained")
    ax = fig.add_subplot()
    cmap = mpl.colormaps["RdBu"].with_extremes(bad="#f0f0f0")
    image = ax.imshow(balance, cmap=cmap, norm=TwoSlopeNorm(vmin=-1, vcenter=0, vmax=1))
    for (i, j), row in shown.items():
        cell_label(ax, i, j, f"{row.wins}/{row.ties}/{row.losses}", 7, abs(balance[i, j]) > 0.6)
    ax.set_xticks(range(n), order, rotation=45, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(n), order, fontsize=8)
    bar = fig.colorbar(image, ax=ax, shrink=0.8)
    bar.set_label("(wins - losses) / protocols, row against column")
    ax.set_title("wins/ties/losses of the row entry over the trusted protocols", fontsize=9)
    return fig
