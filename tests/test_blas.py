"""Symmetric BLAS products on strided blocks equal numpy's dense products."""

from __future__ import annotations

import numpy as np
import pytest

from scperteval.kernels.blas import symmetric_product, symmetric_rank_2k_update


def symmetric_block(rng, size, offset):
    """A symmetric matrix stored as the trailing block of a larger Fortran array."""
    whole = np.asfortranarray(rng.normal(size=(size + offset, size + offset)))
    block = whole[offset:, offset:]
    dense = np.tril(block) + np.tril(block, -1).T
    return whole, block, dense


@pytest.mark.parametrize("offset", [0, 7])
def test_symmetric_product_reads_only_the_lower_triangle(offset):
    rng = np.random.default_rng(offset)
    _, block, dense = symmetric_block(rng, 40, offset)
    block[np.triu_indices(40, 1)] = np.nan
    factor = np.asfortranarray(rng.normal(size=(40, 6)))
    out = symmetric_product(block, factor, np.empty((40, 6), order="F"))
    np.testing.assert_allclose(out, dense @ factor, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("offset", [0, 5])
def test_rank_2k_update_changes_the_lower_triangle_in_place(offset):
    rng = np.random.default_rng(10 + offset)
    whole, block, dense = symmetric_block(rng, 30, offset)
    before = whole.copy()
    first = np.asfortranarray(rng.normal(size=(30, 4)))
    second = np.asfortranarray(rng.normal(size=(30, 4)))
    symmetric_rank_2k_update(block, first, second, -0.5)
    expected = dense - 0.5 * (first @ second.T + second @ first.T)
    lower = np.tril_indices(30)
    np.testing.assert_allclose(block[lower], expected[lower], rtol=1e-13, atol=1e-13)
    upper = np.triu_indices(30, 1)
    np.testing.assert_array_equal(block[upper], before[offset:, offset:][upper])
    np.testing.assert_array_equal(whole[:offset], before[:offset])


def test_empty_factors_leave_the_matrix_unchanged():
    lower = np.eye(3, order="F")
    symmetric_rank_2k_update(lower, np.zeros((3, 0), order="F"), np.zeros((3, 0), order="F"), 1.0)
    np.testing.assert_array_equal(lower, np.eye(3))


@pytest.mark.parametrize(
    "case", ["c order", "float32", "read-only", "shape"], ids=lambda case: case
)
def test_bad_arrays_are_refused(case):
    lower = np.asfortranarray(np.eye(4))
    factor = np.asfortranarray(np.ones((4, 2)))
    error: type[Exception] = ValueError
    if case == "c order":
        factor = np.ascontiguousarray(np.ones((4, 2)))
    elif case == "float32":
        factor = factor.astype(np.float32, order="F")
        error = TypeError
    elif case == "read-only":
        lower.flags.writeable = False
    else:
        factor = np.asfortranarray(np.ones((3, 2)))
    with pytest.raises(error):
        symmetric_rank_2k_update(lower, factor, factor, 1.0)
