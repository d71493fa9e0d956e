"""Which protocols' trust verdicts a split changes, against the unsplit calibration.

Under a split the negative controls pool the training perturbations of each fold
instead of all other perturbations (see the science notes, "Scoring under a
split"), so DRF and BDS, and with them a protocol's verdict, can move. The
comparison sets each protocol's overall calibration under the split beside the one
of the same data without it.
"""

from __future__ import annotations

import pandas as pd

from scperteval.engine.calibrators import Thresholds, verdict_reasons
from scperteval.scoring.trust import apply_evidence

__all__ = ["overall_verdicts", "verdict_change_lines", "verdict_changes"]

#: The overall calibration columns compared, each written twice (unsplit, split).
COMPARED = ("n", "drf_mean", "drf_median", "bds", "trusted", "reason")


def overall_verdicts(
    calibration: pd.DataFrame, thresholds: Thresholds, min_perturbations: int
) -> pd.DataFrame:
    """One row per protocol: the overall calibration, its verdict and the reason.

    Parameters
    ----------
    calibration
        A calibration table (:func:`~scperteval.engine.calibrators.calibration_table`).
    thresholds
        The trust thresholds.
    min_perturbations
        The evidence rule's fewest perturbations (:mod:`scperteval.scoring.trust`).

    Returns
    -------
    pandas.DataFrame
        ``protocol, n, drf_mean, drf_median, bds, trusted, reason`` (reason empty
        when trusted).

    """
    table, reasons = apply_evidence(
        calibration, verdict_reasons(calibration, thresholds), min_perturbations
    )
    table = table[table["covariate"] == "all"]
    table = table.assign(reason=table["protocol"].map(reasons).fillna(""))
    return table[["protocol", *COMPARED]].reset_index(drop=True)


def verdict_changes(
    split_calibration: pd.DataFrame,
    unsplit_calibration: pd.DataFrame,
    thresholds: Thresholds,
    min_perturbations: int,
) -> pd.DataFrame:
    """Each protocol's overall verdict under the split beside its unsplit verdict.

    Parameters
    ----------
    split_calibration, unsplit_calibration
        Calibration tables of the same data and protocols, under the split and without.
    thresholds, min_perturbations
        The verdict's rule, as for :func:`overall_verdicts`.

    Returns
    -------
    pandas.DataFrame
        ``protocol``, then ``<column>_unsplit`` and ``<column>_split`` for ``n,
        drf_mean, drf_median, bds, trusted, reason``, and ``changed`` (the two
        ``trusted`` verdicts differ), in the split table's protocol order.

    """
    split = overall_verdicts(split_calibration, thresholds, min_perturbations)
    unsplit = overall_verdicts(unsplit_calibration, thresholds, min_perturbations)
    merged = split.merge(unsplit, on="protocol", how="left", suffixes=("_split", "_unsplit"))
    merged = merged[["protocol", *(f"{c}_{s}" for c in COMPARED for s in ("unsplit", "split"))]]
    changed = merged["trusted_split"].astype(bool) != merged["trusted_unsplit"].astype(bool)
    return merged.assign(changed=changed.to_numpy())


def verdict_change_lines(changes: pd.DataFrame) -> list[str]:
    """Sentences naming the protocols whose verdict the split changes.

    Parameters
    ----------
    changes
        A :func:`verdict_changes` table.

    Returns
    -------
    list of str
        One line per changed verdict, with both median DRFs and BDS, then a count
        line; a single line saying no verdict changes otherwise.

    """
    moved = changes[changes["changed"]]
    if moved.empty:
        compared = f"{len(changes)} protocol{'' if len(changes) == 1 else 's'} compared"
        return [f"under the split no verdict changes ({compared})"]
    lines = []
    for row in moved.itertuples():
        before = "trusted" if row.trusted_unsplit else "not trusted"
        after = "trusted" if row.trusted_split else "not trusted"
        lines.append(
            f"{row.protocol}: {before} without the split, {after} under it "
            f"(DRF median {row.drf_median_unsplit:.3f} -> {row.drf_median_split:.3f}, "
            f"BDS {row.bds_unsplit:.2f} -> {row.bds_split:.2f})"
        )
    lines.append(f"under the split {len(moved)} of {len(changes)} verdicts change")
    return lines
