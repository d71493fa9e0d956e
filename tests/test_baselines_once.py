"""The linear baseline is fitted once per perturbation, however many protocols score it."""

from __future__ import annotations

import numpy as np
import pytest

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


def _textbook_linear(centroids, control, targets, condition, ridge=0.1, k=10):
    """The definition with numpy's SVD and scikit-learn's ridge regression."""
    from sklearn.linear_model import Ridge

    others = [c for c in range(len(centroids)) if c != condition]
    deltas = centroids[others] - control
    _, singular, vt = np.linalg.svd(deltas - deltas.mean(axis=0), full_matrices=False)
    n = int(min(k, np.sum(singular > 1e-12 * singular.max())))
    embedding = (vt[:n] * singular[:n, None]).T
    rows = [i for i, c in enumerate(others) if len(targets[c])]
    x = np.array([embedding[targets[others[i]]].mean(axis=0) for i in rows])
    model = Ridge(alpha=ridge, fit_intercept=True, solver="cholesky").fit(x, deltas[rows])
    query = embedding[targets[condition]].mean(axis=0)[None, :]
    return np.maximum(control + model.predict(query)[0], 0.0)


@pytest.mark.parametrize("n_perturbations", [8, 30], ids=["svd", "gram"])
def test_linear_baseline_equals_svd_and_scikit_learn_ridge(n_perturbations, monkeypatch, engine_of):
    svd_fits = []
    svd = baselines._svd_embedding
    monkeypatch.setattr(baselines, "_svd_embedding", lambda d: svd_fits.append(1) or svd(d))

    adata = scperteval.simulate(
        n_perturbations=n_perturbations, n_genes=80, cells_per_perturbation=20, seed=6
    )
    engine = engine_of(adata, truth="all")
    n_conditions = engine.context.layout.n_conditions
    centroids = engine.context.centroids("all")
    control = engine.control_mean(0)
    targets = [engine.target_genes(c) for c in range(n_conditions)]
    compared = 0
    for condition in range(n_conditions):
        if not len(targets[condition]):
            continue
        fitted = baselines.fit_linear_baseline(engine, condition).centroid
        expected = _textbook_linear(centroids, control, targets, condition)
        np.testing.assert_allclose(fitted, expected, rtol=1e-9, atol=1e-12)
        compared += 1
    assert compared >= n_perturbations // 2
    # Few perturbations: the SVD; enough of them: the group's Gram matrix, never the SVD.
    assert len(svd_fits) == (compared if n_perturbations < 13 else 0)
