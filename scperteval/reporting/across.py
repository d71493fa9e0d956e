"""Reports of a models x datasets summary: CSV, Markdown, LaTeX, a heatmap and an HTML page.

:func:`write_across` writes, into one folder, ``datasets.csv`` (one score
column per dataset, mean rank, win rate), ``datasets_long.csv`` (per entry and
dataset: score, 95% CI, rank, coverage, flags), ``datasets.md``,
``datasets.tex``, ``figures/datasets.png`` (and ``.svg``) and a self-contained
``datasets.html``.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from scperteval.reporting.formatting import MISSING, created_now, significant, write_file
from scperteval.reporting.htmlparts import html_page, list_items, png_source, row
from scperteval.reporting.tables import latex_escape, latex_lines, markdown_escape, markdown_lines
from scperteval.runinfo import write_tables

__all__ = ["write_across", "across_heatmap", "ACROSS_FILES"]

ACROSS_FILES = ("datasets.csv", "datasets_long.csv", "datasets.md", "datasets.tex", "datasets.html")
TITLE = "scperteval report across datasets"
CAPTION = (
    "Each dataset column: the entry's headline score on that dataset (its own trusted "
    "protocols and controls); mean_rank: mean over the datasets where the entry is ranked of "
    "its rank there; win_rate: share of (dataset, other entry) comparisons its score is "
    "higher (ties one half); n_datasets: datasets it was scored on."
)
_CSS = (
    "body{font-family:Helvetica,Arial,sans-serif;margin:2em auto;max-width:1300px;padding:0 1.5em}"
    "table{border-collapse:collapse;font-size:0.9em}th,td{border:1px solid #d0d7de;"
    "padding:0.25em 0.55em;text-align:right}td:first-child,td:nth-child(2){text-align:left}"
    "img{max-width:100%}"
)


def _cell(summary: Any, model: str, dataset: str) -> str:
    long = summary.long
    row = long[(long["model"] == model) & (long["dataset"] == dataset)]
    if row.empty or not np.isfinite(float(row["score"].iloc[0])):
        return MISSING
    first = row.iloc[0]
    low, high = significant(first["ci_low"]), significant(first["ci_high"])
    apart = "" if str(first["listing"]) == "ranked" else " (apart)"
    return f"{significant(first['score'])} [{low}, {high}]{apart}"


def _rows(summary: Any) -> tuple[list[str], list[list[str]]]:
    header = ["model", "kind", *summary.datasets, "mean_rank", "win_rate", "n_datasets"]
    rows = []
    for record in summary.table.to_dict("records"):
        cells = [str(record["model"]), str(record["kind"])]
        cells += [_cell(summary, str(record["model"]), d) for d in summary.datasets]
        cells += [significant(record["mean_rank"]), significant(record["win_rate"])]
        cells.append(str(int(record["n_datasets"])))
        rows.append(cells)
    return header, rows


def _definitions(summary: Any) -> list[str]:
    return [f"{label}: {text}" for label, text in summary.definitions.items()]


def across_markdown(summary: Any) -> str:
    """The summary as Markdown: score [95% CI] per dataset, mean rank, win rate."""
    header, rows = _rows(summary)
    lines = [f"# {TITLE}", "", markdown_escape(CAPTION), ""]
    align = [":---" if i < 2 else "---:" for i in range(len(header))]
    escaped = [[markdown_escape(c) for c in cells] for cells in [header, *rows]]
    lines += markdown_lines(escaped[0], align, escaped[1:])
    lines += ["", "Headline score of each dataset:", ""]
    lines += [f"- {markdown_escape(line)}" for line in _definitions(summary)]
    return "\n".join(lines) + "\n"


def across_latex(summary: Any) -> str:
    r"""The summary as a LaTeX ``booktabs`` tabular (score [95% CI] per dataset)."""
    header, rows = _rows(summary)
    spec = "ll" + "r" * (len(header) - 2)
    escaped = [[latex_escape(c.replace(MISSING, "--")) for c in cells] for cells in [header, *rows]]
    lines = ["% Requires \\usepackage{booktabs}", *latex_lines(spec, escaped[0], escaped[1:])]
    lines.append("\\end{tabular}")
    return "\n".join(lines) + "\n"


def across_heatmap(summary: Any) -> Any:
    """Entries (rows) x datasets (columns) of headline scores, annotated, centred at 0."""
    from matplotlib.figure import Figure

    from scperteval.reporting.drawing import annotate_cells, calibrated_image

    values = summary.table[summary.datasets].to_numpy(dtype=np.float64)
    n_rows, n_cols = values.shape
    fig = Figure(figsize=(3.6 + 1.3 * n_cols, 1.4 + 0.38 * n_rows), layout="constrained")
    ax = fig.add_subplot()
    image, _ = calibrated_image(fig, ax, values, (-2.0, 0.0, 1.0, 2.0), shrink=0.8)
    annotate_cells(ax, image, values, 8)
    ax.set_xticks(range(n_cols), summary.datasets, rotation=20, ha="right")
    ax.set_yticks(range(n_rows), [str(m) for m in summary.table["model"]])
    ax.set_title("headline score per dataset (0 = negative control, 1 = positive control)")
    return fig


def across_html(summary: Any, png: bytes | None, created: str) -> str:
    """The summary as one self-contained HTML page."""
    header, rows = _rows(summary)
    head = row([(h, "") for h in header], "th")
    body = "".join(row([(c, "") for c in cells]) for cells in rows)
    items = list_items(_definitions(summary))
    figure = ""
    if png is not None:
        figure = f'<figure><img alt="headline score per dataset" src="{png_source(png)}"></figure>'
    return html_page(
        TITLE,
        _CSS,
        f"<p>{escape(CAPTION)}</p>\n"
        f'<table id="datasets-table"><thead>{head}</thead><tbody>{body}</tbody></table>\n'
        f"{figure}\n<p><strong>Headline score of each dataset</strong></p><ul>{items}</ul>",
        escape(created),
    )


def write_across(summary: Any, folder: str | Path, figures: bool = True) -> None:
    """Write every file of a models x datasets summary.

    Parameters
    ----------
    summary
        A :class:`~scperteval.scoring.across.AcrossDatasets`.
    folder
        Output folder (created if needed); each file written atomically.
    figures
        Draw the heatmap (``figures/datasets.png`` and ``.svg``) and embed it.

    """
    from scperteval.reporting.figures import render

    folder = Path(folder)
    created = created_now()
    write_tables(folder, {"datasets.csv": summary.table, "datasets_long.csv": summary.long})
    write_file(folder / "datasets.md", across_markdown(summary))
    write_file(folder / "datasets.tex", across_latex(summary))
    png = None
    if figures:
        png, svg = render(across_heatmap(summary))
        write_file(folder / "figures" / "datasets.png", png)
        write_file(folder / "figures" / "datasets.svg", svg)
    write_file(folder / "datasets.html", across_html(summary, png, created))
