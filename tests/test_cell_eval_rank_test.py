"""Mann-Whitney U against a fixed reference: the same values as the pooled ranking."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import special, stats

from scperteval.stats.rank_test import ReferenceRankTest


def pooled_ranking(target: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Textbook pooled ranking: z of the rank sum (tie-corrected), two-sided normal p."""
    n_target, n_reference = target.shape[0], reference.shape[0]
    pooled = np.concatenate([target, reference], axis=0)
    u_statistic = stats.rankdata(pooled, axis=0)[:n_target].sum(axis=0)
    u_statistic -= n_target * (n_target + 1) / 2.0
    total = n_target + n_reference
    tie_term = np.array(
        [sum(t**3 - t for t in np.unique(column, return_counts=True)[1]) for column in pooled.T],
        dtype=float,
    )
    variance = n_target * n_reference / 12.0 * ((total + 1) - tie_term / (total * (total - 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (u_statistic - n_target * n_reference / 2.0) / np.sqrt(variance)
    z = np.where(np.isfinite(z), z, 0.0)
    return z, np.minimum(2.0 * special.ndtr(-np.abs(z)), 1.0)


def _groups(seed: int, float32: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    reference = np.round(rng.exponential(1.0, (70, 12)) * (rng.random((70, 12)) < 0.4), 1)
    target = np.round(rng.exponential(1.3, (15, 12)) * (rng.random((15, 12)) < 0.5), 1)
    reference[:, 0] = target[:, 0] = 0.0  # constant in both groups
    target[:, 1] = -1.0  # below every reference value
    reference[:4, 2] = -0.0  # equal to 0.0
    reference[4:9, 3] = -2.5  # a tie shared by both groups
    target[:3, 3] = -2.5
    if float32:
        return reference.astype(np.float32).astype(float), target.astype(np.float32).astype(float)
    # Values float32 cannot hold exactly: the counts compare float64 values.
    return reference + 1e-12, target + 1e-12


@pytest.mark.parametrize("float32", [True, False])
@pytest.mark.parametrize("sparse", [False, True])
def test_equals_the_pooled_ranking_and_scipy(float32: bool, sparse: bool) -> None:
    for seed in range(4):
        reference, target = _groups(seed, float32)
        test = ReferenceRankTest(reference)
        z, p = test.test(sp.csr_matrix(target) if sparse else target)
        z_pooled, p_pooled = pooled_ranking(target, reference)
        np.testing.assert_allclose(z, z_pooled, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(p, p_pooled, rtol=1e-12, atol=1e-15)
        for gene in range(1, reference.shape[1]):
            expected = stats.mannwhitneyu(
                target[:, gene], reference[:, gene], method="asymptotic", use_continuity=False
            ).pvalue
            assert p[gene] == pytest.approx(expected, rel=1e-9)
        assert (z[0], p[0]) == (0.0, 1.0)


def test_many_targets_against_one_reference() -> None:
    reference, _ = _groups(0, True)
    test = ReferenceRankTest(reference)
    rng = np.random.default_rng(9)
    for _ in range(5):
        target = np.round(rng.exponential(1.0, (int(rng.integers(1, 30)), 12)), 1)
        np.testing.assert_allclose(test.test(target)[1], pooled_ranking(target, reference)[1])


def test_gene_count_must_match() -> None:
    test = ReferenceRankTest(np.zeros((5, 3)))
    with pytest.raises(ValueError, match="4 genes, reference 3"):
        test.test(np.zeros((2, 4)))


def test_sparse_target_with_stored_zeros_and_negatives() -> None:
    rng = np.random.default_rng(3)
    reference = np.round(rng.normal(0.0, 1.0, (40, 6)) * (rng.random((40, 6)) < 0.5), 1)
    target = np.round(rng.normal(0.3, 1.0, (25, 6)) * (rng.random((25, 6)) < 0.5), 1)
    stored = sp.csr_matrix(target)
    # Explicit zeros and -0.0 among the stored values count as zeros.
    stored.data[::5] = 0.0
    stored.data[1::7] = -0.0
    dense = stored.toarray()
    z, p = ReferenceRankTest(reference).test(stored)
    z_pooled, p_pooled = pooled_ranking(dense, reference)
    np.testing.assert_allclose(z, z_pooled, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(p, p_pooled, rtol=1e-12, atol=1e-15)
