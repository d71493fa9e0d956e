"""The median heuristic: the exact median of the positive distances within a cloud.

:func:`median_distance` is the RBF bandwidth rule of the MMD metric, the fast
path and the distances. The selection itself, :func:`median_of_positive`, reads
the squared distances in chunks from any library (NumPy here, torch tensors on a
device for :class:`scperteval.torch_backend.pairs.TorchPairs`) through a few
:class:`ArrayOps`, so that one algorithm serves both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from scperteval.kernels.pairs import (
    _ARRAYS_PER_BLOCK,
    _SNAP_RTOL,
    DEFAULT_BLOCK_BYTES,
    _row_norms,
    centred,
)
from scperteval.kernels.threads import Threads

__all__ = ["ArrayOps", "median_distance", "median_of_positive"]

Float64Array = npt.NDArray[np.float64]

# Bits of the float64 pattern resolved by the first and by each later pass of the
# exact median selection.
_FIRST_DIGIT_BITS = 20
_DIGIT_BITS = 16


# The selection reads the squared distances in row blocks of its own rather than in the
# tiles of ``pair_sums``: matrix products of other shapes may round differently in the
# last bit, and the median, hence every median-heuristic bandwidth, would change.


def _rows_per_block(n_columns: int, max_block_bytes: int) -> int:
    per_row = 8 * _ARRAYS_PER_BLOCK * max(n_columns, 1)
    return max(1, int(max_block_bytes) // per_row)


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


def median_distance(
    z: Float64Array, *, max_block_bytes: int = DEFAULT_BLOCK_BYTES, threads: Threads | None = None
) -> float:
    """Median of the positive Euclidean distances between the rows of ``z``.

    The median heuristic of
    :func:`scperteval.metrics.population.median_pairwise_distance` (pairs ``i < j``
    of points that differ; the mean of the two middle values for an even count),
    exact and in bounded memory (:func:`median_of_positive`).

    Parameters
    ----------
    z
        Finite float64 point cloud (rows are points); shifted by its mean here.
    max_block_bytes
        Memory bound for one block of pairwise values and for the values kept.
    threads
        As for :func:`~scperteval.kernels.pairs.pair_sums`.

    Returns
    -------
    float
        The median; 0.0 when no two points differ.

    """
    (points,) = centred(np.ascontiguousarray(z, dtype=np.float64))
    with (threads or Threads()).single_threaded_blas():
        return median_of_positive(
            lambda: (block[block > 0] for block in _within_pairs(points, max_block_bytes)),
            max(1, int(max_block_bytes) // 8),
            ArrayOps(),
            _FIRST_DIGIT_BITS,
        )


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
