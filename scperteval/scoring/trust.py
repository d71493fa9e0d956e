"""Which protocols a leaderboard may use, and one plain sentence saying why.

A protocol is trusted on a dataset when its controls separate (BDS and DRF
clear their thresholds, see :mod:`scperteval.engine.calibrators`) **and** it was
scored on enough perturbations for that to mean something: at least
``min_perturbations`` (default 10) with both controls defined, counted over the
perturbations its overall verdict is computed on. With fewer, it is
"insufficient evidence", whatever its BDS. A covariate group's own row of the
calibration table is marked the same way by its own count (McFaline-Figueroa's
three cell lines have 9 perturbations each: every group row is insufficient on
its own, the protocol's verdict rests on the 27 together).

Why 10: a protocol whose positive control is no better than its negative one
still wins each perturbation with probability 1/2, so its BDS is a binomial
fraction. It reaches the default BDS threshold 0.75 by chance with
probability 0.50 on 1 perturbation, 0.31 on 4, 0.14 on 8, and 0.055 on 10
(``scipy.stats.binom.sf(ceil(0.75 n) - 1, n, 0.5)``): 10 is the smallest count
at which an uninformative protocol passes in about one dataset in twenty.

BDS (bound discrimination score): the fraction of perturbations on which the
positive control is strictly better than the negative control. DRF (dynamic
range fraction): the share of the room between the negative control and a
perfect score that the positive control covers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from scperteval.engine.calibrators import OVERALL, Thresholds
from scperteval.reporting.formatting import TRUST_TERMS, percent

__all__ = ["MIN_PERTURBATIONS", "TRUST_TERMS", "apply_evidence", "verdict_sentences"]

MIN_PERTURBATIONS = 10


def apply_evidence(
    calibration: pd.DataFrame, reasons: Mapping[str, str], min_perturbations: int
) -> tuple[pd.DataFrame, dict[str, str]]:
    """Mark protocols scored on too few perturbations as not trusted.

    Parameters
    ----------
    calibration
        Output of :func:`~scperteval.engine.calibrators.calibration_table`.
    reasons
        Per protocol, why it is not trusted (empty string when trusted).
    min_perturbations
        Fewest perturbations with both controls defined.

    Returns
    -------
    tuple
        The calibration table with an ``evidence`` column (``sufficient`` or
        ``insufficient``) and ``trusted`` false on every row (covariate group or
        overall) with fewer perturbations, and the reasons updated for the
        protocols whose overall row has fewer (those are not trusted).

    """
    table = calibration.copy()
    short = table["n"].to_numpy() < min_perturbations
    table["evidence"] = np.where(short, "insufficient", "sufficient")
    table.loc[short, "trusted"] = False
    updated = dict(reasons)
    overall = table[table["covariate"].astype(str) == OVERALL]
    for row in overall.itertuples():
        n = int(row.n)
        if n >= min_perturbations:
            continue
        protocol = str(row.protocol)
        text = (
            f"insufficient evidence: {n} perturbation{'s' if n != 1 else ''} with both controls "
            f"defined (fewer than {min_perturbations})"
        )
        previous = updated.get(protocol, "")
        updated[protocol] = text + (f"; {previous}" if previous else "")
    return table, updated


def verdict_sentences(
    calibration: pd.DataFrame,
    reasons: Mapping[str, str],
    protocols: pd.DataFrame,
    thresholds: Thresholds,
) -> dict[str, str]:
    """One plain sentence per protocol: trusted or not, and the evidence.

    Parameters
    ----------
    calibration
        Calibration table (with the ``evidence`` column of :func:`apply_evidence`).
    reasons
        Per protocol, why it is not trusted (empty when trusted).
    protocols
        Protocol descriptions (``protocol, positive, negative``).
    thresholds
        The trust thresholds.

    Returns
    -------
    dict
        Protocol name to a sentence such as ``trusted: the technical_duplicate
        beats the dataset_mean on 33/33 perturbations (BDS 1.00) and covers a
        median 78% of the range (DRF 0.78)``.

    """
    described = protocols.set_index(protocols["protocol"].astype(str))
    overall = calibration[calibration["covariate"].astype(str) == OVERALL]
    sentences: dict[str, str] = {}
    for row in overall.itertuples():
        protocol = str(row.protocol)
        positive = _role(described, protocol, "positive")
        negative = _role(described, protocol, "negative")
        n = int(row.n)
        reason = reasons.get(protocol, "")
        verdict = "trusted" if not reason else "not trusted"
        if n == 0:
            sentences[protocol] = f"not trusted: {reason}"
            continue
        wins = int(round(float(row.bds) * n))
        drf_value = row.drf_median if thresholds.drf_statistic == "median" else row.drf_mean
        share = percent(float(drf_value))
        sentence = (
            f"{verdict}: the {positive} beats the {negative} on {wins}/{n} perturbations "
            f"(BDS {float(row.bds):.2f}) and covers a {thresholds.drf_statistic} {share} of "
            f"the range (DRF {float(drf_value):.2f})"
        )
        if reason:
            sentence += f" ({reason})"
        sentences[protocol] = sentence
    return sentences


def _role(described: pd.DataFrame, protocol: str, column: str) -> str:
    if column in described and protocol in described.index:
        value = described.loc[protocol, column]
        if isinstance(value, pd.Series):
            value = value.iloc[0]
        return str(value).replace("_", " ")
    return f"{column} control"
