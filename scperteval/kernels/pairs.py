"""Sums over pairs of points of their distances and RBF kernels, tiled, in NumPy.

The one implementation of the pair sums that the population metrics
(:mod:`scperteval.metrics.population`), the population fast path
(:mod:`scperteval.engine.fastpath`) and the distances (:mod:`scperteval.distances`)
use; the torch backend (:class:`scperteval.torch_backend.pairs.TorchPairs`) gives
the same interface on a device. The public interface:

- :func:`pair_sums`: sums over the pairs of one or two clouds of each of several
  transforms (:data:`SQRT`, :func:`rbf_transform`) of the squared distances, in one pass;
- :class:`StoredPairs`: a cloud's within pairs kept, summed again at other bandwidths;
- :func:`median_distance`: the median heuristic (exact, in bounded memory);
- :func:`centred`: clouds shifted by their pooled mean, as every caller shifts them;
- :class:`PairBackend` and :class:`NumpyPairs`: what the fast path asks of a backend;
- :func:`single_threaded_blas`: the one-thread BLAS limit the tiles run under.

Pairwise distances are computed with BLAS as ``||a||^2 + ||b||^2 - 2 a.b`` in float64,
in tiles whose size is bounded by ``max_block_bytes`` (and small enough to stay in cache
while a tile is transformed and summed). Callers shift the clouds by their pooled mean
first (distances do not change under a common shift, and the expansion loses less
precision near the origin). Squared distances within ``1e-12 (||a||^2 + ||b||^2)`` of
zero are rounding noise of the expansion and are set to 0, so coinciding cells are at
distance 0 exactly. Each tile's values are transformed (square root, kernel) and summed
while in cache; the tile sums are added in a fixed order, so a value never depends on
threads. The matrix products run on one BLAS thread: with products this thin, more
threads cost more in waking and waiting than they save (on a busy machine, many times
more), and the result does not depend on the machine's thread count either.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "SQRT",
    "NumpyPairs",
    "PairBackend",
    "PairTransform",
    "StoredPairs",
    "StoredSums",
    "ArrayOps",
    "median_of_positive",
    "centred",
    "check_bandwidth",
    "check_transforms",
    "median_distance",
    "pair_sums",
    "rbf_transform",
    "single_threaded_blas",
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


def centred(*clouds: Float64Array) -> list[Float64Array]:
    """Shift every cloud by the mean of all of them together.

    Parameters
    ----------
    *clouds
        Float64 point clouds (rows are points) with the same number of columns.

    Returns
    -------
    list of numpy.ndarray
        New arrays, one per cloud (the clouds themselves when all are empty).

    """
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


def check_bandwidth(bandwidth: float) -> float:
    """``bandwidth`` as a float, checked.

    Parameters
    ----------
    bandwidth
        An RBF kernel width.

    Returns
    -------
    float
        The width.

    Raises
    ------
    ValueError
        If it is not a positive finite number.

    """
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
    sigma = check_bandwidth(bandwidth)
    return ("rbf", -1.0 / (2.0 * sigma * sigma))


_BLAS_LOCK = threading.Lock()
_blas_state: dict[str, Any] = {"users": 0, "limiter": None, "controller": None}


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run the enclosed matrix products on one BLAS thread, restoring the setting after.

    Nested and concurrent uses share one limit: it is set by the first user and
    restored when the last one leaves. For thin products (tens of features) waking
    BLAS threads costs more than it saves; one thread also makes a product with many
    features independent of the machine's thread count (BLAS may split the sum over
    features between threads).
    """
    with _BLAS_LOCK:
        if _blas_state["users"] == 0:
            controller = _blas_state["controller"]
            if controller is None:
                try:
                    from threadpoolctl import ThreadpoolController
                except ImportError:  # pragma: no cover - shipped with scikit-learn
                    controller = False
                else:
                    controller = ThreadpoolController()
                _blas_state["controller"] = controller
            if controller:
                _blas_state["limiter"] = controller.limit(limits=1, user_api="blas")
        _blas_state["users"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _blas_state["users"] -= 1
            if _blas_state["users"] == 0 and _blas_state["limiter"] is not None:
                _blas_state["limiter"].restore_original_limits()
                _blas_state["limiter"] = None


def _tile_shape(n_rows: int, n_columns: int, max_block_bytes: int) -> tuple[int, int]:
    budget = max(1, min(_TILE_ELEMENTS, int(max_block_bytes) // (8 * _ARRAYS_PER_BLOCK)))
    columns = max(1, min(n_columns, _TILE_COLUMNS, budget))
    rows = max(1, min(n_rows, budget // columns))
    return rows, columns


def check_transforms(transforms: Sequence[PairTransform]) -> None:
    """Raise ``ValueError`` for a transform that is neither ``"sqrt"`` nor ``"rbf"``.

    Parameters
    ----------
    transforms
        :data:`SQRT` and :func:`rbf_transform` values.

    """
    for kind, _ in transforms:
        if kind not in ("sqrt", "rbf"):
            raise ValueError(f"unknown pair transform {kind!r}")


def _pair_tiles(
    x: Float64Array, y: Float64Array | None, want_root: bool, max_block_bytes: int
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
    with single_threaded_blas():
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

    Returns
    -------
    list of float
        One sum per transform, in order.

    """
    check_transforms(transforms)
    totals = [0.0] * len(transforms)
    if not transforms:
        return totals
    want_root = any(kind == "sqrt" for kind, _ in transforms)
    rows, columns = _tile_shape(x.shape[0], (x if y is None else y).shape[0], max_block_bytes)
    work_buffer = np.empty(rows * columns)
    for d2, root, offset, bound in _pair_tiles(x, y, want_root, max_block_bytes):
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

    """

    def __init__(self, x: Float64Array, *, max_block_bytes: int = DEFAULT_BLOCK_BYTES) -> None:
        self._tiles = [
            (d2.copy(), offset) for d2, _, offset, _ in _pair_tiles(x, None, False, max_block_bytes)
        ]
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
        check_transforms(transforms)
        totals = [0.0] * len(transforms)
        work_buffer = np.empty(self._work_size)
        for d2, offset in self._tiles:
            _add_tile_sums(totals, d2, None, offset, transforms, work_buffer)
        return totals


def median_distance(z: Float64Array, *, max_block_bytes: int = DEFAULT_BLOCK_BYTES) -> float:
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
        Finite float64 point cloud (rows are points); shifted by its mean here.
    max_block_bytes
        Memory bound for one block of pairwise values and for the values kept.

    Returns
    -------
    float
        The median; 0.0 when no two points differ.

    """
    (points,) = centred(np.ascontiguousarray(z, dtype=np.float64))
    with single_threaded_blas():
        return median_of_positive(
            lambda: _positive_within(points, max_block_bytes),
            max(1, int(max_block_bytes) // 8),
            ArrayOps(),
            _FIRST_DIGIT_BITS,
        )


def _positive_within(points: Float64Array, max_block_bytes: int) -> Iterator[Float64Array]:
    """The positive squared distances of the pairs ``i < j`` of ``points``, block by block."""
    for block in _within_pairs(points, max_block_bytes):
        yield block[block > 0]


class ArrayOps:
    """The array operations of :func:`median_of_positive`, on NumPy float64 arrays.

    Another library's arrays (torch tensors on a device) take a subclass: the
    selection itself only compares keys, counts digits and moves small arrays to
    NumPy.
    """

    #: Bits of the values' floating-point type.
    key_bits = 64

    def keys(self, values: Any) -> Any:
        """Bit patterns of positive floats as int64; they order exactly as the values do."""
        return np.ascontiguousarray(values).view(np.int64)

    def histogram(self, digits: Any, size: int) -> Any:
        """Occurrences of each of the digits ``0 .. size - 1``."""
        return np.bincount(digits, minlength=size)

    def host(self, values: Any) -> np.ndarray:
        """``values`` as a NumPy array."""
        return np.asarray(values)


def median_of_positive(
    passes: Callable[[], Iterable[Any]], budget: int, ops: ArrayOps, first_digit_bits: int
) -> float:
    """``(sqrt(low) + sqrt(high)) / 2`` for the middle values of positive squared distances.

    Exact, in bounded memory: the values are kept while there are at most ``budget``
    of them; past that, a radix selection on their bit patterns (monotone in the
    value for positive floats) counts them per leading digit, one pass per digit,
    until the bucket holding the middle values fits in the budget.

    Parameters
    ----------
    passes
        Each call starts a pass over the values, in chunks (1-D arrays of ``ops``'s
        library); every pass yields the same values.
    budget
        Values held at once, at most.
    ops
        The array operations (:class:`ArrayOps` for NumPy).
    first_digit_bits
        Bits of the key resolved by the first pass.

    Returns
    -------
    float
        The median of the square roots (the mean of the two middle ones for an even
        count); 0.0 when there are no values.

    """
    shift = ops.key_bits - first_digit_bits
    # The histogram is started only once the values outgrow the budget (it then
    # counts the values kept so far too).
    histogram: Any = None
    kept: list[Any] = []
    count = 0
    for positive in passes():
        count += int(positive.shape[0])
        if histogram is None and count <= budget:
            kept.append(positive)
            continue
        for values in [*kept, positive]:
            counted = ops.histogram(ops.keys(values) >> shift, 1 << first_digit_bits)
            histogram = counted if histogram is None else histogram + counted
        kept = []
    if count == 0:
        return 0.0
    ranks = ((count - 1) // 2, count // 2)
    if histogram is None:
        values = np.partition(np.concatenate([ops.host(v) for v in kept]), ranks)
        low, high = float(values[ranks[0]]), float(values[ranks[1]])
    else:
        low, high = _radix_select(passes, ranks, ops.host(histogram), shift, budget, ops)
    return 0.5 * (math.sqrt(low) + math.sqrt(high))


def _with_key(
    passes: Callable[[], Iterable[Any]], ops: ArrayOps, key: int, shift: int
) -> Iterator[Any]:
    """The values whose bit pattern starts with ``key`` (above ``shift``)."""
    for values in passes():
        yield values[(ops.keys(values) >> shift) == key]


def _radix_select(
    passes: Callable[[], Iterable[Any]],
    ranks: tuple[int, int],
    histogram: npt.NDArray[np.int64],
    shift: int,
    budget: int,
    ops: ArrayOps,
) -> tuple[float, float]:
    """Order statistics ``ranks`` (0-based, adjacent) of the values of ``passes``.

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
            in_first = _with_key(passes, ops, key_first, shift)
            in_second = _with_key(passes, ops, key_second, shift)
            return (
                max(float(v.max()) for v in in_first if v.shape[0]),
                min(float(v.min()) for v in in_second if v.shape[0]),
            )
        if shift == 0:
            pattern = np.array([key_first], dtype=np.int64).astype(f"int{ops.key_bits}")
            value = float(pattern.view(f"float{ops.key_bits}")[0])
            return value, value
        if int(histogram[bin_first]) <= budget:
            chunks = [ops.host(v) for v in _with_key(passes, ops, key_first, shift)]
            offsets = (first - below, second - below)
            values = np.partition(np.concatenate(chunks), offsets)
            return float(values[offsets[0]]), float(values[offsets[1]])
        finer = max(shift - _DIGIT_BITS, 0)
        width = shift - finer
        counted: Any = None
        for values in _with_key(passes, ops, key_first, shift):
            digits = (ops.keys(values) >> finer) & ((1 << width) - 1)
            more = ops.histogram(digits, 1 << width)
            counted = more if counted is None else counted + more
        histogram = ops.host(counted)
        base, shift = key_first << width, finer


class StoredSums(Protocol):
    """A cloud's stored pairwise distances (:class:`StoredPairs` or a device's)."""

    def sums(self, transforms: Sequence[PairTransform]) -> list[float]:
        """Sums over the pairs ``i < j`` of each transform."""
        ...  # pragma: no cover


class PairBackend(Protocol):
    """What the population fast path needs from a backend: :class:`NumpyPairs` or torch's."""

    @property
    def name(self) -> str:
        """Short description written to ``run.json``."""
        ...  # pragma: no cover

    def sums(
        self, x: Float64Array, y: Float64Array | None, transforms: Sequence[PairTransform]
    ) -> list[float]:
        """Sums over pairs of each transform (see :func:`pair_sums`)."""
        ...  # pragma: no cover

    def store(self, x: Float64Array) -> StoredSums:
        """Stored pairwise distances of ``x``."""
        ...  # pragma: no cover

    def store_nbytes(self, n_points: int) -> int:
        """Memory a store of ``n_points`` points holds, in bytes."""
        ...  # pragma: no cover

    def median(self, z: Float64Array) -> float:
        """Median of the positive pairwise distances of the rows of ``z``."""
        ...  # pragma: no cover


class NumpyPairs:
    """The reference backend: NumPy matrix products and numba tile kernels."""

    name = "numpy"

    def sums(
        self, x: Float64Array, y: Float64Array | None, transforms: Sequence[PairTransform]
    ) -> list[float]:
        """Sums over pairs of each transform (:func:`pair_sums`)."""
        return pair_sums(x, y, transforms)

    def store(self, x: Float64Array) -> StoredPairs:
        """Stored pairwise distances of ``x`` (a :class:`StoredPairs`)."""
        return StoredPairs(x)

    def store_nbytes(self, n_points: int) -> int:
        """Memory a store of ``n_points`` points holds, in bytes."""
        return StoredPairs.nbytes_for(n_points)

    def median(self, z: Float64Array) -> float:
        """The median heuristic (:func:`median_distance`)."""
        return median_distance(z)
