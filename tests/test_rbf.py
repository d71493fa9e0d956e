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


@pytest.mark.parametrize("spread", [1.0, 40.0])
@pytest.mark.parametrize("offset", [NO_DIAGONAL, -3, 0, 5])
def test_a_known_upper_bound_changes_no_sum(spread, offset):
    # spread 40 with a small bandwidth sends some exponentials below the normal
    # range, where the tile's largest value decides how the sum is taken.
    tile = np.random.default_rng(3).uniform(0, spread, size=(40, 70)) ** 2
    largest = float(tile.max())
    for scale in (-0.5, -0.45 * 708 / largest, -3.0 * 708 / largest):
        alone = rbf_tile_sum(tile, scale, offset)
        for bound in (largest, 2 * largest, np.inf):
            assert rbf_tile_sum(tile, scale, offset, bound) == alone


def test_pair_tiles_bound_every_squared_distance():
    from scperteval.kernels.pairs import _pair_tiles

    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 7)) * rng.uniform(0.1, 30, size=(300, 1))
    y = np.vstack([x[:10], rng.normal(size=(200, 7)) * 100])  # coinciding and far points
    for first, second in ((x, None), (x, y)):
        for d2, _, _, bound in _pair_tiles(first, second, False, max_block_bytes=50_000):
            assert float(d2.max()) <= bound
            assert bound <= 1.01 * (np.sqrt(float((x**2).sum(1).max())) + 3e3) ** 2
