"""The linear baseline is fitted once per perturbation, however many protocols score it."""

from __future__ import annotations

import numpy as np

import scperteval
from scperteval.scoring import baselines


def test_the_linear_baseline_is_fitted_once_per_perturbation(monkeypatch):
    adata = scperteval.simulate(n_perturbations=10, n_genes=60, cells_per_perturbation=30, seed=4)
    protocols = "pearson_delta_ctrl,mse,mae,cosine_delta_ctrl,rank_full"
    reference = scperteval.score(
        adata, {"m": adata}, protocols, baselines=["linear"], figures=False
    ).results
    calls: list[int] = []
    fit = baselines.fit_linear_baseline

    def counted(engine, condition):
        calls.append(condition)
        return fit(engine, condition)

    monkeypatch.setattr(baselines, "fit_linear_baseline", counted)
    result = scperteval.score(adata, {"m": adata}, protocols, baselines=["linear"], figures=False)
    n_conditions = len(scperteval.Dataset(adata).conditions)
    assert sorted(calls) == list(range(n_conditions))
    linear = result.results[result.results["source_name"] == "linear"]
    assert linear["value"].notna().any()
    np.testing.assert_array_equal(result.results["value"], reference["value"])
