"""LAPACK's band routines through scipy's Cython interface equal scipy's wrappers."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

from scperteval.kernels.lapack import band_eigenvalues, band_lu, band_lu_solve, blocked_qr

EPS = np.finfo(np.float64).eps


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


@pytest.mark.parametrize(("order", "width"), [(1, 0), (3, 2), (40, 5), (300, 64), (700, 48)])
def test_band_eigenvalues_are_scipys_bit_for_bit_and_the_full_matrix_ones(order, width):
    band, full = _random_band(order, width, seed=order)
    kept = band.copy()
    every = np.linalg.eigvalsh(full)
    scale = np.abs(full).sum(axis=0).max()
    for first, last in {(0, order - 1), (order - 1, order - 1), (max(0, order - 7), order - 1)}:
        found = band_eigenvalues(band, first, last)
        expected = sla.eig_banded(
            band, lower=True, eigvals_only=True, select="i", select_range=(first, last)
        )
        np.testing.assert_array_equal(found, expected)
        np.testing.assert_allclose(found, every[first : last + 1], rtol=0, atol=20 * EPS * scale)
    np.testing.assert_array_equal(band, kept)


def test_band_eigenvalues_refuse_bad_ranges():
    band = np.ones((2, 5))
    for first, last in ((-1, 2), (3, 2), (0, 5)):
        with pytest.raises(ValueError, match="first <= last"):
            band_eigenvalues(band, first, last)
    with pytest.raises(ValueError, match="float64"):
        band_eigenvalues(band.astype(np.float32), 0, 1)


@pytest.mark.parametrize(("order", "width"), [(1, 1), (6, 2), (300, 16), (900, 64)])
def test_band_lu_and_solves_are_scipys_bit_for_bit(order, width):
    from scipy.linalg import lapack

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
