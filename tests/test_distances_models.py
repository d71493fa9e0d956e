"""Model-based distances: classifiers against scikit-learn, the NB fit against statsmodels."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from scipy.stats import nbinom
from sklearn.linear_model import LogisticRegression

from scperteval.distances import onesided, pairwise, permutation_test, resolve_distance
from scperteval.distances._models import _nb_log_likelihood, fit_negative_binomial
from scperteval.errors import DatasetError, SpecError


def _groups(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "ctrl": rng.normal(size=(40, 3)),
        "far": rng.normal(size=(30, 3)) + 2.5,
        "near": rng.normal(size=(35, 3)) + 0.2,
    }


def _adata(groups: dict[str, np.ndarray]) -> ad.AnnData:
    cells = np.vstack(list(groups.values()))
    adata = ad.AnnData(cells.copy())
    adata.obs["g"] = pd.Categorical(np.concatenate([[g] * len(v) for g, v in groups.items()]))
    adata.obsm["X_pca"] = cells
    return adata


def test_classifier_proba_against_sklearn() -> None:
    groups = _groups()
    x, y = groups["far"], groups["ctrl"]
    distance = resolve_distance("classifier_proba(seed=4)")
    held = np.sort(np.random.default_rng(4).choice(len(x), int(len(x) * 0.2), replace=False))
    train = np.setdiff1d(np.arange(len(x)), held)
    model = LogisticRegression().fit(
        np.vstack([y, x[train]]), np.r_[np.zeros(len(y)), np.ones(train.size)]
    )
    expected = model.predict_proba(x[held])[:, 1].mean()
    assert distance(x, y) == pytest.approx(expected, rel=1e-12)
    # Separated groups are told apart more confidently than overlapping ones.
    assert distance(x, y) > distance(groups["near"], y)
    # pertpy's roles: the second argument is split.
    swapped = resolve_distance("classifier_proba(seed=4, pertpy=True)")
    assert swapped(y, x) == pytest.approx(expected, rel=1e-12)


def test_classifier_projection_against_sklearn() -> None:
    groups = _groups(1)
    adata = _adata(groups)
    values = onesided(adata, "g", "ctrl", "classifier_cp")
    others = ["far", "near"]
    model = LogisticRegression().fit(
        np.vstack([groups[g] for g in others]),
        np.concatenate([[g] * len(groups[g]) for g in others]),
    )
    probabilities = model.predict_proba(groups["ctrl"]).mean(axis=0)
    for g in others:
        expected = 1 - probabilities[list(model.classes_).index(g)]
        assert values.loc[g] == pytest.approx(expected, rel=1e-12)
    assert values.loc["ctrl"] == 0.0
    assert values.loc["far"] > values.loc["near"]
    with pytest.raises(SpecError, match="only onesided|onesided\\(\\) has it"):
        pairwise(adata, "g", "classifier_cp")
    with pytest.raises(SpecError, match="permutation_test"):
        permutation_test(adata, "g", "ctrl", "classifier_cp")


def test_negative_binomial_fit_maximises_the_likelihood() -> None:
    rng = np.random.default_rng(3)
    counts = rng.negative_binomial(2, 2 / (2 + 4.0), size=400).astype(float)
    mu, alpha = fit_negative_binomial(counts)
    assert mu == pytest.approx(counts.mean(), rel=1e-15)

    def total(a: float) -> float:
        return float(_nb_log_likelihood(counts, mu, a).sum())

    assert total(alpha) >= max(total(alpha * 1.001), total(alpha / 1.001))
    # Our NB2 log-probabilities equal scipy's with n = 1 / alpha, p = n / (n + mu).
    n = 1 / alpha
    np.testing.assert_allclose(
        _nb_log_likelihood(counts, mu, alpha), nbinom.logpmf(counts, n, n / (n + mu)), rtol=1e-10
    )
    multitest = pytest.importorskip("statsmodels.discrete.discrete_model")
    fitted = multitest.NegativeBinomialP(counts, np.ones_like(counts)).fit(disp=False)
    assert alpha == pytest.approx(fitted.params[1], rel=1e-3)
    assert mu == pytest.approx(np.exp(fitted.params[0]), rel=1e-6)
    # Counts no more variable than their mean: the Poisson limit.
    assert fit_negative_binomial(np.array([1.0, 2.0, 1.0, 2.0]))[1] == 0.0


def test_nb_ll_value_by_hand() -> None:
    rng = np.random.default_rng(8)
    x = rng.negative_binomial(3, 0.4, size=(50, 4)).astype(float)
    y = rng.negative_binomial(3, 0.3, size=(60, 4)).astype(float)
    expected = []
    for g in range(4):
        mu, alpha = fit_negative_binomial(x[:, g])
        n = 1 / alpha
        expected.append(nbinom.logpmf(y[:, g], n, n / (n + mu)).mean())
    assert resolve_distance("nb_ll")(x, y) == pytest.approx(-np.mean(expected), rel=1e-10)
    with pytest.raises(DatasetError, match="integer counts"):
        resolve_distance("nb_ll")(x + 0.5, y)
