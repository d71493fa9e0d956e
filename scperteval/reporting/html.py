"""A self-contained HTML report: inline CSS, figures as base64 PNG, no script."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import numpy as np
import pandas as pd

from scperteval._version import __version__
from scperteval.reporting import htmlparts
from scperteval.reporting.formatting import (
    DAGGER,
    MISSING,
    TEXT_COLUMNS,
    TRUST_TERMS,
    board_rows,
    controls_of,
    excluded_protocols,
    is_missing,
    model_notes,
    run_items,
    score_caption,
    wins_by_pair,
)
from scperteval.reporting.htmlparts import Cell

__all__ = ["html_report", "SIGNIFICANCE"]

SIGNIFICANCE = 0.05
LEADERBOARD_ID = "leaderboard-table"
PROTOCOL_TABLE_ID = "protocol-table"
TITLE = "scperteval report"
PAGED_PREFIX = "per_perturbation"
_VIEWPORT = '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
# Indexed by the sign of wins minus losses.
_WTL_CLASS = ("", "win", "loss")
PAIR_TEXT = ("protocol", "entry", "other", "outcome")
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
tr.apart td { color: #6e7781; background: #f6f8fa; }
th.controls { font-weight: normal; font-size: 0.78em; color: #57606a; max-width: 9em; }
td.win { background: #e6f4ea; }
td.loss { background: #fdecea; }
li.flag { color: #9a3412; }
.definition { background: #f3f5f8; padding: 0.5em 0.8em; border-left: 4px solid #3b6ea8; }
table.protocols td { white-space: nowrap; }
table.protocols td:nth-child(2) { white-space: normal; min-width: 30em; text-align: left; }
details > summary { cursor: pointer; font-weight: bold; margin: 0.4em 0; }
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
_APART = ("", "apart")


def _board_table(
    board: Any, columns: list[str], excluded: set[str], table_id: str, controls: Any = None
) -> str:
    header = [
        (c + f" {DAGGER}" * (c in excluded), _board_class(c, False, excluded)) for c in columns
    ]
    rows = [
        ([(text, _board_class(c, best, excluded)) for c, text, best in cells], _APART[apart])
        for apart, cells in board_rows(board, columns)
    ]
    extra = ""
    if controls:
        cells = [("controls: 0 \u2192 1", "text"), ("", "text")] + [
            (f"{controls[c][0]} \u2192 {controls[c][1]}" if c in controls else "", "controls")
            for c in columns[2:]
        ]
        extra = htmlparts.row(cells, "th", "controls")
    return htmlparts.table(header, rows, table_id, extra_header=extra)


def _board_class(column: str, best: bool, excluded: set[str]) -> str:
    if best:
        return "best"
    if column in excluded:
        return "excluded"
    return "text" if column in TEXT_COLUMNS else ""


def leaderboard_html(board: Any) -> str:
    """The headline table as HTML: the columns and values of ``leaderboard.csv``.

    Parameters
    ----------
    board
        A :class:`~scperteval.scoring.leaderboard.Leaderboard`.

    Returns
    -------
    str
        A ``<table id="leaderboard-table">`` whose header holds the column names
        of ``leaderboard.csv`` and whose cells hold the same values (3
        significant digits, missing as an en dash), the best of each column
        among ranked entries in bold and entries listed apart in grey.

    """
    return _board_table(board, list(board.headline.columns), set(), LEADERBOARD_ID)


def protocol_scores_html(board: Any, controls: Any = None) -> str:
    """The per-protocol table: excluded protocols marked with a dagger, controls named.

    Parameters
    ----------
    board
        A :class:`~scperteval.scoring.leaderboard.Leaderboard`.
    controls
        Per protocol, its (negative, positive) control, shown in a second header row.

    Returns
    -------
    str
        A ``<table id="protocol-table">``.

    """
    excluded = excluded_protocols(board)
    columns = ["model", "kind", *board.protocols]
    return _board_table(board, columns, excluded, PROTOCOL_TABLE_ID, controls)


def _leaderboard_section(result: Any) -> str:
    board = result.leaderboard
    parts = [
        f'<p class="definition"><strong>{escape(board.definition)}</strong></p>',
        leaderboard_html(board),
        f'<p class="caption">Bold: best value of each column among ranked entries without flags; '
        f"{MISSING}: no value; grey rows: listed apart (partial coverage; their rank is "
        "the one they would take among the ranked entries on their own coverage).</p>",
    ]
    if board.notes:
        parts.append(f"<ul>{htmlparts.list_items(board.notes)}</ul>")
    flagged = [(n, f) for n, flags in board.flags.items() for f in flags]
    if flagged:
        items = htmlparts.named_items(flagged, ' class="flag"')
        parts.append(f"<p><strong>Flags on predictions</strong></p><ul>{items}</ul>")
    notes = model_notes(result)
    if notes:
        parts.append(f"<p><strong>Models</strong></p><ul>{htmlparts.named_items(notes)}</ul>")
    return "\n".join(parts)


def _protocol_scores_section(result: Any) -> str:
    board = result.leaderboard
    parts = [
        f'<p class="caption">{escape(score_caption(board))} Second header row: the negative '
        f"control (0) and the positive control (1) of each column.</p>"
    ]
    if board.excluded:
        parts.append(
            f'<p class="caption">{DAGGER}: excluded from the score (not trusted on this '
            "dataset); the reason is under Verdicts.</p>"
        )
    parts.append(protocol_scores_html(board, controls_of(result) if board.calibrated else None))
    return "\n".join(parts)


def _verdicts_section(result: Any) -> str:
    board = result.leaderboard
    if not board.calibrated:
        return "<p>Plain mode (truth = all cells): every protocol is used, no verdict.</p>"
    label = f"Trusted protocols used by score ({len(board.trusted)})"
    names = ", ".join(board.trusted) or "none"
    parts = [
        f'<p class="caption">{escape(TRUST_TERMS)}</p>',
        f"<p><strong>{escape(label)}:</strong> {escape(names)}</p>",
    ]
    if board.verdicts:
        items = htmlparts.named_items(board.verdicts.items(), marked=board.excluded)
        parts.append(f"<ul>{items}</ul>")
    elif board.excluded:
        items = htmlparts.named_items(board.excluded.items())
        parts.append(
            f"<p><strong>Excluded protocols</strong> (marked {DAGGER}):</p><ul>{items}</ul>"
        )
    return "\n".join(parts)


def _versus_section(result: Any) -> str:
    pairs = result.pairs
    if result.wins is None or result.wins.empty:
        return "<p>No pair of entries was compared.</p>"
    shown, record = wins_by_pair(result)
    header = [("entry \\ other", "text")] + [(m, "") for m in shown]
    rows = []
    for a in shown:
        cells: list[Cell] = [(a, "text")]
        for b in shown:
            r = record.get((a, b))
            if a == b or r is None:
                cells.append(("" if a == b else MISSING, ""))
                continue
            mark = {"win": "▲", "loss": "▼", "tie": ""}.get(str(r.score_outcome), "")
            klass = _WTL_CLASS[int(np.sign(r.wins - r.losses))]
            cells.append((f"{r.wins}/{r.ties}/{r.losses}{mark}", klass))
        rows.append((cells, ""))
    caption = (
        "Each cell: wins/ties/losses of the row entry against the column entry over the trusted "
        "protocols (two-sided Wilcoxon signed-rank test on the paired perturbations, "
        f"{result.info.get('correction', 'bonferroni')}-corrected over all pairs within each "
        f"protocol, adjusted p < {SIGNIFICANCE}); ▲/▼: the row entry is significantly "
        "better/worse on the headline score (per-perturbation median calibrated score over the "
        "trusted protocols). The paired t-tests are in pairwise_tests.csv."
    )
    parts = [
        f'<p class="caption">{escape(caption)}</p>',
        htmlparts.table(header, rows, "wtl-table"),
    ]
    if pairs is not None and not pairs.empty:
        headline = pairs[pairs["protocol"] == "score"]
        if len(headline):
            formats = _test_formats(headline, PAIR_TEXT)
            parts.append("<p><strong>Tests on the headline score</strong></p>")
            parts.append(f'<div class="tall">{htmlparts.frame_table(headline, formats)}</div>')
    return "\n".join(parts)


def _calibration_section(result: Any) -> str:
    table = result.calibration
    if table.empty:
        return "<p>Plain mode (truth = all cells): no controls, so no calibration.</p>"
    shown = ("n", "drf_mean", "drf_median", "bds", "n_skipped", "n_negative")
    formats = {c: "d" if c.startswith("n") else ".3f" for c in shown if c in table}
    t = result.thresholds
    caption = (
        f"DRF: share of the room between the negative control and a perfect score covered by "
        f"the positive control; BDS: fraction of perturbations where the positive control beats "
        f"the negative one. Trusted when BDS >= {t.bds_min} and DRF {t.drf_statistic} >= "
        f"{t.drf_min}. Covariate 'all': over all perturbations; grey rows: not trusted."
    )
    body = htmlparts.frame_table(
        table, formats, row_class=lambda r: "" if bool(r.get("trusted", True)) else "untrusted"
    )
    return f'<p class="caption">{escape(caption)}</p>\n{body}'


def _test_formats(table: pd.DataFrame, text_columns: Sequence[str]) -> dict[str, str]:
    """Formats of a table of paired tests: counts as integers, the rest to 3 digits."""
    formats = {str(c): ".3g" for c in table.columns if str(c) not in text_columns}
    formats["n"] = "d"
    return formats


def _tests_section(result: Any) -> str:
    table = result.tests
    if table.empty:
        return "<p>No paired tests (no model, or no negative baseline in this run).</p>"
    adjusted = [c for c in table.columns if str(c).endswith("_pvalue_adj")]
    formats = _test_formats(table, ("protocol", "model", "baseline"))

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
    body = htmlparts.frame_table(table, formats, cell_class=significant)
    return f'<p class="caption">{escape(caption)}</p>\n<div class="tall">{body}</div>'


def _figures_section(images: Mapping[str, tuple[bytes, str]]) -> str:
    if not images:
        return "<p>Figures were not drawn.</p>"
    parts: list[str] = []
    for name, (png, caption) in images.items():
        figure = (
            f'<figure id="figure-{escape(name)}"><img alt="{escape(caption)}" '
            f'src="{htmlparts.png_source(png)}"><figcaption>{escape(caption)}</figcaption></figure>'
        )
        if name.startswith(PAGED_PREFIX):
            # One page per group of protocols; the first one open, the others a click away.
            is_first = not any(PAGED_PREFIX in part for part in parts)
            figure = (
                f"<details{' open' if is_first else ''}><summary>{escape(caption)}</summary>"
                f"{figure}</details>"
            )
        parts.append(figure)
    return "\n".join(parts)


def _readable(protocols: pd.DataFrame) -> pd.DataFrame:
    """The protocol table with the description second and the controls next to it."""
    first = [c for c in ("protocol", "description", "negative", "positive") if c in protocols]
    return protocols[first + [c for c in protocols.columns if c not in first]]


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
        The document titled "scperteval report": the headline table (the
        columns of ``leaderboard.csv``) with the score's definition and the
        flags, the per-protocol table (excluded protocols marked with a dagger,
        each column's controls named), figures, the win/tie/loss matrix, each
        protocol's verdict, the calibration table, tests against the negative
        baselines, protocol descriptions and the run's settings.

    """
    info_rows = [
        ([(label, "text"), (value, "text")], "") for label, value in run_items(result, created)
    ]
    info = htmlparts.table([("setting", "text"), ("value", "text")], info_rows, klass="info")
    protocols = result.protocols
    protocol_formats = {"perfect": ".3g"} if "perfect" in protocols else {}
    sections = {
        ("leaderboard", "Leaderboard"): _leaderboard_section(result),
        ("scores", "Per-protocol scores"): _protocol_scores_section(result),
        ("figures", "Figures"): _figures_section(images),
        ("versus", "Model against model"): _versus_section(result),
        ("verdicts", "Verdicts"): _verdicts_section(result),
        ("calibration", "Calibration"): _calibration_section(result),
        ("tests", "Tests against the negative baselines"): _tests_section(result),
        ("protocols", "Protocols"): htmlparts.frame_table(
            _readable(protocols), protocol_formats, table_class="protocols"
        ),
        ("run", "Run"): info,
    }
    nav = "".join(f'<a href="#{key}">{escape(title)}</a>' for key, title in sections)
    body = "\n".join(
        f'<section id="{key}"><h2>{escape(title)}</h2>\n{html}\n</section>'
        for (key, title), html in sections.items()
    )
    footer = f"scperteval {escape(__version__)} \u2014 {escape(created)}"
    return htmlparts.html_page(TITLE, _CSS, f"<nav>{nav}</nav>\n{body}", footer, _VIEWPORT)
