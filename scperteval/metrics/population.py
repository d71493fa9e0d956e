"""Perturbation-scope metrics between two populations of cells.

Inputs are point clouds: 2-D arrays (cells x features), usually in a reduced space
(top-k genes, PCA). Every function has the signature ``f(gt, pred, ctx=None, **options)``
and returns a float; lower is better and 0 means the two samples are indistinguishable.

Pairwise distances are computed with BLAS as ``||a||^2 + ||b||^2 - 2 a.b`` in float64,
in tiles whose size is bounded by ``max_block_bytes`` (and small enough to stay in cache
while a tile is transformed and summed), after shifting both clouds by their pooled mean
(distances do not change under a common shift, and the expansion loses less precision
near the origin). Squared distances within ``1e-12 (||a||^2 + ||b||^2)`` of zero are
rounding noise of the expansion and are set to 0, so coinciding cells are at distance 0
exactly. Each tile's values are transformed (square root, kernel) and summed while in
cache; the tile sums are added in a fixed order, so a value never depends on threads.
The matrix products run on one BLAS thread: with products this thin, more threads cost
more in waking and waiting than they save (on a busy machine, many times more), and the
result does not depend on the machine's thread count either.

The building blocks (:func:`distance_sum`, :func:`within_distance_sum`,
:func:`kernel_sum`, :func:`within_kernel_sum`, :func:`median_pairwise_distance`,
:func:`energy_distance_from_sums`, :func:`mmd_from_sums`, and below them
:func:`pair_sums` and :class:`StoredPairs`) let a caller compute the within-sample sums
of a reference sample once and reuse them for every perturbation
(:mod:`scperteval.engine.fastpath` does).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from scperteval.errors import MissingExtraError
from scperteval.kernels.sinkhorn_loop import DEFAULT_MAX_ITER, check_stopping
from scperteval.kernels.threads import Threads
from scperteval.metrics._common import DegenerateInput, as_matrix
from scperteval.metrics._registry import METRICS
from scperteval.metrics.metric_context import PerturbationContext

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "energy_distance",
    "mmd",
    "sinkhorn",
    "distance_sum",
    "within_distance_sum",
    "kernel_sum",
    "within_kernel_sum",
    "median_pairwise_distance",
    "energy_distance_from_sums",
    "mmd_from_sums",
    "pair_sums",
    "rbf_transform",
    "SQRT",
    "StoredPairs",
]

Float64Array = npt.NDArray[np.float64]

#: Memory bound for one block of pairwise values (and its temporaries), in bytes.
DEFAULT_BLOCK_BYTES = 64 * 2**20

# Squared distances below this fraction of ||a||^2 + ||b||^2 cannot be told apart from
# the cancellation error of the BLAS expansion.
_SNAP_RTOL = 1e-12
# A tile's computed squared distances exceed (|a| + |b|)^2 by a few units in the last
# place at most; bounds are widened by far more than that.
_BOUND_MARGIN = 1.0 + 1e-9
# Arrays of one block's size alive at once: the block, a temporary and a mask.
_ARRAYS_PER_BLOCK = 3
# Values per tile of the summed pairwise terms: a tile, its transform and a mask fit
# in cache together (2 MiB per float64 array).
_TILE_ELEMENTS = 1 << 18
_TILE_COLUMNS = 2048
# Bits of the float64 pattern resolved by the first and by each later pass of the
# exact median selection.
_FIRST_DIGIT_BITS = 20
_DIGIT_BITS = 16


# --------------------------------------------------------------------------- blocks


def _rows_per_block(n_columns: int, max_block_bytes: int) -> int:
    per_row = 8 * _ARRAYS_PER_BLOCK * max(n_columns, 1)
    return max(1, int(max_block_bytes) // per_row)


def _row_norms(points: Float64Array) -> Float64Array:
    return np.einsum("ij,ij->i", points, points)


def _squared_distances(
    a: Float64Array, sq_a: Float64Array, b: Float64Array, sq_b: Float64Array
) -> Float64Array:
    d2 = (-2.0 * a) @ b.T
    d2 += sq_a[:, None]
    d2 += sq_b[None, :]
    # Only entries under a block-wide bound can be noise; testing those against their
    # own bound avoids a second block-sized array.
    suspects = np.nonzero(d2 <= _SNAP_RTOL * (sq_a.max(initial=0.0) + sq_b.max(initial=0.0)))
    if suspects[0].size:
        rows, cols = suspects
        noise = d2[rows, cols] <= _SNAP_RTOL * (sq_a[rows] + sq_b[cols])
        d2[rows[noise], cols[noise]] = 0.0
    return d2


def _centred(*clouds: Float64Array) -> list[Float64Array]:
    """Shift every cloud by the mean of all of them together."""
    count = sum(cloud.shape[0] for cloud in clouds)
    if count == 0:
        return list(clouds)
    shift = sum(cloud.sum(axis=0) for cloud in clouds) / count
    return [cloud - shift for cloud in clouds]


def _within_pairs(x: Float64Array, max_block_bytes: int) -> Iterator[Float64Array]:
    """Yield arrays of squared distances covering every pair i < j of rows of x once."""
    sq = _row_norms(x)
    n = x.shape[0]
    rows = _rows_per_block(n, max_block_bytes)
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        block = _squared_distances(x[start:stop], sq[start:stop], x[start:], sq[start:])
        size = stop - start
        upper = np.triu_indices(size, k=1)
        yield block[:, :size][upper]
        if stop < n:
            yield block[:, size:]


def _cloud_pair(gt: npt.ArrayLike, pred: npt.ArrayLike) -> tuple[Float64Array, Float64Array]:
    x = as_matrix(gt, "truth cells")
    y = as_matrix(pred, "predicted cells")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"truth has {x.shape[1]} features but prediction has {y.shape[1]}")
    return x, y


def _check_bandwidth(bandwidth: float) -> float:
    value = float(bandwidth)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"bandwidth must be a positive finite number, got {bandwidth!r}")
    return value


#: A transform of snapped squared distances whose sum over pairs is wanted:
#: ``("sqrt", 0.0)`` for distances, ``("rbf", scale)`` for ``exp(scale * d2)``.
PairTransform = tuple[str, float]
SQRT: PairTransform = ("sqrt", 0.0)


def rbf_transform(bandwidth: float) -> PairTransform:
    """The transform of an RBF kernel of width ``bandwidth`` (see :func:`pair_sums`)."""
    sigma = _check_bandwidth(bandwidth)
    return ("rbf", -1.0 / (2.0 * sigma * sigma))


def _tile_shape(n_rows: int, n_columns: int, max_block_bytes: int) -> tuple[int, int]:
    budget = max(1, min(_TILE_ELEMENTS, int(max_block_bytes) // (8 * _ARRAYS_PER_BLOCK)))
    columns = max(1, min(n_columns, _TILE_COLUMNS, budget))
    rows = max(1, min(n_rows, budget // columns))
    return rows, columns


def _check_transforms(transforms: Sequence[PairTransform]) -> None:
    for kind, _ in transforms:
        if kind not in ("sqrt", "rbf"):
            raise ValueError(f"unknown pair transform {kind!r}")


def _pair_tiles(
    x: Float64Array,
    y: Float64Array | None,
    want_root: bool,
    max_block_bytes: int,
    threads: Threads | None = None,
) -> Iterator[tuple[Float64Array, Float64Array | None, int, float]]:
    """Yield ``(d2, root, offset, bound)`` per tile of pairs, in a fixed order.

    ``d2`` holds snapped squared distances, ``root`` their square roots (when
    ``want_root``). Within one cloud, a tile crossing the diagonal must leave out its
    pairs ``(i, j)`` with ``j <= i + offset``; other tiles have ``offset =``
    :data:`~scperteval.kernels.rbf.NO_DIAGONAL`. ``bound`` is no smaller than any
    value of ``d2``: ``(|a| + |b|)^2`` for the longest rows on either side, widened
    by far more than the expansion's rounding. The arrays are reused: each must be
    consumed before the next tile is asked for.
    """
    from scperteval.kernels.distances import complete_distances, complete_squared_distances
    from scperteval.kernels.rbf import NO_DIAGONAL

    within = y is None
    other = x if y is None else y
    n, m = x.shape[0], other.shape[0]
    if n == 0 or m == 0:
        return
    sq_x = _row_norms(x)
    sq_y = sq_x if within else _row_norms(other)
    scaled = -2.0 * x
    rows, columns = _tile_shape(n, m, max_block_bytes)
    size = rows * columns
    tile_buffer = np.empty(size)
    root_buffer = np.empty(size) if want_root else None
    with (threads or Threads()).single_threaded_blas():
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            sq_a = sq_x[start:stop]
            longest_a = math.sqrt(float(sq_a.max()))
            for first in range(start if within else 0, m, columns):
                last = min(first + columns, m)
                shape = (stop - start, last - first)
                count = shape[0] * shape[1]
                d2 = tile_buffer[:count].reshape(shape)
                sq_b = sq_y[first:last]
                np.matmul(scaled[start:stop], other[first:last].T, out=d2)
                root = None
                if root_buffer is not None:
                    root = root_buffer[:count].reshape(shape)
                    complete_distances(d2, sq_a, sq_b, _SNAP_RTOL, root)
                else:
                    complete_squared_distances(d2, sq_a, sq_b, _SNAP_RTOL)
                # Within one cloud, a tile crossing the diagonal keeps only the pairs
                # of a cell with the cells after it.
                crossing = within and first < stop
                bound = (longest_a + math.sqrt(float(sq_b.max()))) ** 2 * _BOUND_MARGIN
                yield d2, root, start - first if crossing else NO_DIAGONAL, bound


def _add_tile_sums(
    totals: list[float],
    d2: Float64Array,
    root: Float64Array | None,
    offset: int,
    transforms: Sequence[PairTransform],
    work_buffer: Float64Array,
    bound: float = math.inf,
) -> None:
    from scperteval.kernels.distances import zero_through_diagonal
    from scperteval.kernels.rbf import NO_DIAGONAL, rbf_tile_sum

    for index, (kind, scale) in enumerate(transforms):
        if kind == "rbf":
            totals[index] += rbf_tile_sum(d2, scale, offset, bound)
            continue
        if root is not None:
            values = root
        else:
            values = work_buffer[: d2.size].reshape(d2.shape)
            np.sqrt(d2, out=values)
        if offset != NO_DIAGONAL:
            zero_through_diagonal(values, offset)
        totals[index] += float(values.sum())


def pair_sums(
    x: Float64Array,
    y: Float64Array | None,
    transforms: Sequence[PairTransform],
    *,
    max_block_bytes: int = DEFAULT_BLOCK_BYTES,
    threads: Threads | None = None,
) -> list[float]:
    """Sums over pairs of each transform of the snapped squared distances, in one pass.

    The clouds are used as given (not shifted). With ``y`` given, the pairs are all
    ``(x_i, y_j)``; with ``y=None``, the unordered pairs ``i < j`` of rows of ``x``
    (half of an ordered-pair within-sample sum). Every pair's squared distance is
    computed once, in cache-sized tiles, and each transform of it summed: asking for
    several sums at once costs little more than one, and gives for each transform
    exactly the value it gets alone.

    Parameters
    ----------
    x, y
        Float64 point clouds (rows are points) with the same number of columns.
    transforms
        :data:`SQRT` (Euclidean distance) and/or :func:`rbf_transform` values.
    max_block_bytes
        Memory bound for one tile of pairwise values and its temporaries.
    threads
        The run's threads, which hold BLAS to one thread (for a call without them,
        its own: looking up the BLAS libraries costs milliseconds).

    Returns
    -------
    list of float
        One sum per transform, in order.

    """
    _check_transforms(transforms)
    totals = [0.0] * len(transforms)
    if not transforms:
        return totals
    want_root = any(kind == "sqrt" for kind, _ in transforms)
    rows, columns = _tile_shape(x.shape[0], (x if y is None else y).shape[0], max_block_bytes)
    work_buffer = np.empty(rows * columns)
    for d2, root, offset, bound in _pair_tiles(x, y, want_root, max_block_bytes, threads):
        _add_tile_sums(totals, d2, root, offset, transforms, work_buffer, bound)
    return totals


class StoredPairs:
    """The snapped squared distances of the pairs ``i < j`` of one cloud, kept in memory.

    For a reference sample whose within-sample kernel sum is wanted at many
    bandwidths: :meth:`sums` gives exactly what :func:`pair_sums` ``(x, None, ...)``
    gives, tile for tile, without recomputing the distances. Holds about
    ``8 n^2 / 2`` bytes (:meth:`nbytes_for`).

    Parameters
    ----------
    x
        Float64 point cloud, used as given (not shifted).
    max_block_bytes
        Memory bound for one tile (the tiling of :func:`pair_sums`).
    threads
        The run's threads, which hold BLAS to one thread (for a call without them,
        its own: looking up the BLAS libraries costs milliseconds).

    """

    def __init__(
        self,
        x: Float64Array,
        *,
        max_block_bytes: int = DEFAULT_BLOCK_BYTES,
        threads: Threads | None = None,
    ) -> None:
        tiles = _pair_tiles(x, None, False, max_block_bytes, threads)
        self._tiles = [(d2.copy(), offset) for d2, _, offset, _ in tiles]
        rows, columns = _tile_shape(x.shape[0], x.shape[0], max_block_bytes)
        self._work_size = rows * columns

    @staticmethod
    def nbytes_for(n_points: int, max_block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
        """Approximate memory held for a cloud of ``n_points`` points."""
        rows, columns = _tile_shape(n_points, n_points, max_block_bytes)
        return 8 * (n_points * (n_points + 1) // 2 + n_points * min(rows, n_points))

    @property
    def nbytes(self) -> int:
        """Memory held by the stored distances."""
        return sum(d2.nbytes for d2, _ in self._tiles)

    def sums(self, transforms: Sequence[PairTransform]) -> list[float]:
        """Sums over the pairs ``i < j`` of each transform, as :func:`pair_sums` computes them."""
        _check_transforms(transforms)
        totals = [0.0] * len(transforms)
        work_buffer = np.empty(self._work_size)
        for d2, offset in self._tiles:
            _add_tile_sums(totals, d2, None, offset, transforms, work_buffer)
        return totals


# ---------------------------------------------------------------------- building blocks


def distance_sum(
    x: npt.ArrayLike, y: npt.ArrayLike, *, max_block_bytes: int = DEFAULT_BLOCK_BYTES
) -> float:
    """Sum of Euclidean distances ``||x_i - y_j||`` over all ``n * m`` pairs.

    Parameters
    ----------
    x, y
        Point clouds (rows are points) with the same number of columns.
    max_block_bytes
        Memory bound for one block of pairwise distances.

    Returns
    -------
    float
        The sum; 0.0 when either cloud is empty.

    """
    a, b = _cloud_pair(x, y)
    a, b = _centred(a, b)
    return pair_sums(a, b, [SQRT], max_block_bytes=max_block_bytes)[0]


def within_distance_sum(x: npt.ArrayLike, *, max_block_bytes: int = DEFAULT_BLOCK_BYTES) -> float:
    """Sum of Euclidean distances ``||x_i - x_j||`` over ordered pairs ``i != j``.

    Each unordered pair counts twice, so the unbiased mean distance is this sum
    divided by ``n (n - 1)``.

    Parameters
    ----------
    x
        Point cloud (rows are points).
    max_block_bytes
        Memory bound for one block of pairwise distances.

    Returns
    -------
    float
        The sum; 0.0 for fewer than two points.

    """
    (a,) = _centred(as_matrix(x, "points"))
    return 2.0 * pair_sums(a, None, [SQRT], max_block_bytes=max_block_bytes)[0]


def kernel_sum(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    bandwidth: float,
    *,
    max_block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> float:
    """Sum of RBF kernel values ``exp(-||x_i - y_j||^2 / (2 bandwidth^2))`` over all pairs.

    Parameters
    ----------
    x, y
        Point clouds (rows are points) with the same number of columns.
    bandwidth
        Kernel width sigma, positive.
    max_block_bytes
        Memory bound for one block of pairwise values.

    Returns
    -------
    float
        The sum; 0.0 when either cloud is empty.

    """
    kernel = rbf_transform(bandwidth)
    a, b = _cloud_pair(x, y)
    a, b = _centred(a, b)
    return pair_sums(a, b, [kernel], max_block_bytes=max_block_bytes)[0]


def within_kernel_sum(
    x: npt.ArrayLike, bandwidth: float, *, max_block_bytes: int = DEFAULT_BLOCK_BYTES
) -> float:
    """Sum of RBF kernel values over ordered pairs ``i != j`` (the diagonal excluded).

    Parameters
    ----------
    x
        Point cloud (rows are points).
    bandwidth
        Kernel width sigma, positive.
    max_block_bytes
        Memory bound for one block of pairwise values.

    Returns
    -------
    float
        The sum; 0.0 for fewer than two points.

    """
    kernel = rbf_transform(bandwidth)
    (a,) = _centred(as_matrix(x, "points"))
    return 2.0 * pair_sums(a, None, [kernel], max_block_bytes=max_block_bytes)[0]


def median_pairwise_distance(
    z: npt.ArrayLike, *, max_block_bytes: int = DEFAULT_BLOCK_BYTES, threads: Threads | None = None
) -> float:
    """Median of the positive Euclidean distances between the rows of ``z``.

    The median is over unordered pairs ``i < j`` whose points differ
    (``||z_i - z_j|| > 0``), with NumPy's convention for an even count (the mean of
    the two middle values). Coinciding points are left out because sparse expression
    data often hold many identical cells (all zero in a top-k gene space), which would
    otherwise drive the median, and with it an RBF bandwidth, to zero.

    The result is exact, and found without holding all pairs in memory: when the
    positive distances exceed the ``max_block_bytes`` budget, a radix selection on the
    bit patterns of the squared distances (monotone in the value for positive floats)
    narrows down the values holding the median, one pass over the blocks per digit,
    until they fit; usually two passes in all.

    Parameters
    ----------
    z
        Point cloud (rows are points).
    max_block_bytes
        Memory bound for one block of pairwise values and for the values kept.
    threads
        The run's threads, which hold BLAS to one thread (for a call without them,
        its own: looking up the BLAS libraries costs milliseconds).

    Returns
    -------
    float
        The median; 0.0 when no two points differ.

    """
    (points,) = _centred(as_matrix(z, "points"))
    budget = max(1, int(max_block_bytes) // 8)
    shift = 64 - _FIRST_DIGIT_BITS
    # The histogram of the radix selection is started only once the values outgrow
    # the budget (it then counts the values kept so far too).
    histogram: npt.NDArray[np.int64] | None = None
    kept: list[Float64Array] = []
    count = 0
    with (threads or Threads()).single_threaded_blas():
        for block in _within_pairs(points, max_block_bytes):
            positive = block[block > 0]
            count += positive.size
            if histogram is None and count <= budget:
                kept.append(positive)
                continue
            if histogram is None:
                histogram = np.zeros(1 << _FIRST_DIGIT_BITS, dtype=np.int64)
                for values in kept:
                    histogram += np.bincount(_keys(values) >> shift, minlength=histogram.size)
                kept = []
            histogram += np.bincount(_keys(positive) >> shift, minlength=histogram.size)
        if count == 0:
            return 0.0
        ranks = ((count - 1) // 2, count // 2)
        if histogram is None:
            values = np.partition(np.concatenate(kept), ranks)
            low, high = float(values[ranks[0]]), float(values[ranks[1]])
        else:
            low, high = _radix_select(points, ranks, histogram, shift, budget, max_block_bytes)
    return 0.5 * (math.sqrt(low) + math.sqrt(high))


def _keys(values: Float64Array) -> npt.NDArray[np.int64]:
    """Bit patterns of positive floats, which order exactly as the values do."""
    return np.ascontiguousarray(values).view(np.int64)


def _with_key(
    points: Float64Array, key: int, shift: int, max_block_bytes: int
) -> Iterator[Float64Array]:
    """Positive squared distances whose bit pattern starts with ``key`` (above ``shift``)."""
    for block in _within_pairs(points, max_block_bytes):
        positive = block[block > 0]
        yield positive[(_keys(positive) >> shift) == key]


def _radix_select(
    points: Float64Array,
    ranks: tuple[int, int],
    histogram: npt.NDArray[np.int64],
    shift: int,
    budget: int,
    max_block_bytes: int,
) -> tuple[float, float]:
    """Order statistics ``ranks`` (0-based, adjacent) of the positive squared distances.

    ``histogram[b]`` counts the values whose key ``bits >> shift`` is ``base + b``; the
    wanted values lie among them, above ``below`` smaller values.
    """
    first, second = ranks
    below, base = 0, 0
    while True:
        cumulative = below + np.cumsum(histogram)
        bin_first = int(np.searchsorted(cumulative, first, side="right"))
        bin_second = int(np.searchsorted(cumulative, second, side="right"))
        if bin_first > 0:
            below = int(cumulative[bin_first - 1])
        key_first, key_second = base + bin_first, base + bin_second
        if key_first != key_second:
            # The first wanted value closes its bucket; the second is the smallest value
            # of the next non-empty bucket.
            in_first = _with_key(points, key_first, shift, max_block_bytes)
            in_second = _with_key(points, key_second, shift, max_block_bytes)
            return (
                max(float(v.max()) for v in in_first if v.size),
                min(float(v.min()) for v in in_second if v.size),
            )
        if shift == 0:
            value = float(np.array([key_first], dtype=np.int64).view(np.float64)[0])
            return value, value
        if int(histogram[bin_first]) <= budget:
            chunks = list(_with_key(points, key_first, shift, max_block_bytes))
            offsets = (first - below, second - below)
            values = np.partition(np.concatenate(chunks), offsets)
            return float(values[offsets[0]]), float(values[offsets[1]])
        finer = max(shift - _DIGIT_BITS, 0)
        width = shift - finer
        histogram = np.zeros(1 << width, dtype=np.int64)
        for values in _with_key(points, key_first, shift, max_block_bytes):
            digits = (_keys(values) >> finer) & ((1 << width) - 1)
            histogram += np.bincount(digits, minlength=histogram.size)
        base, shift = key_first << width, finer


def energy_distance_from_sums(
    cross: float, within_x: float, within_y: float, n: int, m: int, *, unbiased: bool = True
) -> float:
    """Energy distance from the distance sums of :func:`distance_sum` and friends.

    Parameters
    ----------
    cross
        ``distance_sum(x, y)``.
    within_x, within_y
        ``within_distance_sum(x)`` and ``within_distance_sum(y)`` (ordered pairs).
    n, m
        Number of points in ``x`` and ``y``.
    unbiased
        Divide the within sums by ``n (n - 1)`` (U-statistic) rather than ``n^2``
        (V-statistic, which counts the zero self-distances).

    Returns
    -------
    float
        ``2 E|X - Y| - E|X - X'| - E|Y - Y'|``.

    Raises
    ------
    DegenerateInput
        If a cloud is too small: fewer than 2 points for the unbiased form, none for
        the plug-in form.

    """
    _check_sizes(n, m, unbiased)
    if unbiased:
        return 2.0 * cross / (n * m) - within_x / (n * (n - 1)) - within_y / (m * (m - 1))
    return 2.0 * cross / (n * m) - within_x / (n * n) - within_y / (m * m)


def mmd_from_sums(
    cross: float, within_x: float, within_y: float, n: int, m: int, *, unbiased: bool = True
) -> float:
    """Squared MMD from the RBF kernel sums of :func:`kernel_sum` and friends.

    Parameters
    ----------
    cross
        ``kernel_sum(x, y, bandwidth)``.
    within_x, within_y
        ``within_kernel_sum(x, bandwidth)`` and ``within_kernel_sum(y, bandwidth)``
        (ordered pairs, diagonal excluded).
    n, m
        Number of points in ``x`` and ``y``.
    unbiased
        U-statistic (diagonal left out, divided by ``n (n - 1)``) rather than the
        V-statistic (diagonal ``k(x, x) = 1`` included, divided by ``n^2``).

    Returns
    -------
    float
        ``E k(X, X') + E k(Y, Y') - 2 E k(X, Y)``.

    Raises
    ------
    DegenerateInput
        If a cloud is too small: fewer than 2 points for the unbiased form, none for
        the plug-in form.

    """
    _check_sizes(n, m, unbiased)
    if unbiased:
        return within_x / (n * (n - 1)) + within_y / (m * (m - 1)) - 2.0 * cross / (n * m)
    return (within_x + n) / (n * n) + (within_y + m) / (m * m) - 2.0 * cross / (n * m)


def _threads_of(ctx: PerturbationContext | None) -> Threads:
    """The run's threads of a metric call, or the call's own (one BLAS look-up per call)."""
    threads = None if ctx is None else ctx.threads
    return threads if threads is not None else Threads()


def _check_sizes(n: int, m: int, unbiased: bool) -> None:
    needed = 2 if unbiased else 1
    if n < needed or m < needed:
        form = "the unbiased estimate" if unbiased else "the estimate"
        raise DegenerateInput(
            f"{form} needs at least {needed} cell(s) per population; got {n} true and "
            f"{m} predicted cell(s)"
        )


# ---------------------------------------------------------------------------- metrics


@METRICS.register(
    "energy_distance",
    description="energy distance between cell populations (unbiased within-sample terms)",
    representation="population",
    scope="perturbation",
    better="lower",
    perfect=0.0,
)
def energy_distance(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    ctx: PerturbationContext | None = None,
    *,
    unbiased: bool = True,
) -> float:
    """Energy distance ``2 E|X - Y| - E|X - X'| - E|Y - Y'|`` with Euclidean ``|.|``.

    ``E|X - Y|`` is the mean over all ``n m`` pairs. With ``unbiased=True`` the within
    terms are means over ordered pairs ``i != j`` (U-statistics), so the estimate is
    unbiased for the population energy distance and can be slightly negative when the
    populations do not differ. With ``unbiased=False`` they are means over all ``n^2``
    pairs (the plug-in V-statistic), which is never negative and is exactly 0 for
    identical samples. Symmetric in ``gt`` and ``pred``.

    Parameters
    ----------
    gt, pred
        Cells x features arrays (dense or scipy sparse) with the same features.
    ctx
        The perturbation's context; its ``threads`` (a run's) hold BLAS to one thread.
    unbiased
        Use the unbiased within-sample terms.

    Returns
    -------
    float
        Lower is better, 0 is perfect; unbounded above. The unbiased form may be below
        0, which means no difference detectable at this sample size.

    Raises
    ------
    DegenerateInput
        If either population has fewer than 2 cells (unbiased) or none (plug-in), or
        the input has non-finite values. An all-zero population is not degenerate.

    """
    x, y = _cloud_pair(gt, pred)
    _check_sizes(x.shape[0], y.shape[0], unbiased)
    x, y = _centred(x, y)
    threads = _threads_of(ctx)
    (cross,) = pair_sums(x, y, [SQRT], threads=threads)
    within_x = 2.0 * pair_sums(x, None, [SQRT], threads=threads)[0]
    within_y = 2.0 * pair_sums(y, None, [SQRT], threads=threads)[0]
    return energy_distance_from_sums(
        cross, within_x, within_y, x.shape[0], y.shape[0], unbiased=unbiased
    )


@METRICS.register(
    "mmd",
    description="squared maximum mean discrepancy, RBF kernel, median-heuristic bandwidth",
    representation="population",
    scope="perturbation",
    better="lower",
    perfect=0.0,
)
def mmd(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    ctx: PerturbationContext | None = None,
    *,
    bandwidth: float | str | None = None,
    unbiased: bool = True,
) -> float:
    """Squared maximum mean discrepancy with the RBF kernel.

    ``MMD^2 = E k(X, X') + E k(Y, Y') - 2 E k(X, Y)`` with
    ``k(a, b) = exp(-||a - b||^2 / (2 sigma^2))``. With ``unbiased=True`` (default) the
    within terms are means over ordered pairs ``i != j`` (Gretton et al. 2012, the
    U-statistic), which can be slightly negative; with ``unbiased=False`` the diagonal
    is included (V-statistic): never negative, exactly 0 for identical samples.
    Symmetric in ``gt`` and ``pred``.

    Parameters
    ----------
    gt, pred
        Cells x features arrays (dense or scipy sparse) with the same features.
    ctx
        The perturbation's context; its ``threads`` (a run's) hold BLAS to one thread.
    bandwidth
        Kernel width ``sigma``. ``None`` (default) uses the median heuristic: the
        median of the Euclidean distances ``||z_i - z_j||`` over pairs ``i < j`` of
        distinct points of the pooled sample ``z = gt ∪ pred``
        (:func:`median_pairwise_distance`). ``"truth"`` uses the same heuristic on
        ``gt`` alone, so that every prediction scored against one truth is measured
        with the same kernel (and the cost does not grow with the size of ``pred``).
        When no two points differ every kernel value is 1 whatever the width, and
        sigma = 1 is used.
    unbiased
        Use the unbiased within-sample terms.

    Returns
    -------
    float
        Lower is better, 0 is perfect; at most 2. The unbiased form may be below 0,
        which means no difference detectable at this sample size.

    Raises
    ------
    DegenerateInput
        If either population has fewer than 2 cells (unbiased) or none (plug-in), or
        the input has non-finite values. An all-zero population is not degenerate.
    ValueError
        If ``bandwidth`` is given and is not a positive finite number.

    """
    x, y = _cloud_pair(gt, pred)
    _check_sizes(x.shape[0], y.shape[0], unbiased)
    threads = _threads_of(ctx)
    if bandwidth is None:
        sigma = median_pairwise_distance(np.vstack([x, y]), threads=threads) or 1.0
    elif bandwidth == "truth":
        sigma = median_pairwise_distance(x, threads=threads) or 1.0
    elif isinstance(bandwidth, str):
        raise ValueError(f"bandwidth must be None, 'truth' or a number, got {bandwidth!r}")
    else:
        sigma = _check_bandwidth(bandwidth)
    x, y = _centred(x, y)
    kernel = rbf_transform(sigma)
    (cross,) = pair_sums(x, y, [kernel], threads=threads)
    within_x = 2.0 * pair_sums(x, None, [kernel], threads=threads)[0]
    within_y = 2.0 * pair_sums(y, None, [kernel], threads=threads)[0]
    return mmd_from_sums(cross, within_x, within_y, x.shape[0], y.shape[0], unbiased=unbiased)


def check_sinkhorn_options(
    blur: float = 0.05,
    scaling: float = 0.9,
    backend: str = "tensorized",
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
) -> None:
    """Check the options of :func:`sinkhorn` before a run (the registry's ``check``).

    Parameters
    ----------
    blur, scaling, backend, tol, max_iter
        As for :func:`sinkhorn`.

    Raises
    ------
    ValueError
        Naming the first invalid option.

    """
    if not (isinstance(blur, (int, float)) and math.isfinite(blur) and blur > 0):
        raise ValueError(f"blur must be a positive finite number, got {blur!r}")
    if not (isinstance(scaling, (int, float)) and 0 < scaling < 1):
        raise ValueError(f"scaling must lie in (0, 1), got {scaling!r}")
    check_stopping(tol, max_iter)
    if backend != "tensorized" and tol is not None:
        raise ValueError(
            f"backend {backend!r} stops at the end of the annealing (geomloss); pass tol=None"
        )


@METRICS.register(
    "sinkhorn",
    description="debiased Sinkhorn estimate of the 2-Wasserstein distance",
    representation="population",
    scope="perturbation",
    better="lower",
    perfect=0.0,
    check=check_sinkhorn_options,
)
def sinkhorn(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    ctx: PerturbationContext | None = None,
    *,
    blur: float = 0.05,
    scaling: float = 0.9,
    backend: str = "tensorized",
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
) -> float:
    """Debiased Sinkhorn estimate of the 2-Wasserstein distance, ``sqrt(2 S_eps)``.

    ``S_eps`` is the debiased Sinkhorn divergence
    ``OT_eps(a, b) - (OT_eps(a, a) + OT_eps(b, b)) / 2`` between the uniform empirical
    measures as geomloss's ``SamplesLoss("sinkhorn", p=2, debias=True)`` defines and
    computes it (epsilon-scaling annealing, symmetric updates), in float64, and with
    ``tol`` iterated further at the final temperature ``eps = blur^2`` until it
    settles: the annealing alone leaves ``S_eps`` up to 2% low on real screens. On the CPU it is
    solved by :func:`scperteval.kernels.sinkhorn.debiased_sinkhorn`, compiled without
    torch; with a torch device in ``ctx``, by the same solver on torch tensors (equal
    to the NumPy one to the stopping tolerance). With ``tol=None`` the iterations stop
    at the end of the annealing, as geomloss's do (equal to geomloss to rounding,
    tested; on a torch device geomloss itself runs).
    Its ground cost is ``||x - y||^2 / 2``, hence the factor 2: the result is in the
    units of a Euclidean distance and tends to W2 as ``blur`` goes to 0. For two
    samples that differ by a translation ``t`` it equals ``||t||`` exactly.

    Parameters
    ----------
    gt, pred
        Cells x features arrays (dense or scipy sparse) with the same features.
    ctx
        The perturbation's context; its ``device`` (a torch device) is where the
        problem is solved, the CPU when ``None``.
    blur
        Entropic blur in feature units (``eps = blur^2``); geomloss's default. Smaller
        is closer to W2 and slower.
    scaling
        Ratio of successive blurs in geomloss's annealing, in (0, 1); 0.9 is more
        accurate than geomloss's default 0.5 at a few times the iterations.
    backend
        ``"tensorized"`` (default) holds the ``n x m`` cost matrices in memory.
        ``"online"`` and ``"multiscale"`` are geomloss's (they need torch, geomloss
        and pykeops, and ``tol=None``: geomloss stops at the end of the annealing).
    tol
        Stopping tolerance at the final temperature, in units of ``eps``: stop once
        five consecutive iterations each change ``S_eps`` by less than
        ``tol * eps`` (see :func:`scperteval.kernels.sinkhorn_loop.converge`).
        :data:`~scperteval.kernels.sinkhorn_loop.DEFAULT_TOL` (1e-7) gives values
        within 1e-6 relative of a fully converged solver on real
        perturbation-vs-control pairs (measured: ``benchmarks/bench_sinkhorn.py``), at
        about 15 times the annealing's time (50 times for 2,000-cell populations).
        ``None`` (default): no iterations after the annealing (geomloss's values).
    max_iter
        Cap on the iterations at the final temperature.

    Returns
    -------
    float
        In [0, inf); lower is better, 0 is perfect. When every cell of both samples
        coincides, the result is 0 without solving anything (the annealing schedule
        starts from the samples' diameter and fails on a diameter of 0). A divergence
        that is negative by rounding is reported as 0.

    Raises
    ------
    MissingExtraError
        If a torch device or a geomloss-only ``backend`` is asked for and torch or
        geomloss (the ``ot`` extra) is not installed.
    DegenerateInput
        If either population has no cells or the input has non-finite values.
    ValueError
        If ``blur`` is not positive, ``scaling`` is outside (0, 1), ``tol`` is not
        positive, ``max_iter`` is not a positive integer, or a geomloss-only
        ``backend`` is asked for with a ``tol``.


    Notes
    -----
    geomloss runs a few hundred small tensor operations per call; on the CPU torch
    runs them on one thread here (restored afterwards), as waking a pool of threads
    for each of them is slower than the work itself, by far on a busy machine.

    """
    check_sinkhorn_options(blur, scaling, backend, tol, max_iter)
    x, y = _cloud_pair(gt, pred)
    _check_sizes(x.shape[0], y.shape[0], unbiased=False)
    device = None if ctx is None else ctx.device
    if backend != "tensorized" or device is not None:
        try:
            import torch
            from geomloss import SamplesLoss
        except ImportError:
            raise MissingExtraError("Sinkhorn distance", "ot", "geomloss") from None
    x, y = _centred(x, y)
    pooled_range = np.maximum(x.max(axis=0), y.max(axis=0)) - np.minimum(
        x.min(axis=0), y.min(axis=0)
    )
    if not pooled_range.any():
        return 0.0
    diameter = float(np.linalg.norm(pooled_range))
    if backend == "tensorized" and device is None:
        from scperteval.kernels.sinkhorn import debiased_sinkhorn

        divergence = debiased_sinkhorn(
            x, y, blur, scaling, diameter=diameter, tol=tol, max_iter=max_iter
        )
        return math.sqrt(2.0 * max(divergence, 0.0))
    if tol is not None:
        from scperteval.metrics._sinkhorn_torch import torch_divergence

        target = torch.device(device if device is not None else "cpu")
        on_cpu = target.type == "cpu"
        with Threads.single_threaded_torch(torch) if on_cpu else contextlib.nullcontext():
            divergence = torch_divergence(
                x,
                y,
                blur=blur,
                scaling=scaling,
                diameter=diameter,
                tol=tol,
                max_iter=max_iter,
                device=target,
            )
        return math.sqrt(2.0 * max(divergence, 0.0))
    loss = SamplesLoss("sinkhorn", p=2, blur=blur, scaling=scaling, debias=True, backend=backend)
    if device is not None and torch.device(device).type != "cpu":
        with torch.no_grad():
            divergence = float(
                loss(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)).item()
            )
        return math.sqrt(2.0 * max(divergence, 0.0))
    with torch.no_grad(), Threads.single_threaded_torch(torch):
        divergence = float(loss(torch.from_numpy(x), torch.from_numpy(y)).item())
    return math.sqrt(2.0 * max(divergence, 0.0))
