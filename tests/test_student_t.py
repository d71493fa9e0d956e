"""The compiled Student t tail and Welch kernel against scipy and high-precision values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from scperteval.kernels.student_t import (
    LOG_RATIO_COEFFICIENTS,
    MIN_HALF_DOF,
    SERIES_COEFFICIENTS,
    tail_probabilities,
    two_sided_tail,
)


def _exact_two_sided(dof: float, statistic: float) -> float:
    """``I_x(dof/2, 1/2)`` in multiple precision, from whichever side converges."""
    mpmath = pytest.importorskip("mpmath")
    estimate = 2.0 * special.stdtr(dof, -abs(statistic))
    digits = 40 + (int(-math.log10(estimate)) if estimate > 0 else 320)
    with mpmath.workdps(digits):
        nu, t = mpmath.mpf(float(dof)), mpmath.mpf(float(statistic))
        half = mpmath.mpf(1) / 2
        x = nu / (nu + t * t)
        if x < half:
            value = mpmath.betainc(nu / 2, half, 0, x, regularized=True)
        else:
            value = 1 - mpmath.betainc(half, nu / 2, 0, t * t / (nu + t * t), regularized=True)
        return float(value)


def test_series_coefficients_match_symbolic_expansion():
    sympy = pytest.importorskip("sympy")
    w = sympy.symbols("w")
    expansion = sympy.series((sympy.sinh(w / 2) / (w / 2)) ** sympy.Rational(-1, 2), w, 0, 16)
    poly = expansion.removeO()
    for n in range(8):
        assert SERIES_COEFFICIENTS[n] == pytest.approx(float(poly.coeff(w, 2 * n)), rel=1e-14)


def test_log_ratio_series_matches_gamma_ratio():
    mpmath = pytest.importorskip("mpmath")
    for half_dof in (MIN_HALF_DOF, 12.5, 40.0, 1e3):
        with mpmath.workdps(50):
            a = mpmath.mpf(half_dof) + mpmath.mpf(1) / 4
            exact = mpmath.log(
                mpmath.gamma(a + mpmath.mpf(1) / 2) / mpmath.gamma(a) / mpmath.sqrt(half_dof)
            )
        series = sum(c * half_dof ** (-2 * (k + 1)) for k, c in enumerate(LOG_RATIO_COEFFICIENTS))
        assert abs(series - float(exact)) < 1e-16


def test_tail_equals_high_precision_values_on_a_grid():
    # Across the method's range: T = dof/2 - 1/4 from its minimum, log1p(t^2/dof) up to 3.
    worst, checked = 0.0, 0
    for half_dof in (MIN_HALF_DOF, 8.5, 10.0, 16.0, 60.0, 400.0, 5e4):
        dof = 2.0 * (half_dof + 0.25)
        for log_ratio in (1e-6, 0.05, 0.5, 1.0, 1.7, 2.4, 3.0):
            statistic = math.sqrt(math.expm1(log_ratio) * dof)
            got = two_sided_tail(dof, statistic)
            if got < 0.0:
                continue  # left to scipy; checked below
            exact = _exact_two_sided(dof, statistic)
            # Rounding t^2/dof moves p by about u * log(1/p) relative.
            tolerance = 2e-15 * max(1.0, half_dof * log_ratio)
            assert abs(got - exact) <= tolerance * exact, (dof, statistic, got, exact)
            worst = max(worst, abs(got - exact) / exact)
            checked += 1
    assert checked >= 30 and worst < 1e-13


def test_tail_handles_typical_screen_statistics_itself():
    # Welch degrees of freedom of perturbation groups, moderate statistics.
    rng = np.random.default_rng(0)
    dof = rng.uniform(20.0, 5e4, size=20_000)
    statistic = rng.normal(scale=3.0, size=20_000)
    out = np.empty_like(statistic)
    assert tail_probabilities(dof, statistic, out) == 0
    np.testing.assert_allclose(out, 2.0 * special.stdtr(dof, -np.abs(statistic)), rtol=1e-13)


def test_tail_leaves_what_it_cannot_do_exactly():
    for dof, statistic in [
        (16.0, 1.0),  # below the smallest dof
        (100.0, 50.0),  # log1p(t^2 / dof) beyond 3
        (1e7, 300.0),  # exp(-u) near underflow
        (100.0, np.inf),
        (100.0, np.nan),
        (np.nan, 1.0),
        (np.inf, 1.0),
    ]:
        assert two_sided_tail(dof, statistic) == -1.0
    assert two_sided_tail(50.0, 0.0) == 1.0
    assert two_sided_tail(50.0, -2.0) == two_sided_tail(50.0, 2.0)


def test_pvalues_match_scipy_everywhere():
    from scperteval.stats.diffexp import two_sided_t_pvalues

    rng = np.random.default_rng(1)
    dof = np.exp(rng.uniform(np.log(0.5), np.log(1e6), size=(40, 500)))
    statistic = np.exp(rng.uniform(-8, np.log(500), size=(40, 500))) * rng.choice(
        [-1, 1], (40, 500)
    )
    got = two_sided_t_pvalues(dof, statistic)
    expected = 2.0 * special.stdtr(dof, -np.abs(statistic))
    assert ((got >= 0) & (got <= 1)).all()
    tiny = expected < 1e-300
    np.testing.assert_allclose(got[~tiny], expected[~tiny], rtol=5e-13)
    np.testing.assert_allclose(got[tiny], expected[tiny], rtol=1e-6, atol=1e-300)
    # Monotone in |t| for a fixed dof.
    grid = two_sided_t_pvalues(np.full(2000, 87.3), np.linspace(0.0, 25.0, 2000))
    assert (np.diff(grid) <= 0).all()


@pytest.mark.parametrize("overestimate", [False, True])
def test_fused_welch_equals_vectorised_formulas(overestimate):
    from scperteval.stats.diffexp import two_sided_t_pvalues, welch_between, welch_t_test
    from scperteval.stats.groups import GroupStats

    rng = np.random.default_rng(2)
    values = rng.poisson(1.5, size=(900, 40)).astype(float)
    values[:, 0] = 0.0  # constant everywhere: t = 0, p = 1
    values[:300, 1] = 0.0  # constant in the targets only
    values[:300, 2], values[300:, 2] = 1.0, 2.0  # separated, no variance: t = -inf, p = 0
    target = GroupStats.from_chunk(values[:300], np.repeat(np.arange(6), 50), 6)
    reference = GroupStats.from_chunk(values[300:], np.repeat(np.arange(6), 100), 6)
    statistic, pvalue = welch_between(target, reference, overestimate)
    expected_t, expected_p = welch_t_test(
        target.n[:, None],
        target.mean,
        target.variance(),
        reference.n[:, None],
        reference.mean,
        reference.variance(),
        overestimate_variance=overestimate,
    )
    np.testing.assert_array_equal(statistic, expected_t)
    np.testing.assert_array_equal(pvalue, expected_p)
    assert (statistic[:, 0] == 0).all() and (pvalue[:, 0] == 1).all()
    assert np.isneginf(statistic[:, 2]).all() and (pvalue[:, 2] == 0).all()
    # The fused kernel's p-values are those of the public function on the same t.
    finite = np.isfinite(statistic[:, 3:])
    assert finite.all()
    n_ref = target.n if overestimate else reference.n
    term_t = target.variance() / target.n[:, None]
    term_r = reference.variance() / n_ref[:, None]
    with np.errstate(invalid="ignore"):
        dof = (term_t + term_r) ** 2 / (
            term_t**2 / (target.n[:, None] - 1) + term_r**2 / (n_ref[:, None] - 1)
        )
    np.testing.assert_array_equal(pvalue[:, 3:], two_sided_t_pvalues(dof[:, 3:], statistic[:, 3:]))


def test_fused_welch_small_groups_use_scipy():
    from scperteval.stats.diffexp import welch_between
    from scperteval.stats.groups import GroupStats

    rng = np.random.default_rng(3)
    values = rng.normal(size=(30, 25))
    target = GroupStats.from_chunk(values[:6], np.repeat(np.arange(2), 3), 2)
    reference = GroupStats.from_chunk(values[6:], np.repeat(np.arange(2), 12), 2)
    statistic, pvalue = welch_between(target, reference)
    for k, (rows_t, rows_r) in enumerate(
        [(slice(0, 3), slice(6, 18)), (slice(3, 6), slice(18, 30))]
    ):
        result = stats.ttest_ind(values[rows_t], values[rows_r], equal_var=False)
        np.testing.assert_allclose(statistic[k], result.statistic, rtol=1e-10)
        np.testing.assert_allclose(pvalue[k], result.pvalue, rtol=1e-9)
