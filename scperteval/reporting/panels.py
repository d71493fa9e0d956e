"""Per-perturbation figures: score distributions and models against the positive control."""

from __future__ import annotations

from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from scperteval.reporting.drawing import bottom_legend, panel_grid
from scperteval.reporting.formatting import user_models

__all__ = ["distribution_figure", "positive_figure", "MAX_SCATTER_PROTOCOLS"]

MAX_SCATTER_PROTOCOLS = 6
MAX_POINTS_PER_BOX = 300
GRID_COLUMNS = 4
KEYS = ("covariate", "perturbation")
ENTRIES = ("model", "baseline")


def _boxes(ax: Axes, data: list[np.ndarray], names: list[str], seed: int = 0) -> None:
    """Vertical boxes at positions 1..n, with the points when there are few."""
    positions = [i + 1 for i, values in enumerate(data) if values.size]
    filled = [values for values in data if values.size]
    if filled:
        ax.boxplot(
            filled,
            positions=positions,
            widths=0.6,
            showfliers=False,
            medianprops={"color": "black"},
            patch_artist=True,
            boxprops={"facecolor": "#dce6f2", "edgecolor": "#3b6ea8"},
        )
    rng = np.random.default_rng(seed)
    for position, values in zip(positions, filled, strict=True):
        if values.size <= MAX_POINTS_PER_BOX:
            jitter = rng.uniform(-0.18, 0.18, size=values.size)
            ax.scatter(
                position + jitter, values, s=6, color="#1f1f1f", alpha=0.45, zorder=3, linewidths=0
            )
    ax.set_xticks(range(1, len(names) + 1), names, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_xlim(0.4, len(names) + 0.6)


def _by_entry(rows: pd.DataFrame, column: str, order: list[str]) -> list[np.ndarray]:
    """The finite values of ``column`` of each entry in ``order`` (empty when it has none)."""
    groups = {str(k): v for k, v in rows.groupby("source_name", observed=True)[column]}
    data = [groups[n].to_numpy(dtype=np.float64) if n in groups else np.array([]) for n in order]
    return [values[np.isfinite(values)] for values in data]


def _clip_axis(ax: Axes, data: list[np.ndarray]) -> None:
    """Keep [-0.5, 1.5] in view but no more than [-3, 3]; count the values off the axis."""
    if not any(d.size for d in data):
        return
    pooled = np.concatenate(data)
    low = max(min(-0.5, float(np.quantile(pooled, 0.01))), -3.0)
    high = min(max(1.5, float(np.quantile(pooled, 0.99))), 3.0)
    ax.set_ylim(low, high)
    for i, values in enumerate(data):
        outside = int(np.sum((values < low) | (values > high)))
        if outside:
            label = f"{outside} off axis"
            ax.annotate(label, (i + 1, high), ha="center", va="top", fontsize=6, color="#c0392b")


def _calibrated_distribution(result: Any, order: list[str]) -> Figure | None:
    board = result.leaderboard
    results = result.results
    chosen = board.trusted or board.protocols
    rows = results[results["source"].isin(ENTRIES) & results["protocol"].isin(chosen)]
    data = _by_entry(rows, "calibrated", order)
    if not any(d.size for d in data):
        return None
    fig = Figure(figsize=(1.8 + 0.55 * len(order), 4.6), layout="constrained")
    ax = fig.add_subplot()
    ax.axhline(0.0, color="#7f7f7f", linestyle="--", linewidth=1, label="negative control (0)")
    ax.axhline(1.0, color="#2e7d32", linestyle="--", linewidth=1, label="positive control (1)")
    _boxes(ax, data, order, seed=int(result.info.get("seed", 0) or 0))
    _clip_axis(ax, data)
    ax.set_ylabel("calibrated score per perturbation")
    which = f"{len(board.trusted)} trusted" if board.trusted else "all (none trusted)"
    ax.set_title(f"Calibrated scores pooled over {which} protocols", fontsize=10)
    ax.legend(loc="lower left", fontsize=7)
    return fig


def _plain_distribution(result: Any, order: list[str]) -> Figure | None:
    board = result.leaderboard
    results = result.results
    protocols = board.protocols
    if not protocols:
        return None
    panel = (3.2, 1.4 + 0.12 * len(order))
    fig, axes, n_cols = panel_grid(len(protocols), GRID_COLUMNS, (0.6, 0.8), panel)
    entries = results[results["source"].isin(ENTRIES)]
    for index, (ax, protocol) in enumerate(zip(axes, protocols, strict=True)):
        _boxes(ax, _by_entry(entries[entries["protocol"] == protocol], "value", order), order)
        ax.set_title(f"{protocol} ({_direction(result, protocol)} is better)", fontsize=8)
        # Entry names only under the lowest panel of each column.
        ax.tick_params(labelsize=7, labelbottom=index + n_cols >= len(protocols))
    fig.suptitle("Raw values per perturbation (plain mode)", fontsize=10)
    return fig


def distribution_figure(result: Any) -> Figure | None:
    """Per-perturbation scores of each model and baseline, as boxes with points.

    Calibrated mode pools the calibrated scores over the trusted protocols
    (all protocols when none is trusted) into one box per entry, with the
    controls' levels 0 and 1 drawn. Plain mode draws a grid with one panel of
    raw values per protocol.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.

    Returns
    -------
    matplotlib.figure.Figure or None
        ``None`` when there is no value to show.

    """
    order = [str(m) for m in result.leaderboard.table["model"]]
    if not order or result.results.empty:
        return None
    if result.leaderboard.calibrated:
        return _calibrated_distribution(result, order)
    return _plain_distribution(result, order)


def _scatter_protocols(result: Any) -> list[str]:
    board = result.leaderboard
    results = result.results
    positive = results[(results["source"] == "positive") & np.isfinite(results["value"])]
    available = set(positive["protocol"].astype(str))
    ordered = [p for p in board.trusted if p in available]
    ordered += [p for p in board.protocols if p in available and p not in ordered]
    return ordered[:MAX_SCATTER_PROTOCOLS]


def _scatter_panel(ax: Axes, part: pd.DataFrame, models: list[str], colours: list[Any]) -> None:
    positive = part[part["source"] == "positive"].set_index(list(KEYS))["value"]
    shown: list[np.ndarray] = [positive.to_numpy(dtype=np.float64)]
    negative = part[part["source"] == "negative"].set_index(list(KEYS))["value"]
    pairs = _paired(positive, negative)
    ax.scatter(pairs["x"], pairs["y"], marker="x", s=18, color="#9e9e9e", linewidths=1)
    shown.append(pairs["y"].to_numpy(dtype=np.float64))
    for model, colour in zip(models, colours, strict=True):
        values = part[(part["source"] == "model") & (part["source_name"] == model)]
        pairs = _paired(positive, values.set_index(list(KEYS))["value"])
        ax.scatter(pairs["x"], pairs["y"], s=14, color=colour, alpha=0.8, linewidths=0)
        shown.append(pairs["y"].to_numpy(dtype=np.float64))
    ax.set_xlim(*_padded(shown[0]))
    ax.set_ylim(*_padded(np.concatenate(shown)))
    ax.axline((0.0, 0.0), slope=1.0, color="black", linewidth=0.8, linestyle=":")


def _paired(x: pd.Series, y: pd.Series) -> pd.DataFrame:
    """Columns ``x`` and ``y`` over the perturbations both hold."""
    return pd.concat([x.rename("x"), y.rename("y")], axis=1, join="inner")


def _padded(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if not finite.size:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    pad = 0.06 * (high - low) if high > low else max(0.05 * abs(high), 0.05)
    return low - pad, high + pad


def positive_figure(result: Any) -> Figure | None:
    """Each model's per-perturbation raw value against the positive control's.

    One panel per protocol (trusted protocols first, at most
    ``MAX_SCATTER_PROTOCOLS``), the negative control as grey crosses and the
    diagonal (as good as the positive control) dotted.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.

    Returns
    -------
    matplotlib.figure.Figure or None
        ``None`` without positive control values (plain mode) or models.

    """
    results = result.results
    if results.empty:
        return None
    board = result.leaderboard
    models = user_models(board.table)
    protocols = _scatter_protocols(result)
    if not models or not protocols:
        return None
    cmap = mpl.colormaps["tab10"]
    colours = [cmap(i % 10) for i in range(len(models))]
    fig, axes, _ = panel_grid(len(protocols), 3, (0.6, 1.0), (3.4, 3.1))
    for ax, protocol in zip(axes, protocols, strict=True):
        _scatter_panel(ax, results[results["protocol"] == protocol], models, colours)
        trusted = "" if protocol in board.trusted else ", not trusted"
        direction = _direction(result, protocol)
        ax.set_title(f"{protocol} ({direction} is better{trusted})", fontsize=8)
        ax.set_xlabel("positive control", fontsize=8)
        ax.set_ylabel("model", fontsize=8)
        ax.tick_params(labelsize=7)
    points: list[tuple[str, Any, str]] = [*zip("o" * len(models), colours, models, strict=True)]
    points.append(("x", "#9e9e9e", "negative control"))
    handles = [Line2D([], [], marker=m, linestyle="", color=c, label=n) for m, c, n in points]
    handles.append(Line2D([], [], linestyle=":", color="black", label="as good as positive"))
    bottom_legend(fig, handles, [str(h.get_label()) for h in handles], min(len(handles), 5))
    fig.suptitle("Per-perturbation raw values: models against the positive control", fontsize=10)
    return fig


def _direction(result: Any, protocol: str) -> str:
    """Direction of a protocol's raw metric, from the protocol table."""
    table = result.protocols
    if "better" in table and "protocol" in table:
        match = table.loc[table["protocol"].astype(str) == protocol, "better"]
        if len(match):
            return str(match.iloc[0])
    return "higher"
