"""Everything after the tidy results table, as pure functions of it.

Calibration, calibrated scores, aggregates, paired tests and the leaderboard
are derived from the results table alone (plus each protocol's direction and
perfect value), so stored results can be re-reported, re-thresholded and merged
without the data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from scperteval.engine.calibrators import Thresholds, calibration_table, verdict_reasons
from scperteval.scoring.calibrated import add_calibrated, aggregate
from scperteval.scoring.leaderboard import Leaderboard, build_leaderboard
from scperteval.scoring.pairwise import pairwise_tests, win_tie_loss
from scperteval.scoring.significance import NEGATIVE_BASELINES, paired_tests
from scperteval.scoring.trust import MIN_PERTURBATIONS, apply_evidence, verdict_sentences
from scperteval.scoring.vcc import add_vcc_column

__all__ = ["Derived", "derive"]

ENTRY_SOURCES = ("model", "baseline")
#: Representations whose protocols need the predicted cells, not only their mean.
CELL_REPRESENTATIONS = ("population", "control_de", "control_edistance")


@dataclass
class Derived:
    """Tables derived from a results table."""

    results: pd.DataFrame
    calibration: pd.DataFrame
    aggregates: pd.DataFrame
    leaderboard: Leaderboard
    tests: pd.DataFrame
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    wins: pd.DataFrame = field(default_factory=pd.DataFrame)


def derive(
    results: pd.DataFrame,
    protocols: pd.DataFrame,
    thresholds: Thresholds,
    aggregate_by: str = "median",
    correction: str = "bonferroni",
    calibrated: bool = True,
    seed: int = 0,
    min_perturbations: int = MIN_PERTURBATIONS,
    flags: Mapping[str, Sequence[str]] | None = None,
    trusted_protocols: Sequence[str] | None = None,
) -> Derived:
    """Derive calibration, calibrated scores, aggregates, tests and the leaderboard.

    Parameters
    ----------
    results
        Tidy results (``covariate, perturbation, protocol, source, source_name,
        value``); ``source`` is ``positive``/``negative`` for controls and
        ``model``/``baseline`` for what is ranked.
    protocols
        One row per protocol with at least ``protocol, better, perfect``.
    thresholds
        When a protocol is trusted.
    aggregate_by
        ``mean`` or ``median`` over perturbations.
    correction
        Multiple-testing correction of the paired tests.
    calibrated
        Calibrated scores (truth half) or plain scores (truth = all cells).
    seed
        Seed of the bootstrap confidence intervals.
    min_perturbations
        Fewest perturbations (with both controls defined) a protocol needs to
        be trusted
        (see :mod:`scperteval.scoring.trust`).
    flags
        Per entry, the sanity flags shown in the leaderboard
        (see :mod:`scperteval.scoring.flags`).
    trusted_protocols
        The protocols the leaderboard ranks on, decided elsewhere (a fold's
        breakdown uses those of the pooled run, so that every fold's headline
        averages the same protocols); by default those this calibration trusts.

    """
    better = {str(row.protocol): str(row.better) for row in protocols.itertuples()}
    meta = {
        str(row.protocol): {"better": str(row.better), "perfect": float(row.perfect)}
        for row in protocols.itertuples()
    }
    order = [str(p) for p in protocols["protocol"]]
    if calibrated:
        calibration = calibration_table(results, meta, thresholds)
        reasons = verdict_reasons(calibration, thresholds)
        calibration, reasons = apply_evidence(calibration, reasons, min_perturbations)
        verdicts = verdict_sentences(calibration, reasons, protocols, thresholds)
        trusted = [p for p in order if reasons.get(p) == ""]
        excluded = {p: reasons.get(p) or "no control values" for p in order if p not in trusted}
        if trusted_protocols is not None:
            chosen = set(trusted_protocols)
            trusted = [p for p in order if p in chosen]
            excluded = {p: "not trusted in the pooled run" for p in order if p not in chosen}
        with_calibrated = add_calibrated(results, better)
        column = "calibrated"
    else:
        calibration = pd.DataFrame()
        trusted, excluded, verdicts = list(order), {}, {}
        with_calibrated = results.assign(calibrated=float("nan"))
        column = "value"
    entries = with_calibrated[with_calibrated["source"].isin(ENTRY_SOURCES)]
    aggregates = aggregate(entries, column=column, seed=seed)
    board = build_leaderboard(
        aggregates,
        order,
        better,
        trusted,
        excluded,
        aggregate_by,
        calibrated=calibrated,
        entries=entries,
        seed=seed,
        flags=flags,
        population=_cell_protocols(protocols),
    )
    board.verdicts = verdicts
    add_vcc_column(board, results, protocols, calibrated)
    models = sorted(entries.loc[entries["source"] == "model", "source_name"].unique())
    present = set(entries["source_name"].unique())
    tests = paired_tests(
        entries, better, models, [b for b in NEGATIVE_BASELINES if b in present], correction
    )
    names = [str(n) for n in board.table["model"]]
    pairs = pairwise_tests(entries, better, names, trusted, correction, headline=calibrated)
    wins = win_tie_loss(pairs, names)
    return Derived(with_calibrated, calibration, aggregates, board, tests, pairs, wins)


def _cell_protocols(protocols: pd.DataFrame) -> list[str]:
    """The protocols that need predicted cells (population protocols)."""
    if "representation" not in protocols:
        return []
    cells = protocols["representation"].astype(str).isin(CELL_REPRESENTATIONS)
    return [str(p) for p in protocols.loc[cells, "protocol"]]
