"""The leaderboard as Markdown (with notes) and as a LaTeX ``booktabs`` tabular."""

from __future__ import annotations

import re
from typing import Any

from scperteval.reporting._format import (
    MISSING,
    best_cells,
    cell_text,
    model_notes,
    run_items,
    score_caption,
)

__all__ = ["markdown_report", "latex_table", "markdown_escape", "latex_escape"]

# "<" only opens raw HTML before a letter, "/", "!" or "?".
_MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]|]|<(?=[A-Za-z/!?]))")
# An underscore only starts emphasis next to a non-alphanumeric character.
_MARKDOWN_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
}


def markdown_escape(text: str) -> str:
    """Escape text for a Markdown table cell or list item.

    Parameters
    ----------
    text
        Plain text, such as a model or protocol name.

    Returns
    -------
    str
        The text with Markdown's markup characters backslash-escaped; underscores
        inside words (``pearson_delta``) are kept as they are.

    """
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", text)
    return _MARKDOWN_UNDERSCORE.sub(r"\\_", escaped).replace("\n", " ")


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters (``_``, ``&``, ``%``, ...) in plain text.

    Parameters
    ----------
    text
        Plain text.

    Returns
    -------
    str
        Text safe in a LaTeX document body.

    """
    return "".join(_LATEX_SPECIAL.get(char, char) for char in text)


def _markdown_table(board: Any) -> list[str]:
    columns = [str(c) for c in board.table.columns]
    is_best = best_cells(board)
    align = [":---" if c in ("model", "kind") else "---:" for c in columns]
    lines = [
        "| " + " | ".join(markdown_escape(c) for c in columns) + " |",
        "| " + " | ".join(align) + " |",
    ]
    for row in board.table.itertuples(index=False):
        cells = []
        for column, value in zip(columns, row, strict=True):
            text = cell_text(column, value, ".3f")
            text = markdown_escape(text) if column in ("model", "kind") else text
            cells.append(f"**{text}**" if is_best(column, value) else text)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown_report(result: Any, created: str) -> str:
    """The leaderboard as a Markdown document.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.
    created
        Date shown when the run information has none.

    Returns
    -------
    str
        A title, the run's settings, the leaderboard table (3 decimals, missing
        values as an en dash, each column's best value in bold), the trusted and
        excluded protocols, and notes on the models' coverage.

    """
    board = result.leaderboard
    lines = ["# scPertEval leaderboard", ""]
    lines += [f"- {label}: {markdown_escape(value)}" for label, value in run_items(result, created)]
    lines += ["", markdown_escape(score_caption(board)), ""]
    lines += _markdown_table(board)
    lines += ["", f"Bold: best value of each column. {MISSING}: no value.", ""]
    names = ", ".join(markdown_escape(p) for p in board.trusted) or "none"
    if board.calibrated:
        lines.append(f"Trusted protocols used by `score` ({len(board.trusted)}): {names}.")
    else:
        lines.append(f"Protocols used by `score` ({len(board.trusted)}, plain mode): {names}.")
    lines.append("")
    if board.excluded:
        lines += ["Excluded protocols:", ""]
        lines += [
            f"- {markdown_escape(p)}: {markdown_escape(reason)}"
            for p, reason in board.excluded.items()
        ]
    else:
        lines.append("Excluded protocols: none.")
    notes = model_notes(result)
    if notes:
        lines += ["", "Models:", ""]
        lines += [f"- {markdown_escape(name)}: {markdown_escape(text)}" for name, text in notes]
    if board.notes:
        lines += ["", "Notes:", ""]
        lines += [f"- {markdown_escape(note)}" for note in board.notes]
    return "\n".join(lines) + "\n"


def latex_table(board: Any) -> str:
    r"""The leaderboard as a LaTeX ``tabular`` (needs ``\usepackage{booktabs}``).

    Parameters
    ----------
    board
        A :class:`~scperteval.scoring.leaderboard.Leaderboard`.

    Returns
    -------
    str
        The table with 3 decimals, missing values as ``--``, each column's best
        value in ``\textbf``, names escaped, and protocols excluded from the
        score marked with a dagger.

    """
    columns = [str(c) for c in board.table.columns]
    is_best = best_cells(board)
    excluded = set(board.excluded) if board.calibrated else set()
    header = [
        latex_escape(c) + (r"\textsuperscript{\dag}" if c in excluded else "") for c in columns
    ]
    spec = "".join("l" if c in ("model", "kind") else "r" for c in columns)
    lines = [
        "% Requires \\usepackage{booktabs}",
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
        " & ".join(header) + r" \\",
        "\\midrule",
    ]
    for row in board.table.itertuples(index=False):
        cells = []
        for column, value in zip(columns, row, strict=True):
            text = cell_text(column, value, ".3f")
            if column in ("model", "kind"):
                text = latex_escape(text)
            elif text == MISSING:
                text = "--"
            cells.append(f"\\textbf{{{text}}}" if is_best(column, value) else text)
        lines.append(" & ".join(cells) + r" \\")
    lines.append("\\bottomrule")
    if excluded:
        lines.append(
            f"\\multicolumn{{{len(columns)}}}{{l}}{{\\footnotesize \\textsuperscript{{\\dag}}"
            " excluded from the score (not trusted on this dataset)}" + r" \\"
        )
    lines.append("\\end{tabular}")
    return "\n".join(lines) + "\n"
