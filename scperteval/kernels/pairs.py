"""Sums over pairs of points of their distances and RBF kernels, tiled, in NumPy.

The one implementation of the pair sums that the population metrics
(:mod:`scperteval.metrics.population`), the population fast path
(:mod:`scperteval.engine.fastpath`) and the distances (:mod:`scperteval.distances`)
use; the torch backend (:class:`scperteval.torch_backend.pairs.TorchPairs`) gives
the same interface on a device. The public interface:

- :func:`pair_sums`: sums over the pairs of one or two clouds of each of several
  transforms (:data:`SQRT`, :func:`rbf_transform`) of the squared distances, in one pass;
- :class:`StoredPairs`: a cloud's within pairs kept, summed again at other bandwidths;
- :func:`centred`: clouds shifted by their pooled mean, as every caller shifts them.

The median heuristic of the RBF bandwidth is :mod:`scperteval.kernels.median`; the
fast path reaches both through a backend (:mod:`scperteval.engine.pairs`).

Pairwise distances are computed with BLAS as ``||a||^2 + ||b||^2 - 2 a.b`` in float64,
in tiles whose size is bounded by ``max_block_bytes`` (and small enough to stay in cache
while a tile is transformed and summed). Callers shift the clouds by their pooled mean
first (distances do not change under a common shift, and the expansion loses less
precision near the origin). Squared distances within ``1e-12 (||a||^2 + ||b||^2)`` of
zero are rounding noise of the expansion and are set to 0, so coinciding cells are at
distance 0 exactly. Each tile's values are transformed (square root, kernel) and summed
while in cache; the tile sums are added in a fixed order, so a value never depends on
threads. The matrix products run on one BLAS thread (the run's
:meth:`~scperteval.kernels.threads.Threads.single_threaded_blas`): with products this
thin, more threads cost more in waking and waiting than they save (on a busy machine,
many times more), and the result does not depend on the machine's thread count either.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from scperteval.kernels.threads import Threads

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "SQRT",
    "PairTransform",
    "StoredPairs",
    "centred",
    "check_bandwidth",
    "check_transforms",
    "pair_sums",
    "rbf_transform",
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
# Arrays of one tile's size alive at once: the tile, a temporary and a mask.
_ARRAYS_PER_BLOCK = 3
# Values per tile of the summed pairwise terms: a tile, its transform and a mask fit
# in cache together (2 MiB per float64 array).
_TILE_ELEMENTS = 1 << 18
_TILE_COLUMNS = 2048


# --------------------------------------------------------------------------- blocks


def _row_norms(points: Float64Array) -> Float64Array:
    return np.einsum("ij,ij->i", points, points)


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
    from scperteval.kernels.distances import complete_distances
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
                root = None if root_buffer is None else root_buffer[:count].reshape(shape)
                complete_distances(d2, sq_a, sq_b, _SNAP_RTOL, root)
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
    check_transforms(transforms)
    totals = [0.0] * len(transforms)
    if not transforms:
        return totals
    want_root = any(kind == "sqrt" for kind, _ in transforms)
    # Every "sqrt" transform reads the tiles' roots, so no work buffer is needed.
    for d2, root, offset, bound in _pair_tiles(x, y, want_root, max_block_bytes, threads):
        _add_tile_sums(totals, d2, root, offset, transforms, np.empty(0), bound)
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
        check_transforms(transforms)
        totals = [0.0] * len(transforms)
        work_buffer = np.empty(self._work_size)
        for d2, offset in self._tiles:
            _add_tile_sums(totals, d2, None, offset, transforms, work_buffer)
        return totals
