"""Formatting shared by the Markdown, LaTeX and HTML reports."""

from __future__ import annotations

import datetime as dt
import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scperteval.runinfo import write_atomic

MISSING = "–"
TEXT_COLUMNS = (
    "model",
    "kind",
    "perturbations",
    "protocols",
    "listing",
    "flags",
    "vcc_terms_as_zero",
)
SHOWN_MISSING = 5
DAGGER = "\u2020"
#: The definitions of BDS and DRF, given where they first appear in each output.
TRUST_TERMS = (
    "BDS (bound discrimination score): the fraction of perturbations on which the positive "
    "control is strictly better than the negative control. DRF (dynamic range fraction): the "
    "share of the room between the negative control and a perfect score that the positive "
    "control covers."
)


def percent(fraction: float) -> str:
    """A share as a person writes it: ``"0%"``, ``"<0.1%"``, ``"1.4%"``, ``"37%"``.

    Shares between 0 and 0.1% (or 99.9% and 100%) are not rounded to the bound, so
    a nonzero share never reads as none, nor an incomplete one as all.

    Examples
    --------
    >>> percent(0.0), percent(1.4e-29), percent(0.0142), percent(0.37), percent(1.0)
    ('0%', '<0.1%', '1.4%', '37%', '100%')
    >>> percent(0.99999), percent(0.996), percent(-0.996)
    ('>99.9%', '99.6%', '-99.6%')

    """
    if not math.isfinite(fraction):
        return MISSING
    value = 100.0 * fraction
    if value == 0 or value == 100:
        return f"{value:.0f}%"
    if 0 < abs(value) < 0.1:
        return "<0.1%" if value > 0 else ">-0.1%"
    if 99.9 < value < 100:
        return ">99.9%"
    whole = f"{value:.0f}"
    # 99.5% to 99.9% would round to the bound as whole numbers, so keep a decimal there.
    text = f"{value:.1f}" if abs(value) < 10 or whole in ("100", "-100") else whole
    return (text[:-2] if text.endswith(".0") else text) + "%"


def significant(value: Any, digits: int = 3) -> str:
    """A number with ``digits`` significant digits, without exponent between 1e-3 and 1e5.

    Examples
    --------
    >>> significant(1.07123), significant(-51.468), significant(0.04412), significant(2.0)
    ('1.07', '-51.5', '0.0441', '2')

    """
    if is_missing(value):
        return MISSING
    x = float(value) + 0.0
    if x == 0.0 or not 1e-3 <= abs(x) < 1e5:
        return format(x, f".{digits}g")
    decimals = max(digits - 1 - math.floor(math.log10(abs(x))), 0)
    text = f"{round(x, decimals):.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def headline_frame(board: Any) -> pd.DataFrame:
    """The headline columns as display text (3 significant digits, missing as a dash)."""
    table = board.headline
    texts = {column: [cell_text(column, v) for v in table[column]] for column in table.columns}
    return pd.DataFrame(texts, index=table.index)


def controls_of(result: Any) -> dict[str, tuple[str, str]]:
    """Per protocol, its (negative, positive) control: the sources scored 0 and 1."""
    table = result.protocols
    if not {"protocol", "positive", "negative"} <= set(table.columns):
        return {}
    return {str(row.protocol): (str(row.negative), str(row.positive)) for row in table.itertuples()}


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


def cell_text(column: str, value: Any) -> str:
    """Text of one leaderboard cell: names as they are, ranks as integers, numbers rounded.

    Numbers are written with 3 significant digits (:func:`significant`).
    """
    if column in TEXT_COLUMNS:
        return str(value)
    if column in ("rank", "population_rank"):
        return MISSING if is_missing(value) else str(int(value))
    return significant(value)


def best_cells(board: Any) -> Callable[[str, Any], bool]:
    """Return ``is_best(column, value)``: whether a value is its column's best."""
    best = board.best_per_column()

    def is_best(column: str, value: Any) -> bool:
        return column in best and not is_missing(value) and float(value) == best[column]

    return is_best


def excluded_protocols(board: Any) -> set[str]:
    """The protocols left out of the score: the untrusted ones, none in plain mode."""
    return set(board.excluded) if board.calibrated else set()


def board_rows(board: Any, columns: list[str]) -> list[tuple[bool, list[tuple[str, str, bool]]]]:
    """Each leaderboard row: whether it is listed apart, and each cell's (column, text, is best).

    Parameters
    ----------
    board
        A :class:`~scperteval.scoring.leaderboard.Leaderboard`.
    columns
        The columns shown.

    Returns
    -------
    list
        Per row of the table, in order; texts by :func:`cell_text`.

    """
    is_best = best_cells(board)
    rows = []
    for record in board.table[columns].to_dict("records"):
        cells = [(c, cell_text(c, record[c]), is_best(c, record[c])) for c in columns]
        rows.append((record.get("listing", "ranked") != "ranked", cells))
    return rows


def wins_by_pair(result: Any) -> tuple[list[str], dict[tuple[str, str], Any]]:
    """The entries compared (leaderboard order) and each (entry, other) row of ``result.wins``."""
    entries = set(result.wins["entry"])
    order = [str(m) for m in result.leaderboard.table["model"] if str(m) in entries]
    return order, {(row.entry, row.other): row for row in result.wins.itertuples()}


def score_caption(board: Any) -> str:
    """The definition of ``score`` (:attr:`Leaderboard.definition`), then what columns hold."""
    if board.calibrated:
        return (
            f"{board.definition}. Protocol columns: {board.aggregate} calibrated score over "
            "perturbations. Rank 1 is best; an entry listed apart is not ranked among the "
            "others: its rank is the one it would take on its own coverage."
        )
    return f"{board.definition}. Rank 1 is best."


def user_models(table: pd.DataFrame) -> list[str]:
    """The names of a leaderboard table's user models (not baselines), in its order."""
    return [str(m) for m in table.loc[table["kind"] == "model", "model"]]


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
        parts = [
            "coverage unknown"
            if is_missing(coverage)
            else f"covers {percent(float(coverage))} of the perturbations"
        ]
        if missing:
            shown = ", ".join(missing[:SHOWN_MISSING])
            hidden = len(missing) - SHOWN_MISSING
            more = f" and {hidden} more" if hidden > 0 else ""
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


def write_file(path: Path, data: str | bytes) -> None:
    """Write text (as UTF-8) or bytes to ``path`` atomically, creating its folder."""
    if isinstance(data, bytes):
        write_atomic(path, lambda target: target.write_bytes(data))
    else:
        write_atomic(path, lambda target: target.write_text(data, encoding="utf-8"))


def created_now() -> str:
    """The current UTC time as the reports print it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
