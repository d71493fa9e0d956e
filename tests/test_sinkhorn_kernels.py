"""The compiled pieces of the NumPy Sinkhorn solver and of the pair sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from scperteval.kernels.distances import zero_through_diagonal
from scperteval.kernels.rbf import _exponentials, _largest
from scperteval.kernels.sinkhorn import (
    _compiled_annealing,
    anneal,
    half_squared_distances,
    softmin,
    temperature_schedule,
)


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 16, 17, 1001])
def test_largest_is_numpys_maximum(size):
    rng = np.random.default_rng(size)
    values = rng.standard_normal(size) * 100.0
    if size == 0:
        assert _largest(values) == -np.inf
        return
    assert _largest(values) == values.max()
    # The largest value at each position of the eight running maxima and the tail.
    for position in range(size):
        spiked = values.copy()
        spiked[position] = 1e6
        assert _largest(spiked) == 1e6


def test_largest_with_infinities():
    values = np.array([-np.inf, -np.inf, -3.0, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf, -1.0])
    assert _largest(values) == -1.0
    assert _largest(np.full(11, -np.inf)) == -np.inf


def test_exponentials_round_the_argument_once():
    rng = np.random.default_rng(2)
    values = rng.uniform(-700.0, 0.0, 4097)
    shift = 3.25
    mantissas, powers = np.empty_like(values), np.empty_like(values)
    _exponentials(values, 1.0, shift, mantissas, powers)
    shifted_mantissas, shifted_powers = np.empty_like(values), np.empty_like(values)
    _exponentials(values - shift, 1.0, 0.0, shifted_mantissas, shifted_powers)
    np.testing.assert_array_equal(mantissas * powers, shifted_mantissas * shifted_powers)
    scaled_mantissas, scaled_powers = np.empty_like(values), np.empty_like(values)
    _exponentials(values, 0.3, 0.0, scaled_mantissas, scaled_powers)
    _exponentials(values * 0.3, 1.0, 0.0, shifted_mantissas, shifted_powers)
    np.testing.assert_array_equal(
        scaled_mantissas * scaled_powers, shifted_mantissas * shifted_powers
    )
    expected = np.exp(values - shift)
    got = mantissas * powers
    assert np.all(np.abs(got - expected) <= 2.5e-16 * expected)
    # Powers of two exactly, mantissas in [sqrt(1/2), sqrt(2)].
    assert np.all(np.frexp(powers)[0] == 0.5)
    assert np.all((mantissas > 0.7) & (mantissas < 1.42))


def test_softmin_is_the_log_sum_exp():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((23, 5)), rng.standard_normal((41, 5)) * 2.0
    cost = half_squared_distances(x, y)
    potential = rng.standard_normal(41)
    for eps in (100.0, 1.0, 0.01):
        expected = -eps * logsumexp(potential[None, :] - cost / eps, axis=1)
        np.testing.assert_allclose(softmin(cost, potential, eps), expected, rtol=1e-13)


@pytest.mark.parametrize(("n", "m"), [(1, 1), (9, 30), (120, 75)])
def test_compiled_annealing_is_the_generic_one(n, m):
    rng = np.random.default_rng(n + m)
    x, y = rng.standard_normal((n, 6)), rng.standard_normal((m, 6)) + 0.4
    costs = (
        half_squared_distances(x, y),
        half_squared_distances(y, x),
        half_squared_distances(x, x),
        half_squared_distances(y, y),
    )
    log_weights = (np.full(n, math.log(1.0 / n)), np.full(m, math.log(1.0 / m)))
    temperatures = temperature_schedule(8.0, 0.05, 0.8)
    compiled = _compiled_annealing(costs, log_weights, temperatures)
    generic = anneal(softmin, costs, log_weights, temperatures)
    for got, expected in zip(compiled, generic, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("offset", [-5, -1, 0, 2, 40])
def test_zero_through_diagonal_matches_the_mask(offset):
    rng = np.random.default_rng(4)
    tile = rng.uniform(1.0, 2.0, (13, 21))
    rows, columns = np.indices(tile.shape)
    expected = np.where(columns <= rows + offset, 0.0, tile)
    zero_through_diagonal(tile, offset)
    np.testing.assert_array_equal(tile, expected)


@pytest.mark.parametrize("n_points", [1, 50, 700])
def test_stored_pairs_sum_like_pair_sums_within_their_estimate(n_points):
    from scperteval.kernels.pairs import SQRT, StoredPairs, pair_sums, rbf_transform

    rng = np.random.default_rng(n_points)
    x = rng.standard_normal((n_points, 4))
    stored = StoredPairs(x, max_block_bytes=2**16)
    transforms = [SQRT, rbf_transform(1.5)]
    assert stored.sums(transforms) == pair_sums(x, None, transforms, max_block_bytes=2**16)
    assert 0 < stored.nbytes <= StoredPairs.nbytes_for(n_points, max_block_bytes=2**16)
