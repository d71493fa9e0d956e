import numpy as np
import pytest
from scipy.spatial.distance import cdist

from scperteval.metrics import (
    DatasetContext,
    DegenerateInput,
    distance_matrix,
    nir,
    nir_from_distances,
    pds,
    pds_from_distances,
    rank,
    rank_from_distances,
    transpose_rank,
    transpose_rank_from_distances,
)

# SCIENCE.md section 9: D[i, j] = d(pred_i, truth_j)
TOY_D = np.array([[1.0, 2.0, 3.0], [0.5, 1.0, 4.0], [2.0, 1.5, 1.0]])
SCIPY_NAMES = {"sqeuclidean": "sqeuclidean", "l1": "cityblock", "cosine": "cosine"}


def matrices(seed, n=8, features=12, noise=0.5):
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=(n, features))
    return truth, truth + rng.normal(scale=noise, size=(n, features))


# ---------------------------------------------------------------- slow definitions


def slow_rank(d):
    n = len(d)
    return np.array(
        [sum(d[i, j] <= d[j, j] for i in range(n) if i != j) / (n - 1) for j in range(n)]
    )


def slow_transpose_rank(d):
    n = len(d)
    return np.array(
        [sum(d[i, j] <= d[i, i] for j in range(n) if j != i) / (n - 1) for i in range(n)]
    )


def slow_nir(d):
    n = len(d)
    return np.array(
        [sum(d[i, j] > d[i, i] for j in range(n) if j != i) / (n - 1) for i in range(n)]
    )


def slow_pds_l1(truth, pred, targets):
    n = len(truth)
    scores = []
    for i in range(n):
        kept = [g for g in range(truth.shape[1]) if g not in targets[i]]
        d = [np.abs(pred[i, kept] - truth[j, kept]).sum() for j in range(n)]
        closer = sum(d[j] <= d[i] for j in range(n) if j != i)
        scores.append(1.0 - closer / n)
    return np.array(scores)


# ------------------------------------------------------------------------ toy values


def test_toy_nir():
    np.testing.assert_allclose(nir_from_distances(TOY_D), [1.0, 0.5, 1.0])


def test_toy_other_ranks():
    np.testing.assert_allclose(rank_from_distances(TOY_D), [0.5, 0.0, 0.0])
    np.testing.assert_allclose(transpose_rank_from_distances(TOY_D), [0.0, 0.5, 0.0])
    np.testing.assert_allclose(pds_from_distances(TOY_D), [1.0, 2.0 / 3.0, 1.0])


@pytest.mark.parametrize("seed", range(4))
def test_from_distances_match_slow_definitions_with_ties(seed):
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 4, size=(7, 7)).astype(float)  # many ties
    np.testing.assert_allclose(rank_from_distances(d), slow_rank(d))
    np.testing.assert_allclose(transpose_rank_from_distances(d), slow_transpose_rank(d))
    np.testing.assert_allclose(nir_from_distances(d), slow_nir(d))
    np.testing.assert_allclose(nir_from_distances(d), 1.0 - transpose_rank_from_distances(d))


# ------------------------------------------------------------------------- distances


@pytest.mark.parametrize("distance", ["sqeuclidean", "l1", "cosine"])
def test_distance_matrix_matches_scipy(distance):
    truth, pred = matrices(1)
    expected = cdist(pred, truth, SCIPY_NAMES[distance])
    np.testing.assert_allclose(
        distance_matrix(pred, truth, distance=distance), expected, rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("distance", ["sqeuclidean", "l1", "cosine"])
def test_masked_distance_matrix_drops_columns_per_row(distance):
    truth, pred = matrices(2, n=5)
    keep = np.ones_like(pred)
    keep[0, [0, 3]] = 0.0
    keep[2, 5] = 0.0
    result = distance_matrix(pred, truth, distance=distance, keep=keep)
    for i in range(len(pred)):
        kept = keep[i] > 0
        expected = cdist(pred[i : i + 1, kept], truth[:, kept], SCIPY_NAMES[distance])[0]
        np.testing.assert_allclose(result[i], expected, rtol=1e-10, atol=1e-12)


def test_cosine_zero_vector_is_at_distance_one():
    result = distance_matrix(
        np.zeros((1, 3)), np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), distance="cosine"
    )
    np.testing.assert_array_equal(result, [[1.0, 1.0]])


def test_identical_rows_get_identical_distances():
    rng = np.random.default_rng(3)
    truth = rng.normal(size=(50, 30)) * 10.0 + 5.0
    pred = np.repeat(rng.normal(size=(1, 30)), 50, axis=0)
    d = distance_matrix(pred, truth)
    assert (d == d[0]).all()
    duplicated_truth = np.vstack([truth, truth[:5]])
    d = distance_matrix(truth, duplicated_truth)
    np.testing.assert_array_equal(d[:, :5], d[:, 50:])


# ------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("distance", ["sqeuclidean", "l1", "cosine"])
def test_metrics_match_slow_definitions(distance):
    truth, pred = matrices(4, noise=1.5)
    d = cdist(pred, truth, SCIPY_NAMES[distance])
    np.testing.assert_allclose(rank(truth, pred, distance=distance), slow_rank(d))
    np.testing.assert_allclose(
        transpose_rank(truth, pred, distance=distance), slow_transpose_rank(d)
    )
    np.testing.assert_allclose(nir(truth, pred, distance=distance), slow_nir(d))


def test_pds_matches_slow_definition():
    truth, pred = matrices(5, noise=1.5)
    targets = ((0,), (1, 2), (), (3,), (11,), (4,), (5,), (6,))
    ctx = DatasetContext(perturbations=tuple("abcdefgh"), target_features=targets)
    np.testing.assert_allclose(pds(truth, pred, ctx), slow_pds_l1(truth, pred, targets))
    no_targets = ((),) * 8
    np.testing.assert_allclose(
        pds(truth, pred, exclude_targets=False), slow_pds_l1(truth, pred, no_targets)
    )


def test_target_column_matters_for_pds():
    # A knocks down its target (column 0) and nothing else; B changes nothing. Without
    # column 0, A's prediction is as close to B's truth as to its own: the tie counts
    # against the prediction. B's target (column 1) does not hide A's effect.
    truth = np.array([[-3.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    pred = truth.copy()
    ctx = DatasetContext(perturbations=("A", "B"), target_features=((0,), (1,)))
    np.testing.assert_allclose(pds(truth, pred, exclude_targets=False), [1.0, 1.0])
    np.testing.assert_allclose(pds(truth, pred, ctx), [0.5, 1.0])


def test_perfect_prediction():
    truth, _ = matrices(6)
    ctx = DatasetContext(perturbations=tuple(str(i) for i in range(8)))
    np.testing.assert_array_equal(rank(truth, truth.copy()), np.zeros(8))
    np.testing.assert_array_equal(transpose_rank(truth, truth.copy()), np.zeros(8))
    np.testing.assert_array_equal(nir(truth, truth.copy()), np.ones(8))
    np.testing.assert_array_equal(pds(truth, truth.copy(), ctx), np.ones(8))


@pytest.mark.parametrize("distance", ["sqeuclidean", "l1", "cosine"])
def test_constant_predictor_does_not_score_well(distance):
    truth, _ = matrices(7, n=9)
    constant = np.repeat(truth.mean(axis=0, keepdims=True), 9, axis=0)
    ctx = DatasetContext(perturbations=tuple(str(i) for i in range(9)))
    # Every prediction is tied with every other: the worst rank for every perturbation.
    np.testing.assert_array_equal(rank(truth, constant, distance=distance), np.ones(9))
    # One prediction against all truths orders the truths by distance to it: exactly
    # chance level on average, never better.
    assert transpose_rank(truth, constant, distance=distance).mean() == pytest.approx(0.5)
    assert nir(truth, constant, distance=distance).mean() == pytest.approx(0.5)
    assert pds(truth, constant, ctx, distance=distance).mean() == pytest.approx(10 / 18)


@pytest.mark.parametrize("distance", ["sqeuclidean", "l1", "cosine"])
def test_constant_predictor_equidistant_from_truths_is_worst(distance):
    n = 6
    truth = np.eye(n) * 2.0 - 1.0  # every row at the same distance from the origin
    constant = np.zeros((n, n))
    ctx = DatasetContext(perturbations=tuple(str(i) for i in range(n)))
    np.testing.assert_array_equal(rank(truth, constant, distance=distance), np.ones(n))
    np.testing.assert_array_equal(transpose_rank(truth, constant, distance=distance), np.ones(n))
    np.testing.assert_array_equal(nir(truth, constant, distance=distance), np.zeros(n))
    np.testing.assert_allclose(pds(truth, constant, ctx, distance=distance), np.full(n, 1.0 / n))


def test_invalid_dataset_inputs():
    truth, pred = matrices(8)
    with pytest.raises(DegenerateInput, match="at least 2"):
        rank(truth[:1], pred[:1])
    with pytest.raises(ValueError, match="row i"):
        rank(truth, pred[:-1])
    with pytest.raises(ValueError, match="unknown distance"):
        nir(truth, pred, distance="chebyshev")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="DatasetContext"):
        pds(truth, pred)
    wrong = DatasetContext(perturbations=("a", "b"))
    with pytest.raises(ValueError, match="target features for 2"):
        pds(truth, pred, wrong)
    outside = DatasetContext(perturbations=tuple("abcdefgh"), target_features=((40,),) + ((),) * 7)
    with pytest.raises(ValueError, match="outside"):
        pds(truth, pred, outside)
    bad = pred.copy()
    bad[2, 3] = np.nan
    with pytest.raises(DegenerateInput, match="non-finite"):
        transpose_rank(truth, bad)
    with pytest.raises(ValueError, match="square"):
        nir_from_distances(np.ones((2, 3)))


def test_dataset_context_checks():
    ctx = DatasetContext(covariate="K562", perturbations=("a", "b"))
    assert ctx.target_features == ((), ())
    with pytest.raises(ValueError, match="target-feature entries"):
        DatasetContext(perturbations=("a", "b"), target_features=((1,),))
    with pytest.raises(ValueError, match="outside"):
        DatasetContext(perturbations=("a",), features=("g1", "g2"), target_features=((2,),))


@pytest.mark.parametrize("masked", [False, True])
def test_large_l1_matrix_split_over_threads_equals_one_thread_and_scipy(masked):
    from scperteval.kernels.threads import Threads

    rng = np.random.default_rng(11)
    # Above the size from which the rows are spread over the kernel threads.
    pred, truth = rng.normal(size=(301, 200)), rng.normal(size=(300, 200))
    keep = (rng.random(pred.shape) > 0.1).astype(float) if masked else None
    spread = distance_matrix(pred, truth, distance="l1", keep=keep, threads=Threads(3))
    alone = distance_matrix(pred, truth, distance="l1", keep=keep, threads=Threads(1))
    np.testing.assert_array_equal(spread, alone)
    weights = np.ones_like(pred) if keep is None else keep
    expected = np.array(
        [cdist(p[None] * w, truth * w, "cityblock")[0] for p, w in zip(pred, weights, strict=True)]
    )
    np.testing.assert_allclose(spread, expected, rtol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
def test_distinct_rows_are_those_numpy_unique_finds(masked):
    from scperteval.metrics.dataset import _unique_rows

    rng = np.random.default_rng(4)
    base = rng.normal(size=(7, 5)).round(1)
    base[2, 1] = 0.0
    matrix = base[rng.integers(0, 7, size=60)]
    matrix[::9, 1] = 0.0
    matrix[::13, 1] = -0.0  # equal to 0.0 for np.unique as for the rows compared here
    mask = (rng.random(matrix.shape) > 0.2).astype(float) if masked else None
    key = matrix if mask is None else np.hstack([matrix, mask])
    expected, expected_inverse = np.unique(key, axis=0, return_inverse=True)
    kept, inverse = _unique_rows(np.ascontiguousarray(matrix), mask)
    np.testing.assert_array_equal(key[kept], expected)
    np.testing.assert_array_equal(inverse, expected_inverse.reshape(-1))
    assert len(kept) < len(matrix)  # repeats were found


def test_distinct_rows_compared_in_blocks(monkeypatch):
    from scperteval.metrics import dataset

    monkeypatch.setattr(dataset, "_COMPARE_BYTES", 3 * 8 * 4)  # three rows of 4 at a time
    rng = np.random.default_rng(8)
    matrix = rng.integers(0, 2, size=(40, 4)).astype(float)
    expected, expected_inverse = np.unique(matrix, axis=0, return_inverse=True)
    kept, inverse = dataset._unique_rows(matrix)
    np.testing.assert_array_equal(matrix[kept], expected)
    np.testing.assert_array_equal(inverse, expected_inverse.reshape(-1))


def test_repeated_rows_found_as_a_full_comparison_finds_them():
    from scperteval.metrics.dataset import _PROBE_COLUMNS, _equal_to_previous

    rng = np.random.default_rng(11)
    n_columns = 10 * _PROBE_COLUMNS
    base = rng.integers(0, 3, size=(6, n_columns)).astype(float)
    base[1] = base[0]
    base[1, 7] += 1.0  # differs from row 0 in one column that is not probed first
    base[2, 3] = np.inf
    base[3, :] = base[2]
    base[3, 5] = np.nan  # a NaN is never equal, not even to itself
    base[4, 0] = -0.0  # equal to 0.0
    matrix = np.vstack([base[rng.integers(0, 6, size=50)], base[:2], -0.0 * base[4:5]])
    order = rng.permutation(matrix.shape[0])
    expected = np.r_[False, (matrix[order[1:]] == matrix[order[:-1]]).all(axis=1)]
    np.testing.assert_array_equal(_equal_to_previous(matrix, order), expected)
    assert expected.any() and not expected.all()


def test_identical_rows_get_identical_l1_distances_with_and_without_a_mask():
    rng = np.random.default_rng(5)
    truth = rng.normal(size=(40, 25))
    pred = np.vstack([rng.normal(size=(30, 25)), np.repeat(rng.normal(size=(1, 25)), 10, 0)])
    d = distance_matrix(pred, np.vstack([truth, truth[:3]]), distance="l1")
    assert (d[30:] == d[30]).all()
    np.testing.assert_array_equal(d[:, :3], d[:, 40:])
    np.testing.assert_allclose(d[:, :40], cdist(pred, truth, "cityblock"), rtol=1e-12)
    keep = np.ones_like(pred)
    keep[30:, :4] = 0.0
    masked = distance_matrix(pred, truth, distance="l1", keep=keep)
    assert (masked[30:] == masked[30]).all()
    np.testing.assert_allclose(masked[30], cdist(pred[30:31, 4:], truth[:, 4:], "cityblock")[0])


def test_rows_gathered_in_place_equal_fancy_indexing():
    from scperteval.metrics.dataset import _gather_rows_in_place

    rng = np.random.default_rng(6)
    for n_rows in (1, 2, 7, 30):
        for n_kept in {1, n_rows // 2 + 1, n_rows}:
            matrix = rng.normal(size=(n_rows, 4))
            rows = rng.permutation(n_rows)[:n_kept]
            expected = matrix[rows].copy()
            _gather_rows_in_place(matrix, rows)
            np.testing.assert_array_equal(matrix[:n_kept], expected)


@pytest.mark.parametrize("repeats", [False, True])
def test_shifted_truths_give_the_distance_matrix_bit_for_bit(repeats):
    from scperteval.metrics.dataset import shifted_truths, sqeuclidean_to_truths

    rng = np.random.default_rng(7)
    truth = rng.normal(size=(60, 35)) * 3.0 + 20.0
    pred = truth + rng.normal(size=truth.shape)
    if repeats:
        truth[10:15] = truth[3]
        pred[20:30] = pred[0]
    expected = distance_matrix(pred, truth)
    truths = shifted_truths(truth)
    for candidate in (pred, pred[::-1]):
        copy = np.ascontiguousarray(candidate)
        kept = copy.copy()
        np.testing.assert_array_equal(
            sqeuclidean_to_truths(copy, truths), distance_matrix(candidate, truth)
        )
        np.testing.assert_array_equal(copy, kept)  # not overwritten unless allowed
    # Overwriting the inputs gives the same values, and does overwrite them.
    own_truth, own_pred = truth.copy(), pred.copy()
    found = sqeuclidean_to_truths(
        own_pred, shifted_truths(own_truth, overwrite=True), overwrite_pred=True
    )
    np.testing.assert_array_equal(found, expected)
    assert not np.array_equal(own_pred, pred) and not np.array_equal(own_truth, truth)
    np.testing.assert_allclose(expected, cdist(pred, truth, "sqeuclidean"), rtol=1e-10)
    with pytest.raises(ValueError, match="features"):
        sqeuclidean_to_truths(pred[:, :5], truths)
