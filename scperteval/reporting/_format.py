"""Formatting shared by the Markdown, LaTeX and HTML reports."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

MISSING = "–"
META_COLUMNS = ("model", "kind", "score", "rank")
SHOWN_MISSING = 5


def is_missing(value: Any) -> bool:
    """Whether a cell holds no number (None, NaN or ``pd.NA``)."""
    if value is None or value is pd.NA:
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def number(value: Any, spec: str = ".3f") -> str:
    """Format a number with ``spec``; missing values become an en dash and -0 becomes 0."""
    if is_missing(value):
        return MISSING
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if spec == "d" or isinstance(value, numbers.Integral):
        return str(int(value))
    return format(float(value) + 0.0, spec)


def cell_text(column: str, value: Any, spec: str) -> str:
    """Text of one leaderboard cell: names as they are, ranks as integers, numbers by ``spec``."""
    if column in ("model", "kind"):
        return str(value)
    if column == "rank":
        return MISSING if is_missing(value) else str(int(value))
    return number(value, spec)


def best_cells(board: Any) -> Callable[[str, Any], bool]:
    """Return ``is_best(column, value)``: whether a value is its column's best."""
    best = board.best_per_column()

    def is_best(column: str, value: Any) -> bool:
        return column in best and not is_missing(value) and float(value) == best[column]

    return is_best


def score_caption(board: Any) -> str:
    """One sentence on what the ``score`` and protocol columns hold."""
    if board.calibrated:
        return (
            f"Protocol columns: {board.aggregate} calibrated score over perturbations "
            "(0 = negative control, 1 = positive control; higher is better). "
            f"score: mean of the {len(board.trusted)} trusted protocols' columns; "
            "rank 1 is best."
        )
    lower = [p for p in board.protocols if board.better.get(p) == "lower"]
    lower_text = f"lower is better for {', '.join(lower)}" if lower else "higher is better"
    return (
        f"Plain scores on all truth cells (no calibration). Protocol columns: "
        f"{board.aggregate} raw value over perturbations ({lower_text}). "
        "score: mean rank over protocols (lower is better); rank 1 is best."
    )


def population_protocols(result: Any) -> list[str]:
    """Leaderboard protocols that compare cell populations (none for pseudobulk predictions)."""
    table = result.protocols
    if "representation" not in table or "protocol" not in table:
        return []
    shown = set(result.leaderboard.protocols)
    chosen = table[table["representation"].astype(str) == "population"]["protocol"]
    return [str(p) for p in chosen if str(p) in shown]


def model_notes(result: Any) -> list[tuple[str, str]]:
    """Per model (name, sentence): coverage of the perturbations and pseudobulk input."""
    models: dict[str, Any] = result.info.get("models", {}) or {}
    population = population_protocols(result)
    notes = []
    for name, meta in models.items():
        coverage = meta.get("coverage")
        missing = list(meta.get("missing", []) or [])
        parts = []
        if is_missing(coverage):
            parts.append("coverage unknown")
        else:
            parts.append(f"covers {100 * float(coverage):.1f}% of the perturbations")
        if missing:
            shown = ", ".join(missing[:SHOWN_MISSING])
            more = (
                f" and {len(missing) - SHOWN_MISSING} more" if len(missing) > SHOWN_MISSING else ""
            )
            parts.append(f"missing {len(missing)} ({shown}{more}; NaN there)")
        if meta.get("pseudobulk"):
            skipped = ", ".join(population) if population else "none in this run"
            parts.append(
                "pseudobulk predictions (one profile per perturbation): population protocols "
                f"were skipped for it ({skipped})"
            )
        notes.append((str(name), "; ".join(parts) + "."))
    return notes


def run_items(result: Any, created: str) -> list[tuple[str, str]]:
    """(label, value) pairs describing the run, for report headers."""
    info = result.info
    thresholds = result.thresholds
    truth = info.get("truth", "half" if result.leaderboard.calibrated else "all")
    items = [
        ("input", str(info.get("input", "unknown"))),
        ("input checksum", str(info.get("input_checksum", "unknown"))),
        ("seed", str(info.get("seed", "unknown"))),
        ("truth", f"{truth} ({'calibrated' if result.leaderboard.calibrated else 'plain'})"),
        ("aggregate", str(info.get("aggregate", result.leaderboard.aggregate))),
        ("correction", str(info.get("correction", "unknown"))),
        (
            "thresholds",
            f"BDS >= {thresholds.bds_min}, DRF {thresholds.drf_statistic} >= {thresholds.drf_min}"
            + ("" if result.leaderboard.calibrated else " (unused in plain mode)"),
        ),
        ("DE method", str(info.get("de_method", "unknown"))),
    ]
    for key, label in (("n_cells", "cells"), ("n_perturbations", "perturbations")):
        if key in info:
            items.append((label, str(info[key])))
    if info.get("merged_from"):
        items.append(("merged from", ", ".join(map(str, info["merged_from"]))))
    items.append(("date", str(info.get("created") or created)))
    return items
