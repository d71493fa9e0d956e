"""A self-contained HTML report: inline CSS, figures as base64 PNG, no script."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

import pandas as pd

from scperteval._version import __version__
from scperteval.reporting._format import (
    MISSING,
    best_cells,
    cell_text,
    is_missing,
    model_notes,
    number,
    run_items,
    score_caption,
)

__all__ = ["html_report", "SIGNIFICANCE"]

SIGNIFICANCE = 0.05
LEADERBOARD_ID = "leaderboard-table"
_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1300px; padding: 0 1.5em; color: #1f2328; line-height: 1.45; }
h1 { font-size: 1.7em; margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: 0.2em; margin-top: 1.8em; }
nav a { margin-right: 1em; color: #0b57d0; text-decoration: none; }
.scroll { overflow-x: auto; max-width: 100%; }
.tall { max-height: 36em; overflow-y: auto; }
table { border-collapse: collapse; font-size: 0.86em; margin: 0.6em 0; }
th, td { border: 1px solid #d0d7de; padding: 0.25em 0.55em; text-align: right; }
th { background: #f3f5f8; position: sticky; top: 0; }
td.text, th.text { text-align: left; }
tbody tr:nth-child(even) { background: #fafbfc; }
.best { font-weight: bold; background: #e6f4ea; }
th.excluded { color: #8c8c8c; font-style: italic; }
th.excluded::after { content: " \\2020"; }
td.excluded { color: #8c8c8c; }
tr.untrusted td { color: #8c8c8c; }
td.sig { background: #fff1c2; font-weight: bold; }
table.info th { text-align: left; position: static; }
table.info td { text-align: left; }
.caption { color: #57606a; font-size: 0.92em; }
figure { margin: 1.2em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { color: #57606a; font-size: 0.9em; }
footer { margin-top: 3em; color: #57606a; font-size: 0.85em; }
"""
_SECTIONS = [
    ("run", "Run"),
    ("leaderboard", "Leaderboard"),
    ("figures", "Figures"),
    ("calibration", "Calibration"),
    ("tests", "Paired tests"),
    ("protocols", "Protocols"),
]

Cell = tuple[str, str]


def _class(klass: str) -> str:
    return f' class="{klass}"' if klass else ""


def _row(cells: Sequence[Cell], tag: str = "td", row_class: str = "") -> str:
    attr = _class(row_class)
    inner = "".join(f"<{tag}{_class(klass)}>{escape(text)}</{tag}>" for text, klass in cells)
    return f"<tr{attr}>{inner}</tr>"


def _table(
    header: Sequence[Cell],
    rows: Sequence[tuple[Sequence[Cell], str]],
    table_id: str = "",
    klass: str = "",
) -> str:
    attr = (f' id="{table_id}"' if table_id else "") + (f' class="{klass}"' if klass else "")
    body = "\n".join(_row(cells, row_class=klass) for cells, klass in rows)
    return (
        f'<div class="scroll"><table{attr}>\n<thead>{_row(header, "th")}</thead>\n'
        f"<tbody>\n{body}\n</tbody></table></div>"
    )


def _frame_table(
    frame: pd.DataFrame,
    formats: Mapping[str, str],
    cell_class: Callable[[str, Any], str] = lambda column, value: "",
    row_class: Callable[[Any], str] = lambda row: "",
) -> str:
    columns = [str(c) for c in frame.columns]
    text_columns = {c for c in columns if c not in formats}
    header = [(c, "text" if c in text_columns else "") for c in columns]
    rows = []
    for record in frame.to_dict("records"):
        cells = []
        for column in columns:
            value = record[column]
            if column in text_columns:
                text, klass = ("" if is_missing(value) else str(value)), "text"
            else:
                text, klass = number(value, formats[column]), ""
            extra = cell_class(column, value)
            cells.append((text, f"{klass} {extra}".strip()))
        rows.append((cells, row_class(record)))
    return _table(header, rows)


def leaderboard_html(board: Any) -> str:
    """The leaderboard as an HTML table (6 significant digits, best per column marked).

    Parameters
    ----------
    board
        A :class:`~scperteval.scoring.leaderboard.Leaderboard`.

    Returns
    -------
    str
        A ``<table id="leaderboard-table">`` whose header holds the column names
        of ``leaderboard.csv`` and whose cells hold the same values (missing as
        an en dash); protocols excluded from the score have their header marked.

    """
    columns = [str(c) for c in board.table.columns]
    is_best = best_cells(board)
    excluded = set(board.excluded) if board.calibrated else set()
    header = [
        (c, "text" if c in ("model", "kind") else ("excluded" if c in excluded else ""))
        for c in columns
    ]
    rows = []
    for row in board.table.itertuples(index=False):
        cells = []
        for column, value in zip(columns, row, strict=True):
            klass = "text" if column in ("model", "kind") else ""
            if is_best(column, value):
                klass = "best"
            elif column in excluded:
                klass = "excluded"
            cells.append((cell_text(column, value, ".6g"), klass))
        rows.append((cells, ""))
    return _table(header, rows, LEADERBOARD_ID)


def _leaderboard_section(result: Any) -> str:
    board = result.leaderboard
    parts = [
        f'<p class="caption">{escape(score_caption(board))} Bold: best value of each '
        f"column; {MISSING}: no value.</p>",
        leaderboard_html(board),
    ]
    label = "Trusted protocols used by score" if board.calibrated else "Protocols used by score"
    names = ", ".join(board.trusted) or "none"
    parts.append(f"<p><strong>{escape(label)} ({len(board.trusted)}):</strong> {escape(names)}</p>")
    if board.excluded:
        items = "".join(
            f"<li><strong>{escape(p)}</strong>: {escape(reason)}</li>"
            for p, reason in board.excluded.items()
        )
        parts.append(f"<p><strong>Excluded protocols</strong> (marked \u2020):</p><ul>{items}</ul>")
    elif board.calibrated:
        parts.append("<p><strong>Excluded protocols:</strong> none.</p>")
    notes = model_notes(result)
    if notes:
        items = "".join(f"<li><strong>{escape(n)}</strong>: {escape(t)}</li>" for n, t in notes)
        parts.append(f"<p><strong>Models</strong></p><ul>{items}</ul>")
    if board.notes:
        items = "".join(f"<li>{escape(note)}</li>" for note in board.notes)
        parts.append(f"<p><strong>Notes</strong></p><ul>{items}</ul>")
    return "\n".join(parts)


def _calibration_section(result: Any) -> str:
    table = result.calibration
    if table.empty:
        return "<p>Plain mode (truth = all cells): no controls, so no calibration.</p>"
    formats = {
        "n": "d",
        "drf_mean": ".3f",
        "drf_median": ".3f",
        "bds": ".3f",
        "n_skipped": "d",
        "n_negative": "d",
    }
    formats = {k: v for k, v in formats.items() if k in table}
    t = result.thresholds
    caption = (
        f"DRF: share of the room between the negative control and a perfect score covered by "
        f"the positive control; BDS: fraction of perturbations where the positive control beats "
        f"the negative one. Trusted when BDS >= {t.bds_min} and DRF {t.drf_statistic} >= "
        f"{t.drf_min}. Covariate 'all': over all perturbations; grey rows: not trusted."
    )
    body = _frame_table(
        table, formats, row_class=lambda r: "" if bool(r.get("trusted", True)) else "untrusted"
    )
    return f'<p class="caption">{escape(caption)}</p>\n{body}'


def _tests_section(result: Any) -> str:
    table = result.tests
    if table.empty:
        return "<p>No paired tests (no model, or no negative baseline in this run).</p>"
    adjusted = [c for c in table.columns if str(c).endswith("_pvalue_adj")]
    formats = {
        str(c): ".3g" for c in table.columns if str(c) not in ("protocol", "model", "baseline")
    }
    formats["n"] = "d"

    def significant(column: str, value: Any) -> str:
        hit = column in adjusted and not is_missing(value) and float(value) < SIGNIFICANCE
        return "sig" if hit else ""

    n_hits = int((table[adjusted] < SIGNIFICANCE).any(axis=1).sum()) if adjusted else 0
    correction = result.info.get("correction", "bonferroni")
    caption = (
        f"One-sided paired t-test and Wilcoxon signed-rank test that the model beats the "
        f"baseline on a protocol's raw values; p-values adjusted ({correction}) within each "
        f"protocol and test. Highlighted: adjusted p < {SIGNIFICANCE} ({n_hits} of "
        f"{len(table)} comparisons)."
    )
    body = _frame_table(table, formats, cell_class=significant)
    return f'<p class="caption">{escape(caption)}</p>\n<div class="tall">{body}</div>'


def _figures_section(images: Mapping[str, tuple[bytes, str]]) -> str:
    if not images:
        return "<p>Figures were not drawn.</p>"
    parts = []
    for name, (png, caption) in images.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(
            f'<figure id="figure-{escape(name)}"><img alt="{escape(caption)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{escape(caption)}</figcaption>'
            "</figure>"
        )
    return "\n".join(parts)


def html_report(result: Any, images: Mapping[str, tuple[bytes, str]], created: str) -> str:
    """The whole report as one HTML document with no external resource.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.
    images
        Figure name to (PNG bytes, caption), embedded as data URIs in order.
    created
        Date shown when the run information has none.

    Returns
    -------
    str
        The document: run settings, leaderboard with excluded protocols and model
        notes, figures, calibration table, paired tests and protocol descriptions.

    """
    info_rows = [
        ([(label, "text"), (value, "text")], "") for label, value in run_items(result, created)
    ]
    info = _table([("setting", "text"), ("value", "text")], info_rows, klass="info")
    protocols = result.protocols
    protocol_formats = {"perfect": ".6g"} if "perfect" in protocols else {}
    sections = {
        "run": info,
        "leaderboard": _leaderboard_section(result),
        "figures": _figures_section(images),
        "calibration": _calibration_section(result),
        "tests": _tests_section(result),
        "protocols": _frame_table(protocols, protocol_formats),
    }
    nav = "".join(f'<a href="#{key}">{escape(title)}</a>' for key, title in _SECTIONS)
    body = "\n".join(
        f'<section id="{key}"><h2>{escape(title)}</h2>\n{sections[key]}\n</section>'
        for key, title in _SECTIONS
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>scPertEval report</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>scPertEval report</h1>\n<nav>{nav}</nav>\n{body}\n"
        f"<footer>scperteval {escape(__version__)} \u2014 {escape(created)}</footer>\n"
        "</body>\n</html>\n"
    )
