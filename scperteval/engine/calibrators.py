"""Calibrators: whether a protocol tells a replicate of the truth from a baseline.

From the positive and negative controls' scores of every perturbation:

- **DRF** (dynamic range fraction, Miller et al. 2025): for a higher-is-better
  metric ``(s_pos - s_neg) / (perfect - s_neg + 1e-6)``, for a lower-is-better
  one ``(s_neg - s_pos) / (s_neg - perfect + 1e-6)``, clipped to [-1, 1]: the
  share of the room between the negative control and a perfect score that the
  positive control covers.
- **BDS** (bound discrimination score, Vollenweider & Buhlmann 2026): the
  fraction of perturbations whose positive control is strictly better than the
  negative control.

A perturbation where either control is NaN is skipped (and counted in
``n_skipped``). Unbiased distance estimates (energy distance, MMD) can fall
below their perfect value 0 when two samples do not differ detectably. For the
DRF such a value counts as perfect (it is as close to the truth as the estimator
can tell: a positive control there has DRF 1, a negative control there leaves no
dynamic range); BDS compares the raw values. The number of perturbations where
a lower-is-better control scored below its perfect value is reported
(``n_negative``).

A protocol is **trusted** on a dataset when, over all its perturbations,
``bds >= bds_min`` and the DRF statistic (median by default) ``>= drf_min``.
Defaults: ``bds_min = 0.75``, ``drf_min = 0.2``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from scperteval.errors import SpecError
from scperteval.registry import Registry

__all__ = ["CALIBRATORS", "Thresholds", "drf", "bds", "calibration_table", "CALIBRATION_COLUMNS"]

CALIBRATORS = Registry("calibrator")
DRF_EPSILON = 1e-6
OVERALL = "all"
CALIBRATION_COLUMNS = (
    "protocol",
    "covariate",
    "n",
    "drf_mean",
    "drf_median",
    "bds",
    "trusted",
    "n_skipped",
    "n_negative",
)


@dataclass(frozen=True)
class Thresholds:
    """When a protocol is trusted: ``bds >= bds_min`` and DRF ``>= drf_min``.

    ``drf_statistic`` chooses the DRF aggregate compared (``median`` or ``mean``).
    """

    bds_min: float = 0.75
    drf_min: float = 0.2
    drf_statistic: str = "median"

    def __post_init__(self) -> None:
        if self.drf_statistic not in ("median", "mean"):
            raise SpecError(f"drf_statistic must be 'median' or 'mean', got {self.drf_statistic!r}")
        # BDS is a fraction; DRF is 1 for a perfect positive control and unbounded below.
        if not (isinstance(self.bds_min, (int, float)) and 0.0 <= self.bds_min <= 1.0):
            raise SpecError(f"threshold bds must lie in [0, 1], got {self.bds_min!r}")
        if not (isinstance(self.drf_min, (int, float)) and -math.inf < self.drf_min <= 1.0):
            raise SpecError(f"threshold drf must be a number at most 1, got {self.drf_min!r}")

    def as_dict(self) -> dict[str, Any]:
        """Plain mapping (for run.json and reports)."""
        return asdict(self)

    @classmethod
    def parse(cls, text: str) -> Thresholds:
        """Read ``bds=0.8,drf=0.3,statistic=mean`` (any subset)."""
        values: dict[str, Any] = {}
        aliases = {"bds": "bds_min", "drf": "drf_min", "statistic": "drf_statistic"}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, raw = item.partition("=")
            key = aliases.get(key.strip(), key.strip())
            if not sep or key not in ("bds_min", "drf_min", "drf_statistic"):
                raise ValueError(
                    f"cannot read threshold {item!r}; use bds=0.75,drf=0.2,statistic=median"
                )
            if key == "drf_statistic":
                values[key] = raw.strip()
                continue
            try:
                values[key] = float(raw)
            except ValueError:
                raise ValueError(f"threshold {item!r}: {raw.strip()!r} is not a number") from None
        return cls(**values)


@CALIBRATORS.register("drf", description="dynamic range fraction covered by the positive control")
def drf(positive: np.ndarray, negative: np.ndarray, better: str, perfect: float) -> np.ndarray:
    """Dynamic range fraction per perturbation (NaN where a control is NaN).

    Parameters
    ----------
    positive, negative
        Scores of the positive and negative controls, one per perturbation.
    better
        ``higher`` or ``lower``.
    perfect
        The metric's ideal value.

    Returns
    -------
    numpy.ndarray
        Values in [-1, 1]; 1 means the positive control is perfect, 0 that it is
        no better than the negative control.

    Examples
    --------
    >>> drf(np.array([0.02]), np.array([0.05]), "lower", 0.0).round(6).tolist()
    [0.599988]

    """
    positive = np.asarray(positive, dtype=np.float64)
    negative = np.asarray(negative, dtype=np.float64)
    # An estimate beyond the perfect value (an unbiased distance below 0) is as
    # good as the estimator can tell: it counts as perfect, so a negative control
    # there leaves no dynamic range instead of flipping the sign of the ratio.
    with np.errstate(invalid="ignore", divide="ignore"):
        if better == "higher":
            positive, negative = np.minimum(positive, perfect), np.minimum(negative, perfect)
            value = (positive - negative) / (perfect - negative + DRF_EPSILON)
        else:
            positive, negative = np.maximum(positive, perfect), np.maximum(negative, perfect)
            value = (negative - positive) / (negative - perfect + DRF_EPSILON)
    return np.clip(value, -1.0, 1.0)


@CALIBRATORS.register("bds", description="fraction of perturbations where positive beats negative")
def bds(positive: np.ndarray, negative: np.ndarray, better: str) -> np.ndarray:
    """Per perturbation: 1.0 where the positive control is strictly better, else 0.0.

    NaN where either control is NaN.
    """
    positive = np.asarray(positive, dtype=np.float64)
    negative = np.asarray(negative, dtype=np.float64)
    wins = positive > negative if better == "higher" else positive < negative
    return np.where(np.isfinite(positive) & np.isfinite(negative), wins.astype(np.float64), np.nan)


def calibration_table(
    results: pd.DataFrame,
    protocols: Mapping[str, Mapping[str, Any]],
    thresholds: Thresholds = Thresholds(),
) -> pd.DataFrame:
    """DRF, BDS and verdict per protocol, per covariate group and overall.

    Parameters
    ----------
    results
        Tidy results with ``source`` in ``positive`` / ``negative``.
    protocols
        Per protocol name, at least ``better`` and ``perfect``.
    thresholds
        The trust thresholds.

    Returns
    -------
    pandas.DataFrame
        Columns ``protocol, covariate, n, drf_mean, drf_median, bds, trusted,
        n_skipped, n_negative``; covariate ``all`` is the overall row. The verdict
        of a covariate row uses that group's values.

    """
    controls = results[results["source"].isin(["positive", "negative"])]
    # groupby + unstack keeps only observed (protocol, covariate, perturbation)
    # rows (pivot_table(dropna=False) would add every combination of the three
    # labels, counting perturbations absent from a covariate group as skipped).
    wide = (
        controls.groupby(
            ["protocol", "covariate", "perturbation", "source"], observed=True, sort=True
        )["value"]
        .first()
        .unstack("source")
        .reset_index()
    )
    for column in ("positive", "negative"):
        if column not in wide:
            wide[column] = np.nan
    rows: list[dict[str, Any]] = []
    for protocol, frame in wide.groupby("protocol", sort=True, observed=True):
        meta = protocols[str(protocol)]
        positive, negative = frame["positive"].to_numpy(), frame["negative"].to_numpy()
        frame = frame.assign(
            drf=drf(positive, negative, meta["better"], float(meta["perfect"])),
            bds=bds(positive, negative, meta["better"]),
        )
        groups: list[tuple[str, pd.DataFrame]] = [
            (str(c), f) for c, f in frame.groupby("covariate", sort=True, observed=True)
        ]
        if len(groups) > 1 or groups[0][0] != OVERALL:
            groups.append((OVERALL, frame))
        for covariate, part in groups:
            rows.append(_summarise(str(protocol), covariate, part, thresholds, meta))
    return pd.DataFrame(rows, columns=CALIBRATION_COLUMNS)


def _summarise(
    protocol: str,
    covariate: str,
    part: pd.DataFrame,
    thresholds: Thresholds,
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    valid = part[np.isfinite(part["drf"]) & np.isfinite(part["bds"])]
    n = int(len(valid))
    drf_mean = float(valid["drf"].mean()) if n else np.nan
    drf_median = float(valid["drf"].median()) if n else np.nan
    bds_value = float(valid["bds"].mean()) if n else np.nan
    drf_value = drf_median if thresholds.drf_statistic == "median" else drf_mean
    trusted = bool(n > 0 and bds_value >= thresholds.bds_min and drf_value >= thresholds.drf_min)
    # Only a lower-is-better estimate can overshoot its perfect value (an unbiased
    # distance below 0); for other metrics the count is 0 by construction.
    perfect = float(meta["perfect"])
    below = (part["positive"] < perfect) | (part["negative"] < perfect)
    n_negative = int(below.sum()) if meta["better"] == "lower" else 0
    values = (protocol, covariate, n, drf_mean, drf_median, bds_value, trusted, len(part) - n)
    return dict(zip(CALIBRATION_COLUMNS, (*values, n_negative), strict=True))


def verdict_reasons(table: pd.DataFrame, thresholds: Thresholds) -> dict[str, str]:
    """Why each protocol is not trusted overall (empty string when trusted)."""
    reasons: dict[str, str] = {}
    overall = table[table["covariate"] == OVERALL]
    for row in overall.itertuples():
        drf_value = row.drf_median if thresholds.drf_statistic == "median" else row.drf_mean
        problems: Sequence[str] = [
            text
            for failed, text in (
                (row.n == 0, "no perturbation with both controls defined"),
                (not row.bds >= thresholds.bds_min, f"BDS {row.bds:.2f} < {thresholds.bds_min}"),
                (
                    not drf_value >= thresholds.drf_min,
                    f"DRF {thresholds.drf_statistic} {drf_value:.2f} < {thresholds.drf_min}",
                ),
            )
            if failed
        ]
        reasons[str(row.protocol)] = "; ".join(problems)
    return reasons
