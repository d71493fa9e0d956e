import re
import sys

import numpy as np
import pytest
from scipy import sparse
from scipy.spatial.distance import pdist

from scperteval.errors import MissingExtraError, install_command
from scperteval.kernels import median as median_module
from scperteval.kernels import pairs as pairs_module
from scperteval.kernels.sinkhorn import temperature_schedule
from scperteval.metrics import (
    DegenerateInput,
    PerturbationContext,
    distance_sum,
    energy_distance,
    energy_distance_from_sums,
    kernel_sum,
    median_pairwise_distance,
    mmd,
    mmd_from_sums,
    sinkhorn,
    within_distance_sum,
    within_kernel_sum,
)


def clouds(seed, n=17, m=13, dim=4, shift=0.5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)) + 3.0
    y = rng.normal(scale=1.3, size=(m, dim)) + 3.0 + shift
    return x, y


# ---------------------------------------------------------- textbook double loops


def slow_energy(x, y, unbiased):
    n, m = len(x), len(y)
    cross = sum(np.sqrt(np.sum((a - b) ** 2)) for a in x for b in y) / (n * m)

    def within(z):
        k = len(z)
        total = sum(
            np.sqrt(np.sum((z[i] - z[j]) ** 2)) for i in range(k) for j in range(k) if i != j
        )
        return total / (k * (k - 1) if unbiased else k * k)

    return 2.0 * cross - within(x) - within(y)


def slow_mmd(x, y, sigma, unbiased):
    def k(a, b):
        return np.exp(-np.sum((a - b) ** 2) / (2.0 * sigma**2))

    def within(z):
        n = len(z)
        if unbiased:
            pairs = [k(z[i], z[j]) for i in range(n) for j in range(n) if i != j]
            return sum(pairs) / (n * (n - 1))
        return sum(k(a, b) for a in z for b in z) / (n * n)

    cross = sum(k(a, b) for a in x for b in y) / (len(x) * len(y))
    return within(x) + within(y) - 2.0 * cross


def positive_median(z):
    distances = pdist(z)
    return float(np.median(distances[distances > 0]))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("unbiased", [True, False])
def test_energy_distance_matches_double_loop(seed, unbiased):
    x, y = clouds(seed)
    assert energy_distance(x, y, unbiased=unbiased) == pytest.approx(
        slow_energy(x, y, unbiased), rel=1e-10, abs=1e-12
    )


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("unbiased", [True, False])
def test_mmd_matches_double_loop(seed, unbiased):
    x, y = clouds(seed)
    sigma = positive_median(np.vstack([x, y]))
    assert mmd(x, y, unbiased=unbiased) == pytest.approx(
        slow_mmd(x, y, sigma, unbiased), rel=1e-10, abs=1e-12
    )
    assert mmd(x, y, bandwidth=0.7, unbiased=unbiased) == pytest.approx(
        slow_mmd(x, y, 0.7, unbiased), rel=1e-10, abs=1e-12
    )


def test_energy_distance_of_single_points_in_one_dimension():
    # Plug-in form between two single points: 2 |a - b|.
    assert energy_distance([[1.0]], [[4.0]], unbiased=False) == pytest.approx(6.0)


# ------------------------------------------------------------------------ properties


@pytest.mark.parametrize("metric", [energy_distance, mmd])
@pytest.mark.parametrize("unbiased", [True, False])
def test_symmetric(metric, unbiased):
    x, y = clouds(4)
    assert metric(x, y, unbiased=unbiased) == pytest.approx(
        metric(y, x, unbiased=unbiased), rel=1e-12
    )


@pytest.mark.parametrize("metric", [energy_distance, mmd])
def test_identical_samples_give_zero_in_plug_in_form(metric):
    x, _ = clouds(5)
    assert metric(x, x.copy(), unbiased=False) == pytest.approx(0.0, abs=1e-12)
    # The unbiased form is not 0 here: identical samples are not independent draws.
    assert metric(x, x.copy(), unbiased=True) < 0


def test_unbiased_estimates_near_zero_for_one_distribution():
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(150, 3)), rng.normal(size=(150, 3))
    assert abs(energy_distance(x, y)) < 0.05
    assert abs(mmd(x, y)) < 0.01
    assert energy_distance(x, y + 2.0) > 1.0


@pytest.mark.parametrize("metric", [energy_distance, mmd])
def test_all_zero_populations_are_not_degenerate(metric):
    zeros = np.zeros((6, 3))
    assert metric(zeros, np.zeros((4, 3))) == 0.0
    x, _ = clouds(7, dim=3)
    assert metric(zeros, x) > 0


@pytest.mark.parametrize("metric", [energy_distance, mmd])
def test_too_few_cells(metric):
    x, y = clouds(8)
    with pytest.raises(DegenerateInput, match="at least 2"):
        metric(x[:1], y)
    with pytest.raises(DegenerateInput, match="at least 2"):
        metric(x, y[:1])
    assert np.isfinite(metric(x[:1], y, unbiased=False))
    with pytest.raises(DegenerateInput):
        metric(x[:0], y, unbiased=False)


def test_invalid_population_inputs():
    x, y = clouds(9)
    with pytest.raises(ValueError, match="features"):
        energy_distance(x, y[:, :2])
    with pytest.raises(ValueError, match="two-dimensional"):
        energy_distance(x[0], y[0])
    bad = x.copy()
    bad[0, 0] = np.inf
    with pytest.raises(DegenerateInput, match="non-finite"):
        mmd(bad, y)
    with pytest.raises(ValueError, match="bandwidth"):
        mmd(x, y, bandwidth=0.0)


def test_sparse_input():
    x, y = clouds(10)
    x[x < 3] = 0.0
    assert energy_distance(sparse.csr_matrix(x), y) == pytest.approx(energy_distance(x, y))


def test_coinciding_cells_are_exactly_zero_apart():
    rng = np.random.default_rng(11)
    point = rng.normal(size=(1, 20)) * 100.0
    assert within_distance_sum(np.repeat(point, 5, axis=0)) == 0.0


# ------------------------------------------------------------------- building blocks


@pytest.mark.parametrize("block", [64, 1000, pairs_module.DEFAULT_BLOCK_BYTES])
def test_building_blocks_do_not_depend_on_block_size(block):
    x, y = clouds(12, n=23, m=19)
    assert distance_sum(x, y, max_block_bytes=block) == pytest.approx(
        sum(np.linalg.norm(a - b) for a in x for b in y), rel=1e-11
    )
    assert within_distance_sum(x, max_block_bytes=block) == pytest.approx(
        2.0 * pdist(x).sum(), rel=1e-11
    )
    assert within_kernel_sum(x, 1.5, max_block_bytes=block) == pytest.approx(
        2.0 * np.exp(-(pdist(x) ** 2) / (2 * 1.5**2)).sum(), rel=1e-11
    )
    assert kernel_sum(x, y, 1.5, max_block_bytes=block) == pytest.approx(
        sum(np.exp(-np.sum((a - b) ** 2) / 4.5) for a in x for b in y), rel=1e-11
    )


def test_metrics_from_sums_reproduce_metrics():
    x, y = clouds(13)
    n, m = len(x), len(y)
    for unbiased in (True, False):
        energy = energy_distance_from_sums(
            distance_sum(x, y),
            within_distance_sum(x),
            within_distance_sum(y),
            n,
            m,
            unbiased=unbiased,
        )
        assert energy == pytest.approx(energy_distance(x, y, unbiased=unbiased), rel=1e-12)
        squared_mmd = mmd_from_sums(
            kernel_sum(x, y, 2.0),
            within_kernel_sum(x, 2.0),
            within_kernel_sum(y, 2.0),
            n,
            m,
            unbiased=unbiased,
        )
        assert squared_mmd == pytest.approx(mmd(x, y, bandwidth=2.0, unbiased=unbiased), rel=1e-12)


# ---------------------------------------------------------------- median heuristic


@pytest.mark.parametrize("seed", range(4))
def test_median_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    n = 20 + seed
    z = np.round(rng.normal(size=(n, 2)), 1)  # rounding creates ties between distances
    z[: n // 3] = 0.0  # coinciding points are left out
    expected = positive_median(z)
    assert median_pairwise_distance(z) == pytest.approx(expected, rel=1e-12)
    # A budget far below the number of pairs forces the multi-pass selection.
    assert median_pairwise_distance(z, max_block_bytes=64) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("digits", [(1, 1), (3, 2), (20, 16)])
def test_median_selection_with_small_digits(monkeypatch, digits):
    # Narrow digits make every branch of the radix selection run: straddling buckets,
    # many passes and buckets holding a single bit pattern.
    monkeypatch.setattr(median_module, "_FIRST_DIGIT_BITS", digits[0])
    monkeypatch.setattr(median_module, "_DIGIT_BITS", digits[1])
    rng = np.random.default_rng(sum(digits))
    for trial in range(12):
        z = np.round(rng.normal(size=(int(rng.integers(3, 25)), 2)), trial % 3)
        expected = positive_median(z) if pdist(z).any() else 0.0
        assert median_pairwise_distance(z, max_block_bytes=32) == pytest.approx(expected, rel=1e-12)


def test_median_of_coinciding_points():
    assert median_pairwise_distance(np.ones((5, 3))) == 0.0
    assert median_pairwise_distance(np.ones((1, 3))) == 0.0


def test_mmd_bandwidth_from_pooled_sample():
    x, y = clouds(14)
    sigma = median_pairwise_distance(np.vstack([x, y]))
    assert sigma == pytest.approx(positive_median(np.vstack([x, y])), rel=1e-12)
    assert mmd(x, y) == pytest.approx(mmd(x, y, bandwidth=sigma), rel=1e-12)


# ------------------------------------------------------------------------- Sinkhorn


def _geomloss_sinkhorn(x, y, blur=0.05, scaling=0.9):
    torch = pytest.importorskip("torch")
    geomloss = pytest.importorskip("geomloss")
    loss = geomloss.SamplesLoss("sinkhorn", p=2, blur=blur, scaling=scaling, debias=True)
    with torch.no_grad():
        divergence = loss(torch.from_numpy(x), torch.from_numpy(y)).item()
    return np.sqrt(2.0 * max(divergence, 0.0))


@pytest.mark.parametrize(
    ("n", "m", "dim", "blur", "scaling"),
    [
        (30, 25, 10, 0.05, 0.9),
        (30, 25, 10, 0.2, 0.5),
        (120, 80, 50, 0.05, 0.9),
        (7, 1, 3, 0.05, 0.9),
        (1, 1, 4, 0.05, 0.5),
        (60, 60, 5, 0.01, 0.8),
    ],
)
def test_sinkhorn_matches_geomloss(n, m, dim, blur, scaling):
    x, y = clouds(15, n=n, m=m, dim=dim)
    expected = _geomloss_sinkhorn(x, y, blur, scaling)
    # Geomloss's stopping rule, the same algorithm without torch: equal to rounding.
    assert sinkhorn(x, y, blur=blur, scaling=scaling, tol=None) == pytest.approx(
        expected, rel=1e-12
    )
    on_torch = sinkhorn(
        x, y, PerturbationContext("p", device="cpu"), blur=blur, scaling=scaling, tol=None
    )
    assert on_torch == pytest.approx(expected, rel=1e-12)


def test_sinkhorn_far_from_origin_and_tight_clouds():
    rng = np.random.default_rng(3)
    x = 1000.0 + rng.normal(size=(40, 6))
    y = 1000.5 + 0.01 * rng.normal(size=(30, 6))
    assert sinkhorn(x, y, tol=None) == pytest.approx(_geomloss_sinkhorn(x, y), rel=1e-10)


def test_temperature_schedule():
    schedule = temperature_schedule(diameter=10.0, blur=0.05, scaling=0.5)
    assert schedule[0] == 100.0
    assert schedule[-1] == pytest.approx(0.0025)
    ratios = np.array(schedule[2:-1]) / np.array(schedule[1:-2])
    np.testing.assert_allclose(ratios, 0.25, rtol=1e-12)
    assert schedule[-2] > 0.0025 >= schedule[-2] * 0.25
    assert len(temperature_schedule(10.0, 0.05, 0.9)) > len(schedule)


def test_sinkhorn_exact_cases():
    x, _ = clouds(16, n=20, dim=3)
    shift = np.array([1.0, -2.0, 0.5])
    # Debiasing makes a translation cost exactly ||shift||^2 / 2.
    assert sinkhorn(x, x + shift) == pytest.approx(np.linalg.norm(shift), rel=1e-6)
    assert sinkhorn(x, x.copy()) == pytest.approx(0.0, abs=1e-6)
    assert sinkhorn(np.zeros((4, 3)), np.ones((1, 3))) == pytest.approx(np.sqrt(3.0), rel=1e-9)
    assert sinkhorn(np.zeros((4, 3)), np.zeros((5, 3))) == 0.0
    assert sinkhorn(np.ones((2, 3)), np.ones((3, 3))) == 0.0


def test_sinkhorn_invalid_inputs():
    x, y = clouds(17)
    with pytest.raises(DegenerateInput):
        sinkhorn(x[:0], y)
    with pytest.raises(ValueError, match="blur"):
        sinkhorn(x, y, blur=0.0)
    with pytest.raises(ValueError, match="scaling"):
        sinkhorn(x, y, scaling=1.0)


def test_sinkhorn_without_geomloss(monkeypatch):
    x, y = clouds(18)
    expected = sinkhorn(x, y)
    monkeypatch.setitem(sys.modules, "geomloss", None)
    assert sinkhorn(x, y) == expected  # the CPU solver needs neither torch nor geomloss
    with pytest.raises(MissingExtraError, match=re.escape(install_command("ot"))):
        sinkhorn(x, y, backend="online", tol=None)
    with pytest.raises(MissingExtraError, match=re.escape(install_command("ot"))):
        sinkhorn(x, y, PerturbationContext("p", device="cpu"))


def test_mmd_bandwidth_names_the_median_the_option_asks_for():
    from scperteval.metrics.population import mmd_bandwidth

    medians = {True: 3.0, False: 0.0}
    assert mmd_bandwidth(None, medians.__getitem__) == 3.0
    # No two truth cells differ: every kernel value is 1, and sigma = 1 stands in.
    assert mmd_bandwidth("truth", medians.__getitem__) == 1.0
    assert mmd_bandwidth(0.5, medians.__getitem__) == 0.5
    with pytest.raises(ValueError, match="'truth' or a number"):
        mmd_bandwidth("pooled", medians.__getitem__)
    with pytest.raises(ValueError):
        mmd_bandwidth(-1.0, medians.__getitem__)
