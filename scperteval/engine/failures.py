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


def failure_lines(results: pd.DataFrame, limit: int = 5) -> list[str]:
    """A few readable lines on the NaN values: how many, and the commonest reasons."""
    counts = failure_counts(results)
    if counts.empty:
        return []
    total = int(counts["count"].sum())
    lines = [f"{total} values are NaN by rule (counts in failures.csv):"]
    for row in counts.head(limit).itertuples(index=False):
        lines.append(f"  {row.count:>5} x {row.protocol} / {row.source_name}: {row.reason}")
    if len(counts) > limit:
        lines.append(f"  ... and {len(counts) - limit} more (protocol, candidate, reason)")
    return lines
