"""The ``wilcoxon`` DE method against scipy's Mann-Whitney U on tie-heavy data."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy import stats

from scperteval.data.dataset import Dataset
from scperteval.data.layout import GroupLayout
from scperteval.stats.rank_test import ReferenceRankTest, wilcoxon_all


def _screen(sparse: bool, seed: int = 5) -> ad.AnnData:
    """Two cell lines, controls and 6 perturbations each; mostly zeros and ties."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(["control", "A", "B", "C", "D", "E", "F"], size=300)
    lines = rng.choice(["line0", "line1"], size=300)
    values = rng.poisson(0.6, (300, 9)).astype(float)
    values[:, 0] = 0.0  # constant in every group
    values[:, 1] = np.round(rng.exponential(1.0, 300), 1)  # few zeros, some ties
    values[labels == "A", 2] += 2.0  # a shift in one perturbation
    values[:, 3] *= rng.random(300) < 0.1  # nearly all zeros
    names = [f"c{i}" for i in range(300)]
    obs = pd.DataFrame({"perturbation": labels, "cell_line": lines}, index=names)
    matrix = sp.csr_matrix(values) if sparse else values
    return ad.AnnData(X=matrix, obs=obs, var=pd.DataFrame(index=[f"G{g}" for g in range(9)]))


def _scipy_pvalues(target: np.ndarray, reference: np.ndarray) -> np.ndarray:
    expected = np.ones(target.shape[1])
    for gene in range(target.shape[1]):
        pooled = np.r_[target[:, gene], reference[:, gene]]
        if reference.shape[0] and np.ptp(pooled) > 0:
            expected[gene] = stats.mannwhitneyu(
                target[:, gene], reference[:, gene], method="asymptotic", use_continuity=False
            ).pvalue
    return expected


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("half", ["all", "truth", "duplicate"])
@pytest.mark.parametrize("reference", ["rest", "control"])
def test_every_condition_equals_scipy(sparse: bool, half: str, reference: str) -> None:
    adata = _screen(sparse)
    dataset = Dataset(adata, covariate_key="cell_line")
    layout = GroupLayout.build(dataset, seed=3)
    statistic, pvalue = wilcoxon_all(dataset, layout, reference, half)
    values = np.asarray(adata.X.toarray() if sparse else adata.X)
    labels, lines = adata.obs["perturbation"].to_numpy(), adata.obs["cell_line"].to_numpy()
    assert layout.n_conditions == 12
    for k, condition in enumerate(layout.conditions):
        target = values[dataset.cell_index[layout.positions(k, half)]]
        in_line = lines == condition.covariate
        if reference == "control":
            others = in_line & (labels == "control")
        else:
            others = in_line & (labels != "control") & (labels != condition.perturbation)
        expected = _scipy_pvalues(target, values[others])
        np.testing.assert_allclose(pvalue[k], expected, rtol=1e-12, atol=0)
        assert (statistic[k, 0], pvalue[k, 0]) == (0.0, 1.0)
        # The sign: a target ranking higher has a positive statistic.
        u_statistic = stats.mannwhitneyu(target[:, 2], values[others][:, 2]).statistic
        assert np.sign(statistic[k, 2]) == np.sign(u_statistic - target.shape[0] * others.sum() / 2)


def test_dense_and_sparse_references_agree_bit_for_bit() -> None:
    rng = np.random.default_rng(1)
    reference = rng.poisson(0.4, (120, 7)) * rng.choice([-1.0, 1.0], (120, 7))
    target = rng.poisson(0.7, (30, 7)).astype(float)
    dense = ReferenceRankTest(reference).test(target)
    stored = ReferenceRankTest(sp.csc_matrix(reference)).test(sp.csr_matrix(target))
    for a, b in zip(dense, stored, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(dense[1], _scipy_pvalues(target, reference), rtol=1e-12, atol=0)


def test_a_reference_without_cells_gives_no_evidence() -> None:
    z, p = ReferenceRankTest(np.zeros((0, 3))).test(np.ones((4, 3)))
    np.testing.assert_array_equal(z, 0.0)
    np.testing.assert_array_equal(p, 1.0)
