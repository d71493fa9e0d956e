"""What a run under a split adds: folds in the results, each fold's headline, the criterion."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from scperteval.engine.calibrators import Thresholds, calibration_table
from scperteval.engine.engine import Engine
from scperteval.engine.protocol import Protocol
from scperteval.engine.suites import load_suite
from scperteval.scoring.derive import Derived
from scperteval.scoring.folds import (
    CRITERION_PROTOCOL,
    FOLD_COLUMN,
    fold_column,
    fold_scores,
    fold_summary,
)
from scperteval.scoring.mean_ratio import (
    BOOTSTRAP_RESAMPLES,
    CRITERION_BASELINE,
    mean_ratio_table,
)
from scperteval.scoring.verdict_changes import verdict_changes
from scperteval.splits.split import Split

__all__ = [
    "criterion_protocols",
    "criterion_record",
    "split_breakdown",
    "split_verdict_changes",
    "unsplit_twin",
]

#: The suite that defines the criterion's protocol.
CRITERION_SUITE = "ahlmann_eltze2025"


def criterion_protocols(chosen: Sequence[Protocol]) -> list[Protocol]:
    """The criterion's L2 protocol, when the run does not already score it.

    Parameters
    ----------
    chosen
        The run's protocols.

    Returns
    -------
    list of Protocol
        ``[l2_heg1000]`` (from the ``ahlmann_eltze2025`` suite), or ``[]``.

    """
    if any(p.name == CRITERION_PROTOCOL for p in chosen):
        return []
    return [p for p in load_suite(CRITERION_SUITE) if p.name == CRITERION_PROTOCOL]


def criterion_record(extra: Sequence[Protocol]) -> dict[str, Any]:
    """What ``run.json`` says of the criterion's definition."""
    return {
        "baseline": CRITERION_BASELINE,
        "protocol": CRITERION_PROTOCOL,
        "protocol_added": bool(extra),
        "resamples": BOOTSTRAP_RESAMPLES,
        "level": 0.95,
    }


def split_breakdown(
    derived: Derived,
    ranked: pd.DataFrame,
    all_results: pd.DataFrame,
    split: Split,
    chosen: Sequence[Protocol],
    extra: Sequence[Protocol],
    seed: int,
    derive_on: Callable[[pd.DataFrame, Sequence[str] | None], Derived],
) -> dict[str, pd.DataFrame]:
    """The tables a run under a split adds to its :class:`~scperteval.scoring.result.ScoreResult`.

    Parameters
    ----------
    derived
        The pooled derivation (every fold's test perturbations).
    ranked
        The results it was derived from.
    all_results
        The run's results, the criterion's added protocol included.
    split
        The split.
    chosen
        The run's protocols; the criterion is computed on those where lower is better.
    extra
        Protocols run for the criterion only.
    seed
        The run's seed (the criterion's bootstrap).
    derive_on
        Derives a results table as the pooled run does, on the given trusted
        protocols (``None``: those it trusts itself).

    Returns
    -------
    dict of pandas.DataFrame
        ``results`` (with a ``fold`` column), ``fold_scores`` (each fold's headline
        per entry), ``criterion``, ``fold_summary`` (pooled score, folds' spread,
        criterion columns) and ``criterion_values`` (the rows of ``extra``, with
        their fold).

    """
    results = derived.results.assign(**{FOLD_COLUMN: fold_column(derived.results, split)})
    # Every fold's headline averages the protocols the pooled run trusts.
    trusted = derived.leaderboard.trusted
    per_fold = fold_scores(
        ranked.assign(**{FOLD_COLUMN: fold_column(ranked, split)}),
        split.folds,
        lambda table: derive_on(table, trusted).leaderboard.headline,
    )
    judged = [p.name for p in chosen if p.better == "lower"] + [p.name for p in extra]
    criterion = mean_ratio_table(all_results, judged, seed)
    summary = fold_summary(derived.leaderboard.headline, per_fold, criterion)
    added = all_results[all_results["protocol"].isin([p.name for p in extra])]
    added = added.reset_index(drop=True)
    return {
        "results": results,
        "fold_scores": per_fold,
        "criterion": criterion,
        "fold_summary": summary,
        "criterion_values": added.assign(**{FOLD_COLUMN: fold_column(added, split)}),
    }


def unsplit_twin(engine: Engine) -> Engine:
    """An engine on the same context and settings as ``engine``, without its split.

    The verdicts a split changes are judged against the unsplit calibration of the
    same data: the twin shares the context, so the truth's statistics (group
    moments, centroids, DE) are computed once for both, while each engine keeps the
    values that depend on the split apart (see :meth:`Engine.use_split`).

    Parameters
    ----------
    engine
        The run's engine, under a split or not.

    Returns
    -------
    Engine
        A new engine with no split.

    """
    return Engine(
        engine.context,
        truth="half" if engine.truth_half == "truth" else "all",
        sample_cells=engine.sample_cells,
        pca_cells=engine.pca_cells,
        device=engine.device,
        precision=engine.precision,
        max_population_cells=engine.max_population_cells,
    )


def split_verdict_changes(
    engine: Engine,
    chosen: Sequence[Protocol],
    calibration: pd.DataFrame,
    thresholds: Thresholds,
    min_perturbations: int,
    run_controls: Callable[[Engine], pd.DataFrame],
) -> pd.DataFrame:
    """The verdicts a split changes: its calibration against that of the data unsplit.

    Parameters
    ----------
    engine
        The run's engine, under the split.
    chosen
        The protocols calibrated.
    calibration
        The calibration under the split.
    thresholds, min_perturbations
        The verdict's rule.
    run_controls
        Scores the protocols' controls on an engine (the run's tasks, timed).

    Returns
    -------
    pandas.DataFrame
        :func:`~scperteval.scoring.verdict_changes.verdict_changes`; the unsplit
        controls are scored on :func:`unsplit_twin` of ``engine``.

    """
    controls = run_controls(unsplit_twin(engine))
    meta = {p.name: {"better": p.better, "perfect": p.perfect} for p in chosen}
    unsplit = calibration_table(controls, meta, thresholds)
    return verdict_changes(calibration, unsplit, thresholds, min_perturbations)
