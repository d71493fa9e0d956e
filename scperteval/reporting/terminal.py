"""What ``scperteval score`` and ``scperteval report`` print: the verdict in plain lines."""

from __future__ import annotations

from typing import Any

import pandas as pd

from scperteval.engine.failures import failure_counts, failure_lines
from scperteval.reporting.formatting import TRUST_TERMS, headline_frame, is_missing

__all__ = ["empty_entry_lines", "terminal_lines", "verdict_lines"]


def terminal_lines(result: Any, failures_file: str = "failures.csv") -> list[str]:
    """The headline table, its definition, the untrusted protocols and the NaN count.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.
    failures_file
        Where the NaN values' counts are written (named in their line).

    Returns
    -------
    list of str
        Lines to print: the compact leaderboard (3 significant digits, with its
        ``listing`` column), the score's definition, notes (entries listed apart),
        the sanity flags per model, why an entry has no value, one line per
        untrusted protocol and the count of trusted ones, and the NaN count.

    """
    board = result.leaderboard
    frame = headline_frame(board)
    lines = frame.to_string(index=False).splitlines()
    lines.append(board.definition)
    lines += board.notes
    lines += [f"FLAG {name}: {flag}" for name, flags in board.flags.items() for flag in flags]
    lines += empty_entry_lines(board.table, result.results, failures_file)
    if board.calibrated and board.verdicts:
        lines += verdict_lines(board.verdicts, board.trusted)
    lines += failure_lines(result.results, failures_file)
    return lines


def verdict_lines(verdicts: dict[str, str], trusted: list[str]) -> list[str]:
    """One line per protocol that is not trusted, then how many are.

    Parameters
    ----------
    verdicts
        Per protocol, the sentence saying whether it is trusted and why.
    trusted
        The protocols the score uses.

    Returns
    -------
    list of str
        The BDS and DRF definitions and one indented line per untrusted protocol
        (none when all are trusted), then ``N of M protocols trusted``.

    """
    untrusted = [protocol for protocol in verdicts if protocol not in trusted]
    lines = [TRUST_TERMS, *(f"  {p}: {verdicts[p]}" for p in untrusted)] if untrusted else []
    lines.append(
        f"{len(verdicts) - len(untrusted)} of {len(verdicts)} protocols trusted (every verdict "
        "with its evidence: report.html)"
    )
    return lines


def empty_entry_lines(
    table: pd.DataFrame, results: pd.DataFrame, failures_file: str = "failures.csv"
) -> list[str]:
    """Why an entry of the leaderboard has no score: the commonest reason of its NaN values.

    Parameters
    ----------
    table
        The leaderboard table (``model`` and ``score`` columns).
    results
        The tidy per-perturbation results.
    failures_file
        Where all the reasons are counted.

    Returns
    -------
    list of str
        One line per entry without a score that has NaN values, e.g.
        ``linear: no values (33 of 990: DegenerateInput: ...; all in failures.csv)``.

    """
    counts = failure_counts(results)
    lines = []
    for row in table.itertuples(index=False):
        name = str(row.model)
        if not is_missing(row.score):
            continue
        own = counts[counts["source_name"].astype(str) == name]
        if own.empty:
            continue
        by_reason = own.groupby("reason", sort=True)["count"].sum()
        reason = str(by_reason.sort_values(ascending=False, kind="stable").index[0])
        values = int((results["source_name"].astype(str) == name).sum())
        lines.append(
            f"{name}: no score; {int(own['count'].sum())} of its {values} values are NaN, "
            f"most for '{reason}' (all reasons in {failures_file})"
        )
    return lines
