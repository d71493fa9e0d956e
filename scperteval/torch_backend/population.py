"""Energy distance and RBF MMD between cell populations, computed with torch.

The definitions are those of :mod:`scperteval.metrics.population` (the NumPy
reference): same estimators, same median-heuristic bandwidth, same treatment of
coinciding cells, same errors. In float64 the results agree with the reference to
rounding (about 1e-13 relative); float32 is faster on a GPU and is accurate to the
bound given in ``docs/torch.md``.

Computation: both clouds are shifted by their pooled mean in float64, then cast to
the computation dtype. Squared distances are computed as ``||a||^2 + ||b||^2 - 2 a.b``
(one matrix product per block) in row blocks whose size is bounded by
``max_block_bytes``; values within ``rtol (||a||^2 + ||b||^2)`` of zero are set to 0,
with ``rtol = 1e-12`` in float64 (the reference's rule) and ``rtol = 100 eps ~ 1.2e-5``
in float32, so that coinciding cells are at distance 0 exactly. Block sums are
accumulated in float64 whatever the computation dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from types import MappingProxyType
from typing import Any

import torch

from scperteval.metrics._common import DegenerateInput
from scperteval.torch_backend._common import DeviceLike, as_cloud, resolve_device, resolve_dtype

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "energy_distance",
    "mmd",
    "median_pairwise_distance",
]

#: Memory bound for one block of pairwise values and its temporaries, in bytes.
DEFAULT_BLOCK_BYTES = 64 * 2**20

# Snapping tolerance: below this fraction of ||a||^2 + ||b||^2 a squared distance is
# indistinguishable from the cancellation error of the expansion.
_SNAP_RTOL_FLOAT64 = 1e-12
_SNAP_EPS_FACTOR = 100.0
# Block-sized tensors alive at once: the block, the snapping bound, a mask, a copy.
_TENSORS_PER_BLOCK = 4
# Bits of the key resolved by the first and by each later pass of the median selection.
_FIRST_DIGIT_BITS = MappingProxyType({torch.float64: 20, torch.float32: 16})
_DIGIT_BITS = 16
_KEY_DTYPE = MappingProxyType({torch.float64: torch.int64, torch.float32: torch.int32})
_KEY_BITS = MappingProxyType({torch.float64: 64, torch.float32: 32})

Transform = Callable[[torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------- blocks


class _Pairs:
    """Blocked squared distances of point clouds in one dtype on one device."""

    def __init__(self, dtype: torch.dtype, max_block_bytes: int) -> None:
        if int(max_block_bytes) < 1:
            raise ValueError(f"max_block_bytes must be positive, got {max_block_bytes!r}")
        self.dtype = dtype
        self.max_block_bytes = int(max_block_bytes)
        eps = torch.finfo(dtype).eps
        self.rtol = max(_SNAP_RTOL_FLOAT64, _SNAP_EPS_FACTOR * eps)
        self.itemsize = torch.empty((), dtype=dtype).element_size()

    def rows_per_block(self, n_columns: int) -> int:
        per_row = self.itemsize * _TENSORS_PER_BLOCK * max(n_columns, 1)
        return max(1, self.max_block_bytes // per_row)

    def squared(
        self, a: torch.Tensor, sq_a: torch.Tensor, b: torch.Tensor, sq_b: torch.Tensor
    ) -> torch.Tensor:
        d2 = (-2.0 * a) @ b.T
        d2 += sq_a[:, None]
        d2 += sq_b[None, :]
        bound = sq_a[:, None] + sq_b[None, :]
        bound *= self.rtol
        return d2.masked_fill_(d2 <= bound, 0.0)

    def cross(self, x: torch.Tensor, y: torch.Tensor) -> Iterator[torch.Tensor]:
        """Blocks of squared distances covering every pair ``(x_i, y_j)`` once."""
        sq_x, sq_y = _row_norms(x), _row_norms(y)
        rows = self.rows_per_block(y.shape[0])
        for start in range(0, x.shape[0], rows):
            stop = start + rows
            yield self.squared(x[start:stop], sq_x[start:stop], y, sq_y)

    def within(self, x: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Pairs ``(square, rest)`` of blocks covering every pair ``i < j`` of rows once.

        ``square`` holds rows ``start:stop`` against the same rows: only its strict
        upper triangle belongs to the cover. ``rest`` holds the same rows against the
        rows after ``stop``, all of which belong to it.
        """
        sq = _row_norms(x)
        n = x.shape[0]
        rows = self.rows_per_block(n)
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            block = self.squared(x[start:stop], sq[start:stop], x[start:], sq[start:])
            size = stop - start
            yield block[:, :size], block[:, size:]


def _row_norms(points: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ij,ij->i", points, points)


def _prepared(dtype: torch.dtype, *clouds: torch.Tensor) -> list[torch.Tensor]:
    """Shift float64 clouds by the mean of all of them together, then cast to ``dtype``."""
    count = sum(cloud.shape[0] for cloud in clouds)
    if count == 0:
        return [cloud.to(dtype) for cloud in clouds]
    shift = sum(cloud.sum(dim=0) for cloud in clouds) / count
    return [(cloud - shift).to(dtype).contiguous() for cloud in clouds]


def _cross_sum(pairs: _Pairs, x: torch.Tensor, y: torch.Tensor, transform: Transform) -> float:
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for block in pairs.cross(x, y):
        total += transform(block).sum(dtype=torch.float64)
    return float(total.item())


def _within_sum(pairs: _Pairs, x: torch.Tensor, transform: Transform) -> float:
    """Sum of ``transform`` over ordered pairs ``i != j`` (twice the sum over ``i < j``)."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for square, rest in pairs.within(x):
        total += torch.triu(transform(square), diagonal=1).sum(dtype=torch.float64)
        total += transform(rest).sum(dtype=torch.float64)
    return 2.0 * float(total.item())


def _sqrt(d2: torch.Tensor) -> torch.Tensor:
    return d2.sqrt_()


def _rbf(bandwidth: float) -> Transform:
    scale = -1.0 / (2.0 * bandwidth * bandwidth)

    def kernel(d2: torch.Tensor) -> torch.Tensor:
        return d2.mul_(scale).exp_()

    return kernel


# ----------------------------------------------------------------------------- checks


def _cloud_pair(gt: Any, pred: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = as_cloud(gt, "truth cells", device)
    y = as_cloud(pred, "predicted cells", device)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"truth has {x.shape[1]} features but prediction has {y.shape[1]}")
    return x, y


def _check_sizes(n: int, m: int, unbiased: bool) -> None:
    needed = 2 if unbiased else 1
    if n < needed or m < needed:
        form = "the unbiased estimate" if unbiased else "the estimate"
        raise DegenerateInput(
            f"{form} needs at least {needed} cell(s) per population; got {n} true and "
            f"{m} predicted cell(s)"
        )


def _check_bandwidth(bandwidth: Any) -> float:
    try:
        value = float(bandwidth)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"bandwidth must be a positive finite number, got {bandwidth!r}")
    return value


# ----------------------------------------------------------------------------- median


def _positive_within(pairs: _Pairs, points: torch.Tensor) -> Iterator[torch.Tensor]:
    """1-D tensors of the positive squared distances over pairs ``i < j``."""
    upper: torch.Tensor | None = None
    for square, rest in pairs.within(points):
        size = square.shape[0]
        if upper is None or upper.shape[0] != size:
            upper = torch.ones(size, size, dtype=torch.bool, device=points.device).triu_(1)
        yield square[upper & (square > 0)]
        yield rest[rest > 0]


def _keys(values: torch.Tensor) -> torch.Tensor:
    """Bit patterns of positive floats as int64; they order exactly as the values do."""
    return values.contiguous().view(_KEY_DTYPE[values.dtype]).to(torch.int64)


def _count_into(histogram: torch.Tensor, digits: torch.Tensor) -> None:
    """Add the number of occurrences of each digit to ``histogram`` (in place)."""
    histogram.index_add_(0, digits, torch.ones_like(digits))


def _value_of_key(key: int, dtype: torch.dtype) -> float:
    pattern = torch.tensor([key], dtype=torch.int64).to(_KEY_DTYPE[dtype])
    return float(pattern.view(dtype)[0])


class _MedianSelection:
    """Exact order statistics of the positive within-cloud squared distances.

    Values whose keys share their leading bits form a bucket. A pass over the blocks
    builds a histogram of the next digit of the keys in the bucket holding the wanted
    ranks, which narrows the bucket, until it fits in memory and is sorted.
    """

    def __init__(self, pairs: _Pairs, points: torch.Tensor) -> None:
        self.pairs = pairs
        self.points = points
        self.dtype = points.dtype
        self.budget = max(1, pairs.max_block_bytes // pairs.itemsize)

    def _bucket(self, key: int, shift: int) -> Iterator[torch.Tensor]:
        for values in _positive_within(self.pairs, self.points):
            yield values[(_keys(values) >> shift) == key]

    def median(self) -> float:
        bits = _KEY_BITS[self.dtype]
        shift = bits - _FIRST_DIGIT_BITS[self.dtype]
        # Values are kept while they fit in the budget; past it, they are only counted
        # per leading digit, and the selection goes on by narrowing.
        kept: list[torch.Tensor] = []
        kept_size = 0
        histogram: torch.Tensor | None = None
        for values in _positive_within(self.pairs, self.points):
            if histogram is None:
                if kept_size + values.numel() <= self.budget:
                    kept.append(values)
                    kept_size += values.numel()
                    continue
                histogram = torch.zeros(
                    1 << (bits - shift), dtype=torch.int64, device=self.points.device
                )
                for earlier in kept:
                    _count_into(histogram, _keys(earlier) >> shift)
                kept = []
            _count_into(histogram, _keys(values) >> shift)
        if histogram is None:
            if kept_size == 0:
                return 0.0
            ranks = ((kept_size - 1) // 2, kept_size // 2)
            low, high = _order_statistics(torch.cat(kept), ranks)
        else:
            count = int(histogram.sum())
            ranks = ((count - 1) // 2, count // 2)
            low, high = self._narrow(ranks, histogram, shift)
        return 0.5 * (math.sqrt(low) + math.sqrt(high))

    def _narrow(
        self, ranks: tuple[int, int], histogram: torch.Tensor, shift: int
    ) -> tuple[float, float]:
        """Order statistics ``ranks`` (adjacent, 0-based) by narrowing the bucket.

        ``histogram[b]`` counts the values whose key ``>> shift`` is ``base + b``;
        ``below`` values are smaller than all of them.
        """
        below, base = 0, 0
        while True:
            counts = histogram.cpu()
            cumulative = below + torch.cumsum(counts, dim=0)
            first = int(torch.searchsorted(cumulative, ranks[0], right=True))
            second = int(torch.searchsorted(cumulative, ranks[1], right=True))
            if first > 0:
                below = int(cumulative[first - 1])
            key_first, key_second = base + first, base + second
            if key_first != key_second:
                # The lower rank closes its bucket and the upper one opens the next
                # non-empty bucket: one is a maximum, the other a minimum.
                low = max(float(v.max()) for v in self._bucket(key_first, shift) if v.numel())
                high = min(float(v.min()) for v in self._bucket(key_second, shift) if v.numel())
                return low, high
            if shift == 0:
                value = _value_of_key(key_first, self.dtype)
                return value, value
            if int(counts[first]) <= self.budget:
                values = torch.cat(list(self._bucket(key_first, shift)))
                return _order_statistics(values, (ranks[0] - below, ranks[1] - below))
            finer = max(shift - _DIGIT_BITS, 0)
            width = shift - finer
            histogram = torch.zeros(1 << width, dtype=torch.int64, device=self.points.device)
            for values in self._bucket(key_first, shift):
                digits = (_keys(values) >> finer) & ((1 << width) - 1)
                _count_into(histogram, digits)
            base, shift = key_first << width, finer


def _order_statistics(values: torch.Tensor, ranks: tuple[int, int]) -> tuple[float, float]:
    low = float(torch.kthvalue(values, ranks[0] + 1).values)
    if ranks[1] == ranks[0]:
        return low, low
    return low, float(torch.kthvalue(values, ranks[1] + 1).values)


def _median(pairs: _Pairs, points: torch.Tensor) -> float:
    return _MedianSelection(pairs, points).median()


# ---------------------------------------------------------------------------- metrics


def median_pairwise_distance(
    z: Any,
    *,
    device: DeviceLike = "cpu",
    dtype: torch.dtype | None = None,
    max_block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> float:
    """Median of the positive Euclidean distances between the rows of ``z``.

    The definition of :func:`scperteval.metrics.population.median_pairwise_distance`:
    the median over unordered pairs ``i < j`` of points that differ (squared distance
    above the snapping bound, see the module notes), the mean of the two middle values
    for an even count. Exact, and found in bounded memory: when the positive distances
    do not fit in ``max_block_bytes``, a selection on the bit patterns of the squared
    distances narrows down the values holding the median, one pass per digit.

    Parameters
    ----------
    z
        Point cloud (rows are points): NumPy array, scipy sparse matrix or tensor.
    device
        ``"cpu"`` or ``"cuda"`` (``"cuda:N"``, a :class:`torch.device`).
    dtype
        ``torch.float64`` (default) or ``torch.float32``.
    max_block_bytes
        Memory bound for one block of pairwise values and for the values kept.

    Returns
    -------
    float
        The median; 0.0 when no two points differ.

    Raises
    ------
    DegenerateInput
        If ``z`` has non-finite values.
    DeviceUnavailable
        If CUDA is requested and not available.

    """
    target = resolve_device(device)
    dtype = resolve_dtype(dtype)
    (points,) = _prepared(dtype, as_cloud(z, "points", target))
    with torch.no_grad():
        return _median(_Pairs(dtype, max_block_bytes), points)


def energy_distance(
    gt: Any,
    pred: Any,
    *,
    unbiased: bool = True,
    device: DeviceLike = "cpu",
    dtype: torch.dtype | None = None,
    max_block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> float:
    """Energy distance ``2 E|X - Y| - E|X - X'| - E|Y - Y'|`` with Euclidean ``|.|``.

    The definition of :func:`scperteval.metrics.population.energy_distance`:
    ``E|X - Y|`` is the mean over all ``n m`` pairs; the within terms are means over
    ordered pairs ``i != j`` (``unbiased=True``, U-statistics, may be slightly
    negative) or over all ``n^2`` pairs (``unbiased=False``, the plug-in V-statistic,
    never negative). Symmetric in ``gt`` and ``pred``.

    Parameters
    ----------
    gt, pred
        Cells x features: NumPy arrays, scipy sparse matrices or tensors (detached;
        no gradient flows), with the same features.
    unbiased
        Use the unbiased within-sample terms.
    device
        ``"cpu"`` or ``"cuda"`` (``"cuda:N"``, a :class:`torch.device`).
    dtype
        ``torch.float64`` (default: equal to the NumPy reference to rounding) or
        ``torch.float32`` (faster on a GPU; see ``docs/torch.md`` for its accuracy).
    max_block_bytes
        Memory bound for one block of pairwise values and its temporaries.

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
    DeviceUnavailable
        If CUDA is requested and not available.
    ValueError
        If the populations have different numbers of features.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> round(energy_distance(x, x + 1.0), 6)
    0.993808

    """
    target = resolve_device(device)
    dtype = resolve_dtype(dtype)
    x, y = _cloud_pair(gt, pred, target)
    n, m = x.shape[0], y.shape[0]
    _check_sizes(n, m, unbiased)
    x, y = _prepared(dtype, x, y)
    pairs = _Pairs(dtype, max_block_bytes)
    with torch.no_grad():
        cross = _cross_sum(pairs, x, y, _sqrt)
        within_x = _within_sum(pairs, x, _sqrt)
        within_y = _within_sum(pairs, y, _sqrt)
    if unbiased:
        return 2.0 * cross / (n * m) - within_x / (n * (n - 1)) - within_y / (m * (m - 1))
    return 2.0 * cross / (n * m) - within_x / (n * n) - within_y / (m * m)


def mmd(
    gt: Any,
    pred: Any,
    *,
    bandwidth: float | str | None = None,
    unbiased: bool = True,
    device: DeviceLike = "cpu",
    dtype: torch.dtype | None = None,
    max_block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> float:
    """Squared maximum mean discrepancy with the RBF kernel.

    The definition of :func:`scperteval.metrics.population.mmd`:
    ``MMD^2 = E k(X, X') + E k(Y, Y') - 2 E k(X, Y)`` with
    ``k(a, b) = exp(-||a - b||^2 / (2 sigma^2))``; the within terms leave out the
    diagonal (``unbiased=True``, U-statistic, may be slightly negative) or include it
    (``unbiased=False``, V-statistic, never negative). Symmetric in ``gt`` and
    ``pred`` for a fixed or pooled bandwidth.

    Parameters
    ----------
    gt, pred
        Cells x features: NumPy arrays, scipy sparse matrices or tensors (detached;
        no gradient flows), with the same features.
    bandwidth
        Kernel width ``sigma``. ``None`` (default): the median heuristic on the pooled
        sample (:func:`median_pairwise_distance` of ``gt`` and ``pred`` stacked: pairs
        ``i < j`` of distinct points). ``"truth"``: the same heuristic on ``gt``
        alone. When no two points differ, sigma = 1. A number: that width.
    unbiased
        Use the unbiased within-sample terms.
    device
        ``"cpu"`` or ``"cuda"`` (``"cuda:N"``, a :class:`torch.device`).
    dtype
        ``torch.float64`` (default: equal to the NumPy reference to rounding) or
        ``torch.float32`` (faster on a GPU; see ``docs/torch.md`` for its accuracy).
    max_block_bytes
        Memory bound for one block of pairwise values and its temporaries, and for
        the values kept by the median selection.

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
    DeviceUnavailable
        If CUDA is requested and not available.
    ValueError
        If ``bandwidth`` is not ``None``, ``"truth"`` or a positive finite number, or
        the populations have different numbers of features.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> round(mmd(x, x + 1.0, bandwidth=1.0), 6)
    0.442507

    """
    target = resolve_device(device)
    dtype = resolve_dtype(dtype)
    x, y = _cloud_pair(gt, pred, target)
    n, m = x.shape[0], y.shape[0]
    _check_sizes(n, m, unbiased)
    pairs = _Pairs(dtype, max_block_bytes)
    with torch.no_grad():
        if bandwidth is None:
            (pooled,) = _prepared(dtype, torch.cat([x, y]))
            sigma = _median(pairs, pooled) or 1.0
        elif isinstance(bandwidth, str):
            if bandwidth != "truth":
                raise ValueError(f"bandwidth must be None, 'truth' or a number, got {bandwidth!r}")
            (alone,) = _prepared(dtype, x)
            sigma = _median(pairs, alone) or 1.0
        else:
            sigma = _check_bandwidth(bandwidth)
        x, y = _prepared(dtype, x, y)
        kernel = _rbf(sigma)
        cross = _cross_sum(pairs, x, y, kernel)
        within_x = _within_sum(pairs, x, kernel)
        within_y = _within_sum(pairs, y, kernel)
    if unbiased:
        return within_x / (n * (n - 1)) + within_y / (m * (m - 1)) - 2.0 * cross / (n * m)
    return (within_x + n) / (n * n) + (within_y + m) / (m * m) - 2.0 * cross / (n * m)
