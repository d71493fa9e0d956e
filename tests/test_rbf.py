"""The compiled RBF tile sums agree with NumPy's exponential."""

from __future__ import annotations

import numpy as np
import pytest

from scperteval.kernels.rbf import NO_DIAGONAL, rbf_tile_sum


def masked_sum(tile, scale, offset):
    rows, columns = np.indices(tile.shape)
    values = np.exp(tile * scale)
    if offset != NO_DIAGONAL:
        values[columns <= rows + offset] = 0.0
    return values.sum()


def test_each_value_within_one_ulp_of_numpy():
    rng = np.random.default_rng(0)
    # One value per tile: the sum is the kernel's exponential itself.
    arguments = np.concatenate([[0.0, 1e-300, 0.5, 707.9], rng.uniform(0, 707.0, 3000)])
    for d2 in arguments:
        got = rbf_tile_sum(np.array([[d2]]), -1.0)
        expected = np.exp(-d2)
        assert abs(got - expected) <= 2.5e-16 * expected, d2


@pytest.mark.parametrize("offset", [NO_DIAGONAL, -3, 0, 5, 400])
def test_tile_sums_equal_masked_numpy_sums(offset):
    rng = np.random.default_rng(1)
    tile = rng.uniform(0.0, 40.0, size=(37, 301))
    tile[:, :5] = 0.0  # coinciding points
    expected = masked_sum(tile, -0.37, offset)
    assert rbf_tile_sum(tile, -0.37, offset) == pytest.approx(expected, rel=1e-14, abs=1e-300)


def test_underflowing_tiles_are_exact():
    tile = np.array([[0.0, 2000.0, 1.0], [3000.0, 2500.0, 4.0]])
    expected = masked_sum(tile, -0.37, NO_DIAGONAL)
    assert rbf_tile_sum(tile, -0.37) == expected
    far = np.full((3, 4), 2000.0)
    assert rbf_tile_sum(far, -0.37) == np.exp(-740.0) * 12
    assert rbf_tile_sum(far, -0.37, 0) == masked_sum(far, -0.37, 0)


def test_empty_tile_and_fully_masked_rows():
    assert rbf_tile_sum(np.zeros((0, 4)), -1.0) == 0.0
    assert rbf_tile_sum(np.zeros((3, 3)), -1.0, 10) == 0.0
