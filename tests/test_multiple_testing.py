"""Multiple-testing corrections against scipy and textbook step-up and step-down loops."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from scperteval.errors import SpecError
from scperteval.stats.diffexp import PARALLEL_PVALUES
from scperteval.stats.multiple_testing import CORRECTIONS, adjust, benjamini_hochberg


def bh_by_hand(pvalues: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg: the i-th smallest of m times m / i, minimum from the top down."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = np.empty(m)
    running = 1.0
    for rank in range(m, 0, -1):
        test = order[rank - 1]
        running = min(running, pvalues[test] * m / rank)
        out[test] = running
    return out


def holm_by_hand(pvalues: np.ndarray) -> np.ndarray:
    """Holm: the i-th smallest of m times (m - i + 1), maximum from the bottom up, at most 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = np.empty(m)
    running = 0.0
    for rank, test in enumerate(order, start=1):
        running = max(running, pvalues[test] * (m - rank + 1))
        out[test] = min(running, 1.0)
    return out


def bonferroni_by_hand(pvalues: np.ndarray) -> np.ndarray:
    return np.array([min(p * len(pvalues), 1.0) for p in pvalues])


FAMILIES = [
    np.array([0.01, 0.04, 0.03, 0.2, 0.0099, 0.5, 0.04]),
    np.array([0.3]),
    np.round(np.random.default_rng(3).random(60) ** 2, 2),  # many ties
]


@pytest.mark.parametrize("family", FAMILIES, ids=["seven", "one", "ties"])
def test_one_family_equals_the_textbook_corrections(family):
    np.testing.assert_allclose(adjust(family, "bh"), bh_by_hand(family), rtol=1e-14, atol=0)
    np.testing.assert_array_equal(adjust(family, "bh"), stats.false_discovery_control(family))
    np.testing.assert_allclose(adjust(family, "holm"), holm_by_hand(family), rtol=1e-14, atol=0)
    np.testing.assert_array_equal(adjust(family, "bonferroni"), bonferroni_by_hand(family))
    np.testing.assert_array_equal(adjust(family, "none"), family)


def test_holm_and_bonferroni_by_hand():
    # Sorted 0.01, 0.02, 0.04 times 3, 2, 1, then the running maximum; Bonferroni times 3.
    family = np.array([0.04, 0.01, 0.02])
    np.testing.assert_allclose(adjust(family, "holm"), [0.04, 0.03, 0.04])
    np.testing.assert_allclose(adjust(family, "bonferroni"), [0.12, 0.03, 0.06])
    np.testing.assert_allclose(adjust(np.array([0.5, 0.9]), "bonferroni"), [1.0, 1.0])


@pytest.mark.parametrize("method", CORRECTIONS)
def test_tests_not_run_stay_out_of_the_family(method):
    with_gaps = np.array([np.nan, 0.01, 0.2, np.nan, 0.02])
    adjusted = adjust(with_gaps, method)
    assert np.isnan(adjusted[[0, 3]]).all()
    np.testing.assert_array_equal(adjusted[[1, 2, 4]], adjust(with_gaps[[1, 2, 4]], method))
    assert np.isnan(adjust(np.full(3, np.nan), method)).all()


def test_unknown_correction_is_refused():
    with pytest.raises(SpecError, match="unknown correction"):
        adjust(np.array([0.1]), "fdr")


def bh_reference(pvalues: np.ndarray) -> np.ndarray:
    return np.asarray(stats.false_discovery_control(pvalues, axis=-1, method="bh"))


@pytest.mark.parametrize("n_rows", [3, PARALLEL_PVALUES // 500 + 7])  # one thread, then two
def test_benjamini_hochberg_identical_to_scipy_with_ties(n_rows):
    rng = np.random.default_rng(11)
    pvalues = np.round(rng.random((n_rows, 500)) ** 3, 3)  # many ties
    pvalues[:, :40] = 1.0
    pvalues[0] = 0.25  # one row entirely tied
    pvalues[1, :5] = 0.0
    pvalues[2, 100:] = pvalues[2, 99]
    adjusted = benjamini_hochberg(pvalues)
    expected = bh_reference(pvalues)
    np.testing.assert_allclose(adjusted, expected, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(adjusted, expected)


@pytest.mark.parametrize("shape", [(7,), (3, 4, 5), (1, 1), (4, 1), (0,), (0, 3), (2, 0)])
def test_benjamini_hochberg_shapes(shape):
    pvalues = np.random.default_rng(12).random(shape)
    adjusted = benjamini_hochberg(pvalues)
    assert adjusted.shape == pvalues.shape
    if pvalues.size:
        np.testing.assert_array_equal(adjusted, bh_reference(pvalues))


@pytest.mark.parametrize("bad", [np.nan, 1.5, -0.1])
@pytest.mark.parametrize("n_rows", [2, PARALLEL_PVALUES // 4 + 1])
def test_benjamini_hochberg_rejects_what_scipy_rejects(bad, n_rows):
    pvalues = np.full((n_rows, 4), 0.5)
    pvalues[-1, 2] = bad
    with pytest.raises(ValueError, match="between 0 and 1"):
        bh_reference(pvalues)
    with pytest.raises(ValueError, match="between 0 and 1"):
        benjamini_hochberg(pvalues)
