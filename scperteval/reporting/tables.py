"""The leaderboard as Markdown (with notes) and as a LaTeX ``booktabs`` tabular."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import Any

from scperteval.reporting.formatting import (
    DAGGER,
    MISSING,
    TEXT_COLUMNS,
    TRUST_TERMS,
    board_rows,
    excluded_protocols,
    model_notes,
    run_items,
    score_caption,
)

__all__ = ["markdown_report", "latex_table", "markdown_escape", "latex_escape"]

# "<" only opens raw HTML before a letter, "/", "!" or "?".
_MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]|]|<(?=[A-Za-z/!?]))")
# An underscore only starts emphasis next to a non-alphanumeric character.
_MARKDOWN_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_LATEX_SPECIAL = MappingProxyType(
    {
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
)


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


def _board_cells(
    board: Any, columns: list[str], escape: Callable[[str], str], best: str, missing: str
) -> list[list[str]]:
    """Each leaderboard row's cells: text escaped, ``missing`` for no value, ``best`` marked."""
    return [
        [
            (best if is_best else "{}").format(
                escape(text) if column in TEXT_COLUMNS else missing if text == MISSING else text
            )
            for column, text, is_best in cells
        ]
        for _, cells in board_rows(board, columns)
    ]


def _markdown_rows(board: Any, columns: list[str], excluded: set[str]) -> list[str]:
    align = [":---" if c in TEXT_COLUMNS else "---:" for c in columns]
    header = [markdown_escape(c) + (f" {DAGGER}" if c in excluded else "") for c in columns]
    return markdown_lines(
        header, align, _board_cells(board, columns, markdown_escape, "**{}**", MISSING)
    )


def markdown_lines(header: list[str], align: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table of (already escaped) cells."""
    return ["| " + " | ".join(cells) + " |" for cells in [header, align, *rows]]


def latex_lines(spec: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a ``booktabs`` tabular of (already escaped) cells, up to its bottom rule."""
    body = [" & ".join(cells) + r" \\" for cells in [header, *rows]]
    begin = f"\\begin{{tabular}}{{{spec}}}"
    return [begin, "\\toprule", body[0], "\\midrule", *body[1:], "\\bottomrule"]


def _named_items(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """Markdown list items ``name: text``."""
    return [f"- {markdown_escape(name)}: {markdown_escape(text)}" for name, text in pairs]


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
        A title, the score's definition, the headline table (the columns of
        ``leaderboard.csv``, 3 significant digits, missing values as an en
        dash, each column's best value in bold), flags, the per-protocol table
        (excluded protocols marked with a dagger), each protocol's verdict,
        notes on the models' coverage and the run's settings.

    """
    board = result.leaderboard
    lines = ["# scperteval leaderboard", "", markdown_escape(score_caption(board)), ""]
    lines += _markdown_rows(board, list(board.headline.columns), set())
    lines += [
        "",
        f"Bold: best value of each column among ranked entries without flags. {MISSING}: no value.",
    ]
    if board.notes:
        lines += [""] + [f"- {markdown_escape(note)}" for note in board.notes]
    flagged = [(n, f) for n, flags in board.flags.items() for f in flags]
    if flagged:
        lines += ["", "Flags on predictions:", "", *_named_items(flagged)]
    lines += ["", "## Per-protocol scores", ""]
    if board.excluded:
        lines += [f"{DAGGER}: excluded from the score (not trusted on this dataset).", ""]
    lines += _markdown_rows(board, ["model", "kind", *board.protocols], excluded_protocols(board))
    lines.append("")
    names = ", ".join(markdown_escape(p) for p in board.trusted) or "none"
    if board.calibrated:
        lines.append(f"Trusted protocols used by `score` ({len(board.trusted)}): {names}.")
    else:
        lines.append(f"Protocols used by `score` ({len(board.trusted)}, plain mode): {names}.")
    lines.append("")
    if board.calibrated and board.verdicts:
        lines += ["## Verdict of each protocol", "", markdown_escape(TRUST_TERMS), ""]
        lines += _named_items(board.verdicts.items())
    elif board.excluded:
        lines += ["Excluded protocols:", "", *_named_items(board.excluded.items())]
    else:
        lines.append("Excluded protocols: none.")
    notes = model_notes(result)
    if notes:
        lines += ["", "## Models", "", *_named_items(notes)]
    lines += ["", "## Run", ""]
    lines += [f"- {label}: {markdown_escape(value)}" for label, value in run_items(result, created)]
    return "\n".join(lines) + "\n"


def _latex_rows(board: Any, columns: list[str], excluded: set[str]) -> list[str]:
    header = [
        latex_escape(c) + (r"\textsuperscript{\dag}" if c in excluded else "") for c in columns
    ]
    spec = "".join("l" if c in TEXT_COLUMNS else "r" for c in columns)
    return latex_lines(
        spec, header, _board_cells(board, columns, latex_escape, "\\textbf{{{}}}", "--")
    )


def latex_table(board: Any) -> str:
    r"""The leaderboard as LaTeX ``tabular`` environments (needs ``\usepackage{booktabs}``).

    Parameters
    ----------
    board
        A :class:`~scperteval.scoring.leaderboard.Leaderboard`.

    Returns
    -------
    str
        The headline table (the columns of ``leaderboard.csv``) under a comment
        holding the score's definition, then the per-protocol table; 3
        significant digits, missing values as ``--``, each column's best value
        in ``\textbf``, names escaped, protocols excluded from the score marked
        with a dagger.

    """
    excluded = excluded_protocols(board)
    lines = ["% Requires \\usepackage{booktabs}", f"% {board.definition}"]
    lines += _latex_rows(board, list(board.headline.columns), set())
    lines += ["\\end{tabular}", f"\\par\\footnotesize {latex_escape(board.definition)}.\\par", ""]
    columns = ["model", "kind", *board.protocols]
    lines += _latex_rows(board, columns, excluded)
    if excluded:
        lines.append(
            f"\\multicolumn{{{len(columns)}}}{{l}}{{\\footnotesize \\textsuperscript{{\\dag}}"
            " excluded from the score (not trusted on this dataset)}" + r" \\"
        )
    lines.append("\\end{tabular}")
    return "\n".join(lines) + "\n"
