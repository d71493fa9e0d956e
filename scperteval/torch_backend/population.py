"""Energy distance and RBF MMD between cell populations, computed with torch.

The definitions are those of :mod:`scperteval.metrics.population` (the NumPy
reference): same estimators, same median-heuristic bandwidth, same treatment of
coinciding cells, same errors. The sums over pairs are those of
:class:`~scperteval.torch_backend.pairs.TorchPairs` (see there for the computation).
In float64 the results agree with the reference to rounding (about 1e-13 relative);
float32 is faster on a GPU and is accurate to the bound given in ``docs/torch.md``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from scperteval.kernels.pairs import SQRT, rbf_transform
from scperteval.metrics.common import DegenerateInput, as_matrix
from scperteval.metrics.population import (
    check_sizes,
    energy_distance_from_sums,
    mmd_bandwidth,
    mmd_from_sums,
    three_sums,
)
from scperteval.torch_backend.pairs import DEFAULT_BLOCK_BYTES, DeviceLike, TorchPairs, _prepared

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "energy_distance",
    "mmd",
    "median_pairwise_distance",
]


def as_cloud(values: Any, what: str, device: torch.device) -> torch.Tensor:
    """Return a point cloud as a finite 2-D float64 tensor on ``device``.

    NumPy arrays, array-likes and scipy sparse matrices are checked by
    :func:`scperteval.metrics.common.as_matrix`; tensors are detached, converted to
    float64 (exactly, from float32) and checked here. The result is never part of an
    autograd graph.

    Raises
    ------
    ValueError
        If the input is not two-dimensional.
    DegenerateInput
        If it contains NaN or infinity.

    """
    if isinstance(values, torch.Tensor):
        tensor = values.detach()
        if tensor.ndim != 2:
            raise ValueError(f"{what} must be two-dimensional, got shape {tuple(tensor.shape)}")
    else:
        tensor = torch.from_numpy(np.asarray(as_matrix(values, what)))
    tensor = tensor.to(device=device, dtype=torch.float64)
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        bad = int(tensor.numel() - int(finite.sum()))
        raise DegenerateInput(f"{what} contains {bad} non-finite value(s)")
    return tensor.contiguous()


def _clouds(gt: Any, pred: Any, unbiased: bool, *options: Any) -> tuple[TorchPairs, Any, Any]:
    """The pair sums of ``options`` (device, dtype, block bytes) and the two checked clouds."""
    pairs = TorchPairs(*options)
    x = as_cloud(gt, "truth cells", pairs.device)
    y = as_cloud(pred, "predicted cells", pairs.device)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"truth has {x.shape[1]} features but prediction has {y.shape[1]}")
    check_sizes(x.shape[0], y.shape[0], unbiased)
    return pairs, x, y


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
    pairs = TorchPairs(device, dtype, max_block_bytes)
    return pairs.median(as_cloud(z, "points", pairs.device))


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
    pairs, x, y = _clouds(gt, pred, unbiased, device, dtype, max_block_bytes)
    sums = three_sums(pairs.sums, _prepared(pairs.dtype, x, y), SQRT)
    return energy_distance_from_sums(*sums, x.shape[0], y.shape[0], unbiased=unbiased)


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
    pairs, x, y = _clouds(gt, pred, unbiased, device, dtype, max_block_bytes)
    sigma = mmd_bandwidth(
        bandwidth, lambda pooled: pairs.median(torch.cat([x, y]) if pooled else x)
    )
    sums = three_sums(pairs.sums, _prepared(pairs.dtype, x, y), rbf_transform(sigma))
    return mmd_from_sums(*sums, x.shape[0], y.shape[0], unbiased=unbiased)
