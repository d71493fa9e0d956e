"""The GroupStats monoid against direct numpy computation."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from scperteval.stats.groups import GroupStats, leave_one_out, merge_groups, subtract_group

FORMATS = {
    "csr": sp.csr_matrix,
    "csc": sp.csc_matrix,
    "coo": sp.coo_matrix,
    "dense": np.asarray,
}


def random_matrix(rng: np.random.Generator, n_rows: int, n_cols: int, density: float = 0.4):
    """Non-negative values with many exact zeros, like log-normalised expression."""
    values = rng.gamma(2.0, 1.0, (n_rows, n_cols))
    values[rng.random((n_rows, n_cols)) > density] = 0.0
    return values


def reference_stats(values: np.ndarray, codes: np.ndarray, n_groups: int):
    """Count, mean and two-pass ddof=1 variance per group with numpy."""
    n = np.array([np.sum(codes == g) for g in range(n_groups)], dtype=float)
    mean = np.zeros((n_groups, values.shape[1]))
    var = np.full((n_groups, values.shape[1]), np.nan)
    for g in range(n_groups):
        rows = values[codes == g]
        if rows.shape[0]:
            mean[g] = rows.mean(axis=0)
        if rows.shape[0] > 1:
            var[g] = rows.var(axis=0, ddof=1)
    return n, mean, var


def assert_stats_equal(actual: GroupStats, expected: GroupStats, rtol: float = 1e-12) -> None:
    np.testing.assert_array_equal(actual.n, expected.n)
    np.testing.assert_allclose(actual.mean, expected.mean, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(actual.m2, expected.m2, rtol=rtol, atol=1e-11)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_from_chunk_matches_numpy(fmt):
    rng = np.random.default_rng(0)
    values = random_matrix(rng, 120, 15)
    codes = rng.integers(0, 5, 120)
    stats = GroupStats.from_chunk(FORMATS[fmt](values), codes, 6)  # group 5 is empty
    n, mean, var = reference_stats(values, codes, 6)
    np.testing.assert_array_equal(stats.n, n)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(stats.variance(), var, rtol=1e-12, atol=1e-14)
    indicator = np.eye(6)[codes].T
    np.testing.assert_allclose(stats.sum, indicator @ values, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.sumsq, indicator @ values**2, rtol=1e-12, atol=1e-12)
    assert np.all(np.isnan(stats.variance()[5]))
    assert stats.n_groups == 6 and stats.n_features == 15


def test_variance_ddof_and_single_cell_group():
    values = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 0.0]])
    stats = GroupStats.from_chunk(values, np.array([0, 0, 1]), 2)
    np.testing.assert_allclose(stats.variance(ddof=1)[0], [2.0, 8.0])
    np.testing.assert_allclose(stats.variance(ddof=0)[0], [1.0, 4.0])
    assert np.all(np.isnan(stats.variance(ddof=1)[1]))
    np.testing.assert_allclose(stats.variance(ddof=0)[1], [0.0, 0.0])


@pytest.mark.parametrize("fmt", ["csr", "csc", "dense"])
def test_negative_codes_are_ignored(fmt):
    rng = np.random.default_rng(1)
    values = random_matrix(rng, 80, 9)
    codes = rng.integers(-1, 3, 80)
    assert np.any(codes == -1)
    stats = GroupStats.from_chunk(FORMATS[fmt](values), codes, 3)
    kept = codes >= 0
    expected = GroupStats.from_chunk(values[kept], codes[kept], 3)
    assert_stats_equal(stats, expected)
    assert stats.n.sum() == kept.sum()
    # Changing the ignored rows changes nothing.
    poisoned = values.copy()
    poisoned[~kept] = 1e6
    assert_stats_equal(GroupStats.from_chunk(FORMATS[fmt](poisoned), codes, 3), stats)


def test_codes_length_mismatch_raises():
    with pytest.raises(ValueError, match="group codes"):
        GroupStats.from_chunk(np.zeros((3, 2)), np.zeros(4, dtype=int), 1)


@pytest.mark.parametrize("fmt", ["csr", "dense"])
def test_empty_is_identity(fmt):
    rng = np.random.default_rng(2)
    values = random_matrix(rng, 40, 7)
    stats = GroupStats.from_chunk(FORMATS[fmt](values), rng.integers(0, 4, 40), 4)
    empty = GroupStats.empty(4, 7)
    for combined in (empty.combine(stats), stats.combine(empty), empty + stats):
        np.testing.assert_array_equal(combined.n, stats.n)
        np.testing.assert_array_equal(combined.mean, stats.mean)
        np.testing.assert_array_equal(combined.m2, stats.m2)
    no_rows = GroupStats.from_chunk(FORMATS[fmt](np.zeros((0, 7))), np.zeros(0, dtype=int), 4)
    assert_stats_equal(no_rows, empty)
    all_ignored = GroupStats.from_chunk(FORMATS[fmt](values), np.full(40, -1), 4)
    assert_stats_equal(all_ignored, empty)
    assert_stats_equal(empty.combine(empty), empty)


@pytest.mark.parametrize("index", [0, 2, -1])
def test_one_group_is_a_view_equal_to_selecting_it(index):
    rng = np.random.default_rng(1)
    stats = GroupStats(
        n=rng.integers(1, 9, 4).astype(float), mean=rng.normal(size=(4, 6)), m2=rng.random((4, 6))
    )
    one = stats.group(index)
    chosen = stats.select([index])
    for name in ("n", "mean", "m2"):
        np.testing.assert_array_equal(getattr(one, name), getattr(chosen, name))
        assert np.shares_memory(getattr(one, name), getattr(stats, name))
    with pytest.raises(IndexError):
        stats.group(4)


def test_absorb_folds_chunks_like_combine_bit_for_bit():
    rng = np.random.default_rng(7)
    values = random_matrix(rng, 90, 6)
    # Group 3 has no cells at all and group 2 none in the first chunk.
    codes = rng.integers(0, 3, 90)
    codes[:30][codes[:30] == 2] = 0
    bounds = [(0, 30), (30, 55), (55, 90)]
    chunks = [GroupStats.from_chunk(values[a:b], codes[a:b], 4) for a, b in bounds]
    combined = chunks[0]
    for chunk in chunks[1:]:
        combined = combined.combine(chunk)
    fresh = [GroupStats.from_chunk(values[a:b], codes[a:b], 4) for a, b in bounds]
    folded = fresh[0]
    for chunk in fresh[1:]:
        folded.absorb(chunk)
    for name in ("n", "mean", "m2"):
        np.testing.assert_array_equal(getattr(folded, name), getattr(combined, name))
    n, mean, var = reference_stats(values, codes, 4)
    np.testing.assert_array_equal(folded.n, n)
    np.testing.assert_allclose(folded.mean, mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(folded.variance(), var, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="cannot combine"):
        GroupStats.empty(2, 3).absorb(GroupStats.empty(2, 4))


def test_combine_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="cannot combine"):
        GroupStats.empty(2, 3).combine(GroupStats.empty(2, 4))


@settings(max_examples=40, deadline=None, database=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_rows=st.integers(0, 60),
    n_groups=st.integers(1, 5),
    sparse=st.booleans(),
    data=st.data(),
)
def test_any_chunking_and_sharding_equals_one_pass(seed, n_rows, n_groups, sparse, data):
    rng = np.random.default_rng(seed)
    values = random_matrix(rng, n_rows, 6)
    codes = rng.integers(-1, n_groups, n_rows)
    fmt = sp.csr_matrix if sparse else np.asarray
    one_pass = GroupStats.from_chunk(fmt(values), codes, n_groups)

    # Random chunk boundaries.
    cuts = sorted(data.draw(st.lists(st.integers(0, n_rows), max_size=8), label="cuts"))
    bounds = [0, *cuts, n_rows]
    chunks = [
        GroupStats.from_chunk(fmt(values[a:b]), codes[a:b], n_groups)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    # Shards: each chunk goes to a shard; shards reduce their chunks in a random order,
    # then the shard results are merged along a random binary tree.
    n_shards = data.draw(st.integers(1, 4), label="n_shards")
    assignment = [data.draw(st.integers(0, n_shards - 1)) for _ in chunks]
    partials = []
    for shard in range(n_shards):
        members = [c for c, a in zip(chunks, assignment, strict=True) if a == shard]
        order = data.draw(st.permutations(range(len(members))), label="order")
        total = GroupStats.empty(n_groups, 6)
        for i in order:
            total = total.combine(members[i])
        partials.append(total)
    while len(partials) > 1:
        i = data.draw(st.integers(0, len(partials) - 1), label="left")
        left = partials.pop(i)
        j = data.draw(st.integers(0, len(partials) - 1), label="right")
        right = partials.pop(j)
        partials.append(left.combine(right))
    assert_stats_equal(partials[0], one_pass, rtol=1e-12)

    n, mean, var = reference_stats(values, codes, n_groups)
    np.testing.assert_array_equal(partials[0].n, n)
    np.testing.assert_allclose(partials[0].mean, mean, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(partials[0].variance(), var, rtol=1e-10, atol=1e-12)


def test_merge_groups_matches_direct():
    rng = np.random.default_rng(4)
    values = random_matrix(rng, 150, 10)
    codes = rng.integers(0, 6, 150)
    stats = GroupStats.from_chunk(values, codes, 6)
    labels = np.array([1, 0, 1, -1, 2, 0])  # group 3 dropped; output 3 gets nothing
    merged = merge_groups(stats, labels, 4)
    merged_codes = labels[codes]
    direct = GroupStats.from_chunk(values, merged_codes, 4)
    assert_stats_equal(merged, direct, rtol=1e-12)
    n, mean, var = reference_stats(values, merged_codes, 4)
    np.testing.assert_array_equal(merged.n, n)
    np.testing.assert_allclose(merged.variance(), var, rtol=1e-11)
    assert merged.n[3] == 0


def test_subtract_group_matches_direct():
    rng = np.random.default_rng(5)
    values = random_matrix(rng, 200, 12)
    codes = rng.integers(0, 4, 200)
    stats = GroupStats.from_chunk(sp.csr_matrix(values), codes, 4)
    total = GroupStats.from_chunk(values, np.zeros(200, dtype=int), 1)
    for part in range(4):
        rest = subtract_group(total, stats.select([part]))
        remainder = values[codes != part]
        _, mean, var = reference_stats(remainder, np.zeros(remainder.shape[0], int), 1)
        assert rest.n[0] == np.sum(codes != part)
        np.testing.assert_allclose(rest.mean, mean, rtol=1e-11)
        np.testing.assert_allclose(rest.variance(), var, rtol=1e-9)
    # Removing everything leaves the identity.
    nothing = subtract_group(total, total)
    assert_stats_equal(nothing, GroupStats.empty(1, 12))


def test_subtract_group_inverts_combine():
    rng = np.random.default_rng(6)
    a = GroupStats.from_chunk(random_matrix(rng, 30, 5), rng.integers(0, 3, 30), 3)
    b = GroupStats.from_chunk(random_matrix(rng, 50, 5), rng.integers(0, 3, 50), 3)
    back = subtract_group(a.combine(b), b)
    assert_stats_equal(back, a, rtol=1e-9)


def test_leave_one_out_matches_direct():
    rng = np.random.default_rng(7)
    values = random_matrix(rng, 300, 8)
    codes = rng.integers(0, 7, 300)
    stats = GroupStats.from_chunk(values, codes, 7)
    labels = np.array([0, 1, 0, 0, 1, 2, 1])  # group 5 is alone under label 2
    rest = leave_one_out(stats, labels)
    for g in range(7):
        others = np.isin(codes, np.flatnonzero(labels == labels[g])) & (codes != g)
        assert rest.n[g] == others.sum()
        if others.sum() == 0:
            np.testing.assert_array_equal(rest.mean[g], 0.0)
            np.testing.assert_array_equal(rest.m2[g], 0.0)
            continue
        np.testing.assert_allclose(rest.mean[g], values[others].mean(axis=0), rtol=1e-12)
        expected = values[others].var(axis=0, ddof=1)
        np.testing.assert_allclose(rest.variance()[g], expected, rtol=1e-11)


def assert_identical(actual: GroupStats, expected: GroupStats) -> None:
    for field in ("n", "mean", "m2"):
        np.testing.assert_array_equal(getattr(actual, field), getattr(expected, field))


def test_merges_split_over_threads_equal_one_thread():
    from scperteval.kernels.threads import Threads
    from scperteval.stats.groups import PARALLEL_MERGE

    rng = np.random.default_rng(8)
    n_features = PARALLEL_MERGE // 6 + 7  # enough values for parallel feature ranges
    stats = GroupStats(
        n=rng.integers(0, 40, 9).astype(float),
        mean=rng.normal(size=(9, n_features)),
        m2=rng.exponential(size=(9, n_features)),
    )
    labels = np.array([0, 1, 0, 0, 1, -1, 1, 0, 2])
    several = Threads(3)
    merged = merge_groups(stats, labels, 3, several)
    rest = leave_one_out(stats, np.abs(labels), several)
    serial = several.serial()
    assert_identical(merge_groups(stats, labels, 3, serial), merged)
    assert_identical(leave_one_out(stats, np.abs(labels), serial), rest)
    # Counts are merged even without features.
    empty = GroupStats(n=stats.n, mean=np.empty((9, 0)), m2=np.empty((9, 0)))
    np.testing.assert_array_equal(
        merge_groups(empty, labels, 3).n, [stats.n[labels == k].sum() for k in range(3)]
    )
    np.testing.assert_array_equal(
        leave_one_out(empty, labels).n,
        [stats.n[labels == label].sum() - stats.n[g] for g, label in enumerate(labels)],
    )


# ---------------------------------------------------------------- cancellation
def cancellation_data(seed: int = 0):
    """Genes 0 and 2 are 1000 + N(0, 1e-3) and 5 + N(0, 1e-5) in groups 0-2, 0 in groups 3-4."""
    rng = np.random.default_rng(seed)
    sizes = [40, 55, 35, 30, 25]
    codes = np.repeat(np.arange(5), sizes)
    values = np.zeros((codes.size, 3))
    high = codes <= 2
    values[high, 0] = 1000.0 + rng.normal(0.0, 1e-3, high.sum())
    values[:, 1] = rng.gamma(2.0, 1.0, codes.size)  # an ordinary gene
    values[high, 2] = 5.0 + rng.normal(0.0, 1e-5, high.sum())  # variance ~1e-10
    order = rng.permutation(codes.size)  # interleave the groups
    return values[order], codes[order]


def two_pass_var(values: np.ndarray) -> np.ndarray:
    return np.var(values, axis=0, ddof=1)


@pytest.mark.parametrize("fmt", ["csr", "csc", "dense"])
@pytest.mark.parametrize("chunk", [None, 7])
def test_cancellation_small_variance_large_mean(fmt, chunk):
    values, codes = cancellation_data()
    if chunk is None:
        stats = GroupStats.from_chunk(FORMATS[fmt](values), codes, 5)
    else:
        stats = GroupStats.empty(5, 3)
        for start in range(0, codes.size, chunk):
            rows = slice(start, start + chunk)
            stats = stats.combine(GroupStats.from_chunk(FORMATS[fmt](values[rows]), codes[rows], 5))
    variance = stats.variance()
    for g in range(5):
        expected = two_pass_var(values[codes == g])
        np.testing.assert_allclose(variance[g], expected, rtol=1e-9, atol=0)
        np.testing.assert_allclose(stats.mean[g], values[codes == g].mean(axis=0), rtol=1e-14)
    assert 1e-7 < variance[0, 0] < 1e-5 and np.all(variance[3:, 0] == 0)

    # Pooling the high groups keeps the small variance exact.
    pooled = merge_groups(stats, np.array([0, 0, 0, -1, -1]), 1)
    np.testing.assert_allclose(pooled.variance()[0], two_pass_var(values[codes <= 2]), rtol=1e-9)

    # Leave-one-out over all groups: leaving out a zero group leaves a high group next
    # to the other zero group; leaving out group 4 with group 3 relabelled leaves only
    # high groups, whose variance is ~1e-6 next to a 1000^2 spread.
    labels = np.array([0, 0, 0, 0, 1])
    rest = leave_one_out(stats, labels)
    for g in range(4):
        others = (labels[codes] == labels[g]) & (codes != g)
        np.testing.assert_allclose(rest.variance()[g], two_pass_var(values[others]), rtol=1e-9)
        np.testing.assert_allclose(rest.mean[g], values[others].mean(axis=0), rtol=1e-13)
    high_only = two_pass_var(values[codes <= 2])
    np.testing.assert_allclose(rest.variance()[3, 0], high_only[0], rtol=1e-9)


@pytest.mark.parametrize("fmt", ["csr", "dense"])
def test_cancellation_subtract_group_at_its_precision(fmt):
    """subtract_group recovers a remainder whose variance is not swamped by the removed part."""
    values, codes = cancellation_data(1)
    stats = GroupStats.from_chunk(FORMATS[fmt](values), codes, 5)
    high = merge_groups(stats, np.array([0, 0, 0, -1, -1]), 1)
    for g in range(3):
        rest = subtract_group(high, stats.select([g]))
        others = (codes <= 2) & (codes != g)
        np.testing.assert_allclose(rest.variance()[0], two_pass_var(values[others]), rtol=1e-9)
        np.testing.assert_allclose(rest.mean[0], values[others].mean(axis=0), rtol=1e-13)


# ------------------------------------------------------ one-pass sparse moments
def dense_two_pass(values: np.ndarray, codes: np.ndarray, n_groups: int):
    """Per-group mean and centred sum of squares, two passes with numpy."""
    mean = np.zeros((n_groups, values.shape[1]))
    m2 = np.zeros((n_groups, values.shape[1]))
    for g in range(n_groups):
        rows = values[codes == g]
        if rows.shape[0]:
            mean[g] = rows.mean(axis=0)
            m2[g] = ((rows - mean[g]) ** 2).sum(axis=0)
    return mean, m2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_near_constant_groups_match_two_pass(dtype):
    """Groups whose values barely vary, where ``sumsq - sum**2 / n`` cancels."""
    rng = np.random.default_rng(21)
    n_rows, n_groups = 600, 6
    codes = rng.integers(0, n_groups, n_rows)
    values = random_matrix(rng, n_rows, 8)
    values[:, 0] = 1000.0 + rng.normal(0.0, 1e-3, n_rows)  # 1000 + tiny offsets
    values[:, 1] = 1000.0  # every cell equal: variance exactly 0
    values[:, 2] = 1e6 + rng.integers(0, 3, n_rows)  # large offset, small integer spread
    values[codes == 2, 3] = 7.25  # constant within one group, zero elsewhere
    values = values.astype(dtype).astype(np.float64)
    stats = GroupStats.from_chunk(sp.csr_matrix(values.astype(dtype)), codes, n_groups)
    mean, m2 = dense_two_pass(values, codes, n_groups)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-13, atol=0)
    np.testing.assert_allclose(stats.m2, m2, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(stats.m2[:, 1], 0.0)
    np.testing.assert_array_equal(stats.mean[:, 1], 1000.0)
    assert stats.m2[2, 3] == 0.0
    # Where the plain one-pass formula would fail: it loses every digit of column 0.
    sumsq = np.array([np.sum(values[codes == g, 0] ** 2) for g in range(n_groups)])
    total = np.array([np.sum(values[codes == g, 0]) for g in range(n_groups)])
    naive = sumsq - total**2 / np.bincount(codes, minlength=n_groups)
    assert np.max(np.abs(naive - m2[:, 0]) / m2[:, 0]) > 1e-6


def test_sparse_one_pass_matches_dense_two_pass():
    rng = np.random.default_rng(22)
    n_rows, n_groups = 3000, 9
    codes = rng.integers(-1, n_groups, n_rows)
    values = random_matrix(rng, n_rows, 40, density=0.3)
    values[:, :10] += 5.0 * (values[:, :10] > 0)  # high means next to zeros
    values[:, 10:20] = 3.0 + rng.normal(0.0, 0.01, (n_rows, 10))  # dense, near-constant
    values = values.astype(np.float32)
    stats = GroupStats.from_chunk(sp.csr_matrix(values), codes, n_groups + 1)
    kept = codes >= 0
    mean, m2 = dense_two_pass(values[kept].astype(np.float64), codes[kept], n_groups + 1)
    np.testing.assert_array_equal(stats.n, np.bincount(codes[kept], minlength=n_groups + 1))
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-13, atol=0)
    np.testing.assert_allclose(stats.m2, m2, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(stats.m2[n_groups], 0.0)  # the empty group


@pytest.mark.parametrize("extra", [None, 0, 1, 90])
def test_sparse_second_pass_for_few_and_many_near_constant_features(extra):
    """Near-constant features are recomputed exactly, alone or with the whole group."""
    from scperteval.kernels.moments import FEW_EXACT_FEATURES

    n_constant = 1 if extra is None else FEW_EXACT_FEATURES + extra
    rng = np.random.default_rng(24)
    n_rows, n_groups = 400, 3
    codes = rng.integers(0, n_groups, n_rows)
    values = random_matrix(rng, n_rows, n_constant + 20, density=0.4)
    constant = values[:, :n_constant]
    constant[:] = 50.0 + rng.normal(0.0, 0.05, constant.shape)
    constant[rng.random(constant.shape) < 0.02] = 0.0  # absent from a few cells
    stats = GroupStats.from_chunk(sp.csr_matrix(values), codes, n_groups)
    mean, m2 = dense_two_pass(values, codes, n_groups)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-13, atol=0)
    np.testing.assert_allclose(stats.m2, m2, rtol=1e-12, atol=0)


def test_sparse_unsorted_rows_are_read_as_they_are(monkeypatch):
    """Unsorted rows without duplicates need no canonical copy of the matrix."""
    rng = np.random.default_rng(26)
    values = random_matrix(rng, 120, 30, density=0.5)
    codes = rng.integers(0, 4, 120)
    matrix = sp.csr_matrix(values)
    for row in range(0, matrix.shape[0], 2):
        span = slice(matrix.indptr[row], matrix.indptr[row + 1])
        shuffle = rng.permutation(span.stop - span.start)
        matrix.indices[span] = matrix.indices[span][shuffle]
        matrix.data[span] = matrix.data[span][shuffle]
    matrix.has_sorted_indices = False

    def no_copy(self, *args, **kwargs):
        raise AssertionError("the matrix was copied")

    monkeypatch.setattr(type(matrix), "copy", no_copy)
    stats = GroupStats.from_chunk(matrix, codes, 4)
    mean, m2 = dense_two_pass(values, codes, 4)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(stats.m2, m2, rtol=1e-12, atol=1e-13)


def test_sparse_unsorted_indices_with_near_constant_feature():
    rng = np.random.default_rng(25)
    values = random_matrix(rng, 80, 6)
    values[:, 2] = 1000.0 + rng.normal(0.0, 1e-3, 80)
    codes = rng.integers(0, 3, 80)
    matrix = sp.csr_matrix(values)
    for row in range(matrix.shape[0]):
        span = slice(matrix.indptr[row], matrix.indptr[row + 1])
        matrix.indices[span] = matrix.indices[span][::-1]
        matrix.data[span] = matrix.data[span][::-1]
    matrix.has_sorted_indices = False
    stats = GroupStats.from_chunk(matrix, codes, 3)
    mean, m2 = dense_two_pass(values, codes, 3)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-13)
    np.testing.assert_allclose(stats.m2, m2, rtol=1e-9)


@pytest.mark.parametrize("layout", ["unsorted", "duplicates"])
def test_sparse_non_canonical_indices(layout):
    rng = np.random.default_rng(23)
    values = random_matrix(rng, 50, 6)
    codes = rng.integers(0, 3, 50)
    matrix = sp.csr_matrix(values)
    if layout == "unsorted":
        for row in range(matrix.shape[0]):
            span = slice(matrix.indptr[row], matrix.indptr[row + 1])
            matrix.indices[span] = matrix.indices[span][::-1]
            matrix.data[span] = matrix.data[span][::-1]
        matrix.has_sorted_indices = False
    else:
        # Every stored value split in two entries of the same cell.
        starts, stops = matrix.indptr[:-1], matrix.indptr[1:]
        indices = np.concatenate(
            [np.tile(matrix.indices[a:b], 2) for a, b in zip(starts, stops, strict=True)]
        )
        data = np.concatenate(
            [
                np.concatenate([matrix.data[a:b] * 0.25, matrix.data[a:b] * 0.75])
                for a, b in zip(starts, stops, strict=True)
            ]
        )
        matrix = sp.csr_matrix((data, indices, 2 * matrix.indptr), shape=matrix.shape)
        assert not matrix.has_canonical_format
    stats = GroupStats.from_chunk(matrix, codes, 3)
    mean, m2 = dense_two_pass(values, codes, 3)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(stats.m2, m2, rtol=1e-12, atol=1e-13)
