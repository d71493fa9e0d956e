"""Two runs in one process, on two threads, give what each gives alone, bit for bit.

Each run owns its kernel threads, core claims, scheduling locks and caches; the
process-wide thread limits (BLAS, torch) are only ever lowered, never restored
under another run. The protocols cover every piece a run holds: a PCA fit (the
core claim and the large-fit lock), dataset-scope rank protocols (their lock),
population sums (the BLAS limit), DE and centroid metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

import scperteval
from scperteval.simulation import simulate, simulate_predictions

PROTOCOLS = "pearson_delta_ctrl,mse,rank_pca,rank_full,energy_pca,mmd_pca,de_auprc"


@pytest.fixture(scope="module")
def screens() -> tuple[Any, Any]:
    first = simulate(n_perturbations=10, n_genes=80, cells_per_perturbation=40, seed=21)
    second = simulate(
        n_perturbations=8, n_genes=70, cells_per_perturbation=30, n_covariates=2, seed=22
    )
    return first, second


def _calibrate(adata: Any, seed: int) -> Callable[[], Any]:
    # The second screen's two cell lines are pooled on purpose: the runs are compared,
    # not their reading of the covariate.
    return lambda: scperteval.calibrate(
        adata, PROTOCOLS, seed=seed, workers=2, progress=False, pool=True
    )


def _score(adata: Any) -> Callable[[], Any]:
    models = {
        "noisy": simulate_predictions(adata, "scaled_effect", scale=0.7, noise=0.5, seed=4),
        "mean": simulate_predictions(adata, "mean", seed=5),
    }
    return lambda: scperteval.score(
        adata, models, PROTOCOLS, workers=2, progress=False, figures=False
    )


def _side_by_side(*runs: Callable[[], Any]) -> list[Any]:
    """The runs started together on threads of their own (a barrier lines them up)."""
    start = threading.Barrier(len(runs))
    results: list[Any] = [None] * len(runs)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            start.wait(60)
            results[index] = runs[index]()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    if errors:
        raise errors[0]
    return results


def _assert_same_values(found: pd.DataFrame, alone: pd.DataFrame) -> None:
    assert len(found) == len(alone) > 0
    assert np.isfinite(alone["value"]).mean() > 0.8  # the protocols really computed
    pd.testing.assert_frame_equal(found, alone, check_exact=True)


def test_two_calibrations_side_by_side_equal_each_alone(screens):
    first, second = screens
    alone = [_calibrate(first, 0)(), _calibrate(second, 3)()]
    together = _side_by_side(_calibrate(first, 0), _calibrate(second, 3))
    for found, expected in zip(together, alone, strict=True):
        _assert_same_values(found.results, expected.results)
        pd.testing.assert_frame_equal(found.calibration, expected.calibration, check_exact=True)


def test_a_score_beside_a_calibration_equals_each_alone(screens):
    first, second = screens
    alone_score, alone_calibration = _score(first)(), _calibrate(second, 1)()
    found_score, found_calibration = _side_by_side(_score(first), _calibrate(second, 1))
    _assert_same_values(found_score.results, alone_score.results)
    _assert_same_values(found_calibration.results, alone_calibration.results)
    pd.testing.assert_frame_equal(found_score.aggregates, alone_score.aggregates, check_exact=True)
