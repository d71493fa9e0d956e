"""Counting the values that could not be computed, by protocol and reason.

A metric that meets a degenerate input (too few cells, a constant vector, a
perturbation whose target gene is not measured...) gives NaN with its reason; the
run goes on. These helpers turn the reasons of a results table into the counts that
``calibrate`` and ``score`` report, so that nothing is dropped silently.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["failure_counts", "failure_lines", "failure_record"]

FAILURE_COLUMNS = ("protocol", "source_name", "reason", "count")


def failure_counts(results: pd.DataFrame) -> pd.DataFrame:
    """How many values are NaN, per protocol, candidate and reason.

    Parameters
    ----------
    results
        A tidy results table with ``protocol, source_name, value, reason`` columns.

    Returns
    -------
    pandas.DataFrame
        ``protocol, source_name, reason, count``, largest counts first; empty when
        every value was computed.

    """
    failed = results[results["value"].isna()]
    if failed.empty:
        return pd.DataFrame(columns=FAILURE_COLUMNS)
    reasons = failed["reason"].fillna("").replace("", "no reason given")
    counts = (
        failed.assign(reason=reasons)
        .groupby(["protocol", "source_name", "reason"], sort=True)
        .size()
        .rename("count")
        .reset_index()
    )
    return counts.sort_values(
        ["count", "protocol", "source_name"], ascending=[False, True, True], kind="stable"
    ).reset_index(drop=True)


def failure_record(results: pd.DataFrame) -> dict[str, Any]:
    """``{protocol: {reason: count}}`` for ``run.json``."""
    record: dict[str, dict[str, int]] = {}
    for row in failure_counts(results).itertuples(index=False):
        by_reason = record.setdefault(str(row.protocol), {})
        by_reason[str(row.reason)] = by_reason.get(str(row.reason), 0) + int(row.count)
    return record


def failure_lines(results: pd.DataFrame, listed_in: str = "failures.csv") -> list[str]:
    """One line on the NaN values: how many, and the file that lists them.

    Parameters
    ----------
    results
        A tidy results table with ``protocol, source_name, value, reason`` columns.
    listed_in
        Where the counts by protocol, candidate and reason are written.

    Returns
    -------
    list of str
        No line when every value was computed, else one.

    """
    counts = failure_counts(results)
    if counts.empty:
        return []
    total = int(counts["count"].sum())
    return [
        f"{total} values are NaN by rule (a metric undefined on its input), counted by "
        f"protocol, candidate and reason in {listed_in}"
    ]
