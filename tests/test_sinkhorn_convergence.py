"""Sinkhorn values against a slow textbook solver iterated to convergence at eps = blur^2.

The reference is written from the definitions: for each of OT_eps(a, b), OT_eps(a, a)
and OT_eps(b, b), log-domain Sinkhorn updates on the cost ``|x - y|^2 / 2`` with
uniform weights, iterated at the fixed temperature ``eps = blur^2`` until the
potentials move by less than 1e-12 eps; the temperature is first halved from the
largest cost down to ``eps`` (each stage to the same tolerance) only to start the
fixed-temperature iterations close to their limit. Then
``S = OT_eps(a, b) - (OT_eps(a, a) + OT_eps(b, b)) / 2`` and the metric is
``sqrt(2 S)``.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp

from scperteval.metrics import PerturbationContext
from scperteval.metrics.population import DEFAULT_TOL, sinkhorn


def _c_transform(cost, log_weights, potential, eps):
    return -eps * logsumexp(log_weights[None, :] + (potential[None, :] - cost) / eps, axis=1)


def _entropic_ot(x, y, eps, tol=1e-12, max_iter=50_000):
    symmetric = x is y
    cost = ((x[:, None, :] - y[None, :, :]) ** 2).sum(axis=-1) / 2.0
    log_a = np.full(len(x), -np.log(len(x)))
    log_b = np.full(len(y), -np.log(len(y)))
    f, g = np.zeros(len(x)), np.zeros(len(y))
    stage = max(float(cost.max()), eps)
    while True:
        for _ in range(max_iter):
            if symmetric:
                # Alternating updates of a self-problem oscillate; its averaged
                # fixed-point iteration does not.
                updated = 0.5 * (f + _c_transform(cost, log_a, f, stage))
                change, f, g = np.abs(updated - f).max(), updated, updated
            else:
                f = _c_transform(cost, log_b, g, stage)
                updated = _c_transform(cost.T, log_a, f, stage)
                change, g = np.abs(updated - g).max(), updated
            if change < tol * stage:
                break
        else:
            raise AssertionError("the reference did not converge")
        if stage == eps:
            return f.mean() + g.mean()
        stage = max(stage / 2.0, eps)


def reference_sinkhorn(x, y, blur):
    eps = blur**2
    divergence = _entropic_ot(x, y, eps) - (_entropic_ot(x, x, eps) + _entropic_ot(y, y, eps)) / 2
    return np.sqrt(2.0 * divergence)


def _check(x, y, blur):
    expected = reference_sinkhorn(x, y, blur)
    assert sinkhorn(x, y, blur=blur, tol=DEFAULT_TOL) == pytest.approx(expected, rel=1e-6)
    # The annealing alone stops measurably short: the comparison can tell them apart.
    assert abs(sinkhorn(x, y, blur=blur, tol=None) / expected - 1) > 1e-4


@pytest.mark.parametrize(("seed", "dim", "blur"), [(0, 20, 0.5), (2, 30, 0.5)])
def test_sinkhorn_matches_converged_reference_on_simulated_clouds(seed, dim, blur):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(20, dim))
    y = 1.2 * rng.normal(size=(24, dim)) + 0.4
    _check(x, y, blur)


@pytest.fixture(scope="module")
def norman_pca_pairs(_devel_adata):
    """Two perturbations' cells and control cells of the Norman subset, first 50 PCs."""
    adata = _devel_adata[_devel_adata.obs["dataset"] == "norman19"]
    matrix = np.asarray(adata.X.todense() if hasattr(adata.X, "todense") else adata.X)
    centred = matrix - matrix.mean(axis=0)
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    points = centred @ axes[:50].T
    labels = adata.obs["condition"].astype(str).to_numpy()
    counts = adata.obs["condition"].astype(str).value_counts()
    perturbations = [label for label in counts.index if label != "control"][:2]
    rng = np.random.default_rng(7)
    control = points[labels == "control"]
    pairs = []
    for label in perturbations:
        cells = points[labels == label]
        pairs.append(
            (
                cells[rng.choice(len(cells), 20, replace=False)],
                control[rng.choice(len(control), 24, replace=False)],
            )
        )
    return pairs


@pytest.mark.parametrize("index", [0, 1])
def test_sinkhorn_matches_converged_reference_on_norman(norman_pca_pairs, index):
    x, y = norman_pca_pairs[index]
    _check(x, y, 0.3)


def test_torch_path_agrees_with_numpy():
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(30, 8))
    y = 1.3 * rng.normal(size=(25, 8)) + 0.5
    on_numpy = sinkhorn(x, y, blur=0.1, tol=DEFAULT_TOL)
    on_torch = sinkhorn(x, y, PerturbationContext("p", device="cpu"), blur=0.1, tol=DEFAULT_TOL)
    assert on_torch == pytest.approx(on_numpy, rel=1e-8)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tol": 0.0}, "tol"),
        ({"tol": float("nan")}, "tol"),
        ({"max_iter": 0}, "max_iter"),
        ({"max_iter": 2.5}, "max_iter"),
        ({"backend": "online", "tol": 1e-7}, "tol=None"),
    ],
)
def test_sinkhorn_stopping_options_are_checked(options, message):
    x, y = np.zeros((3, 2)), np.ones((4, 2))
    with pytest.raises(ValueError, match=message):
        sinkhorn(x, y, **options)
