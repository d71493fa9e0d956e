import doctest
import importlib
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.spatial.distance import cosine as scipy_cosine_distance
from scipy.stats import pearsonr
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

from scperteval.metrics import (
    METRICS,
    DegenerateInput,
    PerturbationContext,
    cosine,
    deg_weights_from_statistic,
    l2,
    mae,
    mse,
    pearson,
    r2,
    weighted_mse,
    weighted_pearson,
    weighted_r2,
)

# SCIENCE.md section 9
TOY_T = np.array([-8.0, 4.0, 1.0, 0.5, 0.0])
TOY_RAW_WEIGHTS = np.array([1.0, 0.25, 0.015625, 0.00390625, 0.0])
TOY_TRUTH = np.array([2.0, 1.0, 0.5, 0.2, 0.1])
TOY_PRED = np.array([1.5, 1.2, 0.5, 0.3, 0.0])
TOY_MU_BAR = np.array([1.0, 1.0, 0.5, 0.25, 0.1])

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
vectors = hnp.arrays(np.float64, st.integers(3, 30), elements=finite)


def ctx_with(weights):
    return PerturbationContext(perturbation="p", weights=np.asarray(weights, dtype=float))


def toy_ctx():
    return ctx_with(deg_weights_from_statistic(TOY_T, exponent=2.0))


@pytest.fixture
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def random_pair(seed, size=40):
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=size)
    return truth, truth + rng.normal(scale=0.7, size=size)


# ----------------------------------------------------------------------- toy values


def test_toy_weights():
    weights = deg_weights_from_statistic(TOY_T, exponent=2.0)
    np.testing.assert_allclose(weights, TOY_RAW_WEIGHTS / TOY_RAW_WEIGHTS.sum(), rtol=1e-15)
    assert weights.sum() == pytest.approx(1.0, abs=1e-15)


def test_toy_mse_and_weighted_mse():
    assert mse(TOY_TRUTH, TOY_PRED) == pytest.approx(0.062, abs=1e-12)
    assert weighted_mse(TOY_TRUTH, TOY_PRED, toy_ctx()) == pytest.approx(0.204831, abs=5e-7)


def test_toy_mean_baseline_r2_on_delta_pert():
    truth_delta = TOY_TRUTH - TOY_MU_BAR
    baseline_delta = TOY_MU_BAR - TOY_MU_BAR
    assert weighted_r2(truth_delta, baseline_delta, toy_ctx()) == pytest.approx(-3.703159, abs=5e-7)
    assert r2(truth_delta, baseline_delta) == pytest.approx(-0.219586, abs=5e-7)


# ------------------------------------------------------------ against other libraries


@pytest.mark.parametrize("seed", range(5))
def test_against_scipy_and_sklearn(seed):
    truth, pred = random_pair(seed)
    assert pearson(truth, pred) == pytest.approx(pearsonr(truth, pred)[0], rel=1e-12)
    assert r2(truth, pred) == pytest.approx(r2_score(truth, pred), rel=1e-12)
    assert mse(truth, pred) == pytest.approx(mean_squared_error(truth, pred), rel=1e-12)
    assert mae(truth, pred) == pytest.approx(mean_absolute_error(truth, pred), rel=1e-12)
    assert l2(truth, pred) == pytest.approx(np.sqrt(np.sum((truth - pred) ** 2)), rel=1e-12)
    assert cosine(truth, pred) == pytest.approx(1.0 - scipy_cosine_distance(truth, pred), rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_weighted_against_references(seed):
    truth, pred = random_pair(seed)
    weights = np.random.default_rng(seed + 100).uniform(size=truth.size)
    weights[::7] = 0.0
    weights /= weights.sum()
    ctx = ctx_with(weights)
    assert weighted_r2(truth, pred, ctx) == pytest.approx(
        r2_score(truth, pred, sample_weight=weights), rel=1e-12
    )
    assert weighted_mse(truth, pred, ctx) == pytest.approx(
        mean_squared_error(truth, pred, sample_weight=weights), rel=1e-12
    )
    covariance = np.cov(truth, pred, aweights=weights)
    expected = covariance[0, 1] / np.sqrt(covariance[0, 0] * covariance[1, 1])
    assert weighted_pearson(truth, pred, ctx) == pytest.approx(expected, rel=1e-12)


def test_uniform_weights_reduce_to_unweighted():
    truth, pred = random_pair(7)
    ctx = ctx_with(np.full(truth.size, 1.0 / truth.size))
    assert weighted_pearson(truth, pred, ctx) == pytest.approx(pearson(truth, pred), rel=1e-12)
    assert weighted_r2(truth, pred, ctx) == pytest.approx(r2(truth, pred), rel=1e-12)
    assert weighted_mse(truth, pred, ctx) == pytest.approx(mse(truth, pred), rel=1e-12)


def test_weighted_mse_does_not_depend_on_weight_scale():
    truth, pred = random_pair(3)
    weights = np.random.default_rng(3).uniform(size=truth.size)
    assert weighted_mse(truth, pred, ctx_with(weights)) == pytest.approx(
        weighted_mse(truth, pred, ctx_with(weights * 17.0)), rel=1e-12
    )


# ------------------------------------------------------------------------ NaN rules


@pytest.mark.usefixtures("no_warnings")
def test_undefined_values_are_nan_without_warnings():
    zeros = np.zeros(5)
    ramp = np.arange(5.0)
    assert np.isnan(pearson(zeros, ramp))
    assert np.isnan(pearson(ramp, np.full(5, 0.1)))
    assert np.isnan(pearson([1.0], [2.0]))
    assert np.isnan(r2(np.full(5, 0.1), ramp))
    assert np.isnan(r2(np.full(5, 0.1), np.full(5, 0.1)))
    assert np.isnan(cosine(zeros, ramp))
    ctx = ctx_with([0.5, 0.5, 0.0, 0.0, 0.0])
    assert np.isnan(weighted_pearson([1.0, 1.0, 2.0, 3.0, 4.0], ramp, ctx))
    assert np.isnan(weighted_r2([1.0, 1.0, 2.0, 3.0, 4.0], ramp, ctx))


@pytest.mark.usefixtures("no_warnings")
def test_all_zero_weights_give_nan():
    weights = deg_weights_from_statistic([3.0, -3.0, 3.0, 3.0, -3.0])
    assert not weights.any()
    ctx = ctx_with(weights)
    for metric in (weighted_mse, weighted_pearson, weighted_r2):
        assert np.isnan(metric(TOY_TRUTH, TOY_PRED, ctx))


def test_distances_are_never_nan_on_finite_input():
    zeros = np.zeros(4)
    assert mse(zeros, zeros) == 0.0
    assert mae(zeros, zeros) == 0.0
    assert l2(zeros, zeros) == 0.0


def test_perfect_values():
    truth, _ = random_pair(1)
    ctx = ctx_with(np.full(truth.size, 1.0 / truth.size))
    for entry in METRICS:
        if entry.meta["representation"] != "centroid" or entry.meta["scope"] != "perturbation":
            continue
        assert entry.func(truth, truth.copy(), ctx) == pytest.approx(entry.meta["perfect"])


def test_invalid_inputs():
    with pytest.raises(ValueError, match="features"):
        mse([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="one-dimensional"):
        mse(np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(DegenerateInput, match="non-finite"):
        pearson([1.0, np.nan, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(DegenerateInput):
        mse([], [])
    with pytest.raises(ValueError, match="weights"):
        weighted_mse(TOY_TRUTH, TOY_PRED)
    with pytest.raises(ValueError, match="weights"):
        weighted_mse(TOY_TRUTH, TOY_PRED, PerturbationContext(perturbation="p"))
    with pytest.raises(ValueError, match="weights"):
        weighted_mse(TOY_TRUTH, TOY_PRED, ctx_with([1.0, 0.0]))
    with pytest.raises(ValueError, match="non-negative"):
        weighted_r2(TOY_TRUTH, TOY_PRED, ctx_with([1.0, -1.0, 0.0, 0.0, 1.0]))


# ------------------------------------------------------------------------ properties


@settings(max_examples=60, deadline=None)
@given(vectors)
def test_mean_baseline_r2_on_delta_is_never_positive(truth_delta):
    # Against the perturbed mean, the mean baseline's delta is exactly zero.
    baseline = np.zeros_like(truth_delta)
    value = r2(truth_delta, baseline)
    assert np.isnan(value) or value <= 1e-12
    weights = np.abs(np.sin(np.arange(truth_delta.size) + 1.0))
    weighted = weighted_r2(truth_delta, baseline, ctx_with(weights / weights.sum()))
    assert np.isnan(weighted) or weighted <= 1e-12


@settings(max_examples=60, deadline=None)
@given(vectors, st.integers(0, 2**31 - 1))
def test_correlations_bounded_and_symmetric(truth, seed):
    pred = truth + np.random.default_rng(seed).normal(size=truth.size)
    for metric in (pearson, cosine):
        value = metric(truth, pred)
        assert np.isnan(value) or -1.0 <= value <= 1.0
        other = metric(pred, truth)
        assert (np.isnan(value) and np.isnan(other)) or value == pytest.approx(other)


@settings(max_examples=60, deadline=None)
@given(vectors, st.floats(0.01, 100.0), st.floats(-100.0, 100.0))
def test_pearson_invariant_under_positive_affine_map(truth, scale, offset):
    if np.ptp(truth) < 1e-3:
        return
    assert pearson(truth, scale * truth + offset) == pytest.approx(1.0, abs=1e-9)


# -------------------------------------------------------------------------- weights


def test_weights_rules():
    weights = deg_weights_from_statistic([np.nan, 2.0, -4.0, np.inf, 0.0])
    np.testing.assert_allclose(weights, [0.0, 0.2, 0.8, 0.0, 0.0])
    assert deg_weights_from_statistic([]).size == 0
    assert not deg_weights_from_statistic([np.nan, 1.0]).any()
    cubed = deg_weights_from_statistic(TOY_T, exponent=3.0)
    expected = np.array([1.0, 0.125, 0.125**3, 0.0625**3, 0.0])
    np.testing.assert_allclose(cubed, expected / expected.sum())
    with pytest.raises(ValueError, match="exponent"):
        deg_weights_from_statistic(TOY_T, exponent=0.0)
    with pytest.raises(ValueError, match="one-dimensional"):
        deg_weights_from_statistic(np.ones((2, 2)))


# ------------------------------------------------------------------ context, registry


def test_perturbation_context_is_read_only_and_checked():
    weights = np.array([0.5, 0.5])
    ctx = PerturbationContext(
        perturbation="A", features=("g1", "g2"), weights=weights, target_features=(1,)
    )
    assert ctx.weights is not None and not ctx.weights.flags.writeable
    assert weights.flags.writeable
    with pytest.raises(ValueError, match="weights"):
        PerturbationContext(perturbation="A", features=("g1",), weights=weights)
    with pytest.raises(ValueError, match="outside"):
        PerturbationContext(perturbation="A", features=("g1", "g2"), target_features=(2,))


def test_registry_metadata():
    required = {"representation", "scope", "better", "perfect"}
    assert len(METRICS) >= 19
    for entry in METRICS:
        assert required <= set(entry.meta), entry.name
        assert entry.meta["representation"] in {
            "centroid",
            "population",
            "de",
            "control_de",
            "control_edistance",
        }
        assert entry.meta["scope"] in {"perturbation", "dataset"}
        assert entry.meta["better"] in {"higher", "lower"}
        assert isinstance(entry.meta["perfect"], float)
        assert entry.description and entry.func.__doc__
    assert METRICS.get("weighted_mse").meta["needs"] == ("weights",)
    bound = METRICS.resolve("mmd(bandwidth=2.0)")
    assert bound.options == {"bandwidth": 2.0}


@pytest.mark.parametrize(
    "module",
    [
        "scperteval.metrics.centroid",
        "scperteval.metrics.weights",
        "scperteval.metrics.dataset",
        "scperteval.metrics.de",
        "scperteval.metrics.population",
    ],
)
def test_docstring_examples(module):
    failures, _ = doctest.testmod(importlib.import_module(module))
    assert failures == 0
