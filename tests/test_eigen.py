"""Leading eigenpairs by band reduction equal LAPACK's symmetric solver."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

from scperteval.engine import eigen
from scperteval.engine.eigen import leading_eigenpairs

EPS = np.finfo(np.float64).eps


@pytest.fixture
def small_bands(monkeypatch):
    """Narrow bands, so that small matrices take many panels."""
    monkeypatch.setattr(eigen, "BAND_WIDTH", 8)
    monkeypatch.setattr(eigen, "DIRECT_ORDER", 0)


def lower_only(symmetric):
    """What the solver is given: the lower triangle, garbage above it."""
    stored = np.asfortranarray(np.tril(symmetric))
    stored[np.triu_indices_from(stored, 1)] = np.nan
    return stored


def gram_of(n_rows, order, seed, decay):
    rng = np.random.default_rng(seed)
    factor = rng.normal(size=(n_rows, order)) * np.geomspace(1.0, decay, order)
    return factor.T @ factor


def reference(symmetric, k):
    values, vectors = np.linalg.eigh(symmetric)
    return values[::-1][:k], vectors[:, ::-1][:, :k]


def aligned(vectors, expected):
    return vectors * np.sign(np.sum(vectors * expected, axis=0))


def check_eigenpairs(symmetric, values, vectors, k):
    scale = np.abs(symmetric).sum(axis=0).max()
    expected_values, _ = reference(symmetric, k)
    np.testing.assert_allclose(values, expected_values, rtol=0, atol=20 * EPS * scale)
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(k), atol=1e-13)
    residual = symmetric @ vectors - vectors * values
    assert np.abs(residual).max() <= 50 * EPS * scale


@pytest.mark.parametrize("order", [19, 37, 64, 101, 160])
def test_clear_spectrum_equals_lapack(small_bands, order):
    # Decaying spectrum: every gap is wide, so the vectors themselves are fixed.
    symmetric = gram_of(3 * order, order, seed=order, decay=0.05)
    k = min(10, order)
    values, vectors = leading_eigenpairs(lower_only(symmetric), k)
    check_eigenpairs(symmetric, values, vectors, k)
    _, expected_vectors = reference(symmetric, k)
    np.testing.assert_allclose(aligned(vectors, expected_vectors), expected_vectors, atol=1e-11)


def test_flat_spectrum_spans_lapacks_subspace(small_bands):
    # Noise-like data: eigenvalues a fraction of a percent apart, as in large
    # synthetic screens; the k-dimensional subspace is what the projections use.
    symmetric = gram_of(400, 150, seed=2, decay=1.0)
    values, vectors = leading_eigenpairs(lower_only(symmetric), 20)
    check_eigenpairs(symmetric, values, vectors, 20)
    _, expected_vectors = reference(symmetric, 20)
    gap = np.diff(np.linalg.eigvalsh(symmetric)[::-1][19:21])[0]
    projector_error = np.abs(vectors @ vectors.T - expected_vectors @ expected_vectors.T).max()
    assert projector_error <= 1e3 * EPS * np.abs(symmetric).max() / abs(gap)


def test_default_width_on_a_gram_matrix_of_many_panels():
    symmetric = gram_of(1500, 1300, seed=11, decay=0.2)
    values, vectors = leading_eigenpairs(lower_only(symmetric), 30)
    check_eigenpairs(symmetric, values, vectors, 30)
    _, expected_vectors = reference(symmetric, 30)
    np.testing.assert_allclose(aligned(vectors, expected_vectors), expected_vectors, atol=1e-11)


def test_repeated_eigenvalues_get_orthonormal_vectors_of_their_eigenspace(small_bands):
    rng = np.random.default_rng(5)
    basis, _ = np.linalg.qr(rng.normal(size=(90, 90)))
    spectrum = np.concatenate([[9.0, 7.0, 7.0, 7.0, 4.0, 4.0], rng.uniform(0, 2, size=84)])
    symmetric = (basis * spectrum) @ basis.T
    symmetric = (symmetric + symmetric.T) / 2
    values, vectors = leading_eigenpairs(lower_only(symmetric), 6)
    check_eigenpairs(symmetric, values, vectors, 6)
    triple = vectors[:, 1:4]
    expected_triple = basis[:, 1:4]
    np.testing.assert_allclose(triple @ triple.T, expected_triple @ expected_triple.T, atol=1e-12)


def test_low_rank_matrix_has_zero_trailing_eigenvalues(small_bands):
    rng = np.random.default_rng(9)
    factor = rng.normal(size=(3, 70))
    symmetric = factor.T @ factor
    values, vectors = leading_eigenpairs(lower_only(symmetric), 5)
    check_eigenpairs(symmetric, values, vectors, 5)
    assert np.all(np.abs(values[3:]) <= 50 * EPS * np.abs(symmetric).sum(axis=0).max())


def test_zero_matrix(small_bands):
    values, vectors = leading_eigenpairs(np.zeros((40, 40), order="F"), 3)
    np.testing.assert_array_equal(values, np.zeros(3))
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(3), atol=1e-14)


def test_banded_solver_fallback_gives_the_same_eigenpairs(small_bands, monkeypatch):
    symmetric = gram_of(200, 80, seed=4, decay=0.05)
    monkeypatch.setattr(eigen, "_inverse_iteration", lambda band, values: None)
    values, vectors = leading_eigenpairs(lower_only(symmetric), 7)
    check_eigenpairs(symmetric, values, vectors, 7)
    _, expected_vectors = reference(symmetric, 7)
    np.testing.assert_allclose(aligned(vectors, expected_vectors), expected_vectors, atol=1e-11)


def test_inaccurate_vectors_are_refused(small_bands):
    symmetric = gram_of(200, 80, seed=4, decay=0.05)
    band_matrix = lower_only(symmetric)
    eigen._reduce_to_band(band_matrix, 8)
    band = eigen._lower_band(band_matrix, 8)
    values = np.linalg.eigvalsh(symmetric)[::-1][:4]
    assert eigen._inverse_iteration(band, values) is not None
    assert eigen._inverse_iteration(band, values * (1 + 1e-6)) is None


def test_same_bits_for_any_number_of_blas_threads(small_bands):
    from threadpoolctl import threadpool_limits

    symmetric = gram_of(300, 120, seed=8, decay=0.3)
    results = []
    for threads in (1, 2, 3):
        with threadpool_limits(threads):
            results.append(leading_eigenpairs(lower_only(symmetric), 12))
    for values, vectors in results[1:]:
        np.testing.assert_array_equal(values, results[0][0])
        np.testing.assert_array_equal(vectors, results[0][1])


def test_band_reduction_is_an_orthogonal_similarity(small_bands):
    symmetric = gram_of(90, 60, seed=3, decay=0.5)
    reduced = lower_only(symmetric)
    panels = eigen._reduce_to_band(reduced, 8)
    band = eigen._lower_band(reduced, 8)
    full_band = np.zeros_like(symmetric)
    for offset in range(9):
        full_band += np.diag(band[offset, : 60 - offset], -offset)
        if offset:
            full_band += np.diag(band[offset, : 60 - offset], offset)
    transform = np.eye(60)
    eigen._apply_panels(reduced, panels, transform)
    np.testing.assert_allclose(transform.T @ transform, np.eye(60), atol=1e-13)
    np.testing.assert_allclose(transform @ full_band @ transform.T, symmetric, atol=1e-11)
    np.testing.assert_allclose(sla.eigvalsh(full_band), np.linalg.eigvalsh(symmetric), atol=1e-11)


@pytest.mark.parametrize(
    ("matrix", "k"),
    [
        (np.zeros((3, 4), order="F"), 1),
        (np.zeros((4, 4), order="F"), 0),
        (np.zeros((4, 4), order="F"), 5),
        (np.zeros((4, 4), dtype=np.float32, order="F"), 2),
        (np.zeros((4, 4), order="C") + np.arange(4), 2),
    ],
    ids=["not square", "k=0", "k>n", "float32", "C order"],
)
def test_bad_arguments(matrix, k):
    with pytest.raises(ValueError):
        leading_eigenpairs(matrix, k)


def _random_band(order, width, seed):
    rng = np.random.default_rng(seed)
    symmetric = rng.standard_normal((order, order))
    symmetric += symmetric.T
    band = np.zeros((width + 1, order))
    for offset in range(min(width, order - 1) + 1):
        band[offset, : order - offset] = np.diagonal(symmetric, -offset)
    full = np.zeros((order, order))
    for offset in range(min(width, order - 1) + 1):
        diagonal = band[offset, : order - offset]
        full += np.diag(diagonal, -offset)
        if offset:
            full += np.diag(diagonal, offset)
    return band, full


@pytest.mark.parametrize(("order", "width"), [(1, 0), (3, 2), (40, 5), (300, 64)])
def test_band_eigenvalues_are_scipys_bit_for_bit(order, width):
    from scperteval.kernels.lapack import band_eigenvalues

    band, _ = _random_band(order, width, seed=order)
    kept = band.copy()
    for first, last in {(0, order - 1), (order - 1, order - 1), (max(0, order - 7), order - 1)}:
        expected = sla.eig_banded(
            band, lower=True, eigvals_only=True, select="i", select_range=(first, last)
        )
        np.testing.assert_array_equal(band_eigenvalues(band, first, last), expected)
    np.testing.assert_array_equal(band, kept)


@pytest.mark.parametrize(("order", "width"), [(1, 0), (3, 2), (40, 5), (300, 64), (700, 48)])
def test_two_stage_band_eigenvalues_equal_the_full_matrix_ones(order, width):
    from scperteval.kernels.lapack import band_eigenvalues, has_two_stage_band_eigenvalues

    band, full = _random_band(order, width, seed=order)
    kept = band.copy()
    every = np.linalg.eigvalsh(full)
    scale = np.abs(full).sum(axis=0).max()
    for first, last in {(0, order - 1), (order - 1, order - 1), (max(0, order - 7), order - 1)}:
        found = band_eigenvalues(band, first, last, two_stage=True)
        one_stage = band_eigenvalues(band, first, last)
        np.testing.assert_allclose(found, every[first : last + 1], rtol=0, atol=20 * EPS * scale)
        if not has_two_stage_band_eigenvalues():
            np.testing.assert_array_equal(found, one_stage)
    np.testing.assert_array_equal(band, kept)


def test_two_stage_band_eigenvalues_fall_back_to_one_stage(monkeypatch):
    from scperteval.kernels import lapack

    band, _ = _random_band(120, 16, seed=4)
    monkeypatch.setattr(lapack, "_two_stage_routine", lambda: None)
    assert not lapack.has_two_stage_band_eigenvalues()
    np.testing.assert_array_equal(
        lapack.band_eigenvalues(band, 100, 119, two_stage=True),
        lapack.band_eigenvalues(band, 100, 119),
    )


def test_band_eigenvalues_refuse_bad_ranges():
    from scperteval.kernels.lapack import band_eigenvalues

    band = np.ones((2, 5))
    for first, last in ((-1, 2), (3, 2), (0, 5)):
        with pytest.raises(ValueError, match="first <= last"):
            band_eigenvalues(band, first, last)
    with pytest.raises(ValueError, match="float64"):
        band_eigenvalues(band.astype(np.float32), 0, 1)


@pytest.mark.parametrize(("order", "width"), [(1, 1), (6, 2), (300, 16), (900, 64)])
def test_band_lu_and_solves_are_scipys_bit_for_bit(order, width):
    from scipy.linalg import lapack

    from scperteval.kernels.lapack import band_lu, band_lu_solve

    rng = np.random.default_rng(order + width)
    general = np.zeros((3 * width + 1, order), order="F")
    general[width:] = rng.standard_normal((2 * width + 1, order))
    expected_lu, expected_pivots, expected_info = lapack.dgbtrf(general.copy(), width, width)
    lu, pivots, info = band_lu(general.copy(order="F"), width, width)
    assert info == expected_info == 0
    np.testing.assert_array_equal(lu, expected_lu)
    np.testing.assert_array_equal(pivots - 1, expected_pivots)  # scipy counts from 0
    rhs = rng.standard_normal(order)
    kept = rhs.copy()
    expected, expected_info = lapack.dgbtrs(expected_lu, width, width, rhs, expected_pivots)
    solution, info = band_lu_solve(lu, width, width, pivots, rhs)
    assert info == expected_info == 0
    np.testing.assert_array_equal(solution, expected)
    np.testing.assert_array_equal(rhs, kept)
    # The solution solves the band system it came from.
    dense = np.zeros((order, order))
    for row in range(order):
        for column in range(max(0, row - width), min(order, row + width + 1)):
            dense[row, column] = general[2 * width + row - column, column]
    np.testing.assert_allclose(dense @ solution, rhs, atol=1e-8 * np.abs(dense).sum())


def test_band_lu_reports_an_exact_zero_pivot_and_refuses_c_order():
    from scperteval.kernels.lapack import band_lu

    general = np.zeros((4, 3), order="F")  # one sub- and one super-diagonal, all zero
    _, _, info = band_lu(general, 1, 1)
    assert info == 1
    with pytest.raises(ValueError, match="Fortran"):
        band_lu(np.zeros((4, 3)), 1, 1)


@pytest.mark.parametrize(
    ("rows", "columns", "block"), [(1, 1, 1), (10, 3, 3), (500, 64, 64), (70, 64, 32)]
)
def test_blocked_qr_is_scipys_bit_for_bit(rows, columns, block):
    from scipy.linalg import lapack

    from scperteval.kernels.lapack import blocked_qr

    matrix = np.random.default_rng(rows).standard_normal((rows, columns))
    kept = matrix.copy()
    expected_factored, expected_triangular, expected_info = lapack.dgeqrt(
        block, np.asfortranarray(matrix)
    )
    factored, triangular, info = blocked_qr(matrix, block)
    assert info == expected_info == 0
    np.testing.assert_array_equal(factored, expected_factored)
    np.testing.assert_array_equal(triangular, expected_triangular)
    np.testing.assert_array_equal(matrix, kept)
    # R's diagonal holds the column norms' magnitudes of a one-column matrix.
    if columns == 1:
        assert abs(factored[0, 0]) == pytest.approx(np.linalg.norm(matrix[:, 0]))
