"""Perturbation-scope metrics between two populations of cells.

Inputs are point clouds: 2-D arrays (cells x features), usually in a reduced space
(top-k genes, PCA). Every function has the signature ``f(gt, pred, ctx=None, **options)``
and returns a float; lower is better and 0 means the two samples are indistinguishable.

Both clouds are shifted by their pooled mean, and the sums over pairs of cells of
distances and RBF kernels are taken in tiles by :mod:`scperteval.kernels.pairs`
(float64, one BLAS thread, a fixed order of additions, so that a value never
depends on threads or on the machine). The building blocks (:func:`distance_sum`,
:func:`within_distance_sum`, :func:`kernel_sum`, :func:`within_kernel_sum`,
:func:`median_pairwise_distance`, :func:`energy_distance_from_sums`,
:func:`mmd_from_sums`) let a caller compute the within-sample sums of a reference
sample once and reuse them for every perturbation (:mod:`scperteval.engine.fastpath`
does).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from scperteval.errors import MissingExtraError
from scperteval.kernels.median import median_distance
from scperteval.kernels.pairs import (
    DEFAULT_BLOCK_BYTES,
    SQRT,
    PairTransform,
    centred,
    check_bandwidth,
    pair_sums,
    rbf_transform,
)
from scperteval.kernels.threads import Threads
from scperteval.metrics.common import (
    Decorator,
    DegenerateInput,
    _positive_number,
    as_matrix,
    register_metric,
)
from scperteval.metrics.metric_context import PerturbationContext

__all__ = [
    "DEFAULT_MAX_ITER",
    "DEFAULT_TOL",
    "check_sinkhorn_options",
    "check_stopping",
    "check_sizes",
    "cloud_pair",
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
    "mmd_bandwidth",
    "three_sums",
]

Float64Array = npt.NDArray[np.float64]

#: Default stopping tolerance of :func:`sinkhorn`, in units of ``eps = blur^2``.
DEFAULT_TOL = 1e-7
#: Default cap on the iterations of :func:`sinkhorn` at the final temperature.
DEFAULT_MAX_ITER = 10000


def cloud_pair(gt: npt.ArrayLike, pred: npt.ArrayLike) -> tuple[Float64Array, Float64Array]:
    """Truth and prediction as finite float64 point clouds with the same features.

    Parameters
    ----------
    gt, pred
        Cells x features arrays (dense or scipy sparse).

    Returns
    -------
    tuple of numpy.ndarray
        The two clouds, C-contiguous.

    Raises
    ------
    ValueError
        If the numbers of features differ.
    DegenerateInput
        If either has non-finite values.

    """
    x = as_matrix(gt, "truth cells")
    y = as_matrix(pred, "predicted cells")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"truth has {x.shape[1]} features but prediction has {y.shape[1]}")
    return x, y


# ---------------------------------------------------------------------- building blocks


def _cross_sum(
    x: npt.ArrayLike, y: npt.ArrayLike, transform: PairTransform, max_block_bytes: int
) -> float:
    a, b = centred(*cloud_pair(x, y))
    return pair_sums(a, b, [transform], max_block_bytes=max_block_bytes)[0]


def _within_sum(x: npt.ArrayLike, transform: PairTransform, max_block_bytes: int) -> float:
    (a,) = centred(as_matrix(x, "points"))
    return 2.0 * pair_sums(a, None, [transform], max_block_bytes=max_block_bytes)[0]


def three_sums(
    sums: Callable[[Any, Any, list[PairTransform]], list[float]],
    clouds: Sequence[Any],
    transform: PairTransform,
) -> tuple[float, float, float]:
    """The cross sum of two shifted clouds and their within sums over ordered pairs ``i != j``.

    Parameters
    ----------
    sums
        ``sums(x, y, transforms)``: the sums over pairs of a backend
        (:func:`~scperteval.kernels.pairs.pair_sums`), ``y=None`` for the pairs
        ``i < j`` of ``x``.
    clouds
        The two clouds ``x`` and ``y``, shifted by their pooled mean.
    transform
        The transform of the squared distances summed.

    Returns
    -------
    tuple of float
        The cross sum and the within sums of ``x`` and ``y``, the arguments of
        :func:`energy_distance_from_sums` and :func:`mmd_from_sums`.

    """
    x, y = clouds
    (cross,) = sums(x, y, [transform])
    within_x = 2.0 * sums(x, None, [transform])[0]
    within_y = 2.0 * sums(y, None, [transform])[0]
    return cross, within_x, within_y


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
    return _cross_sum(x, y, SQRT, max_block_bytes)


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
    return _within_sum(x, SQRT, max_block_bytes)


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
    return _cross_sum(x, y, rbf_transform(bandwidth), max_block_bytes)


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
    return _within_sum(x, rbf_transform(bandwidth), max_block_bytes)


def median_pairwise_distance(
    z: npt.ArrayLike, *, max_block_bytes: int = DEFAULT_BLOCK_BYTES, threads: Threads | None = None
) -> float:
    """Median of the positive Euclidean distances between the rows of ``z``.

    The median is over unordered pairs ``i < j`` whose points differ
    (``||z_i - z_j|| > 0``), with NumPy's convention for an even count (the mean of
    the two middle values). Coinciding points are left out because sparse expression
    data often hold many identical cells (all zero in a top-k gene space), which would
    otherwise drive the median, and with it an RBF bandwidth, to zero. Exact, in
    bounded memory (:func:`scperteval.kernels.median.median_distance`).

    Parameters
    ----------
    z
        Point cloud (rows are points), dense or scipy sparse.
    max_block_bytes
        Memory bound for one block of pairwise values and for the values kept.
    threads
        The run's threads, which hold BLAS to one thread (for a call without them,
        its own: looking up the BLAS libraries costs milliseconds).

    Returns
    -------
    float
        The median; 0.0 when no two points differ.

    Raises
    ------
    DegenerateInput
        If ``z`` has non-finite values.

    """
    return median_distance(as_matrix(z, "points"), max_block_bytes=max_block_bytes, threads=threads)


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
    check_sizes(n, m, unbiased)
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
    check_sizes(n, m, unbiased)
    if unbiased:
        return within_x / (n * (n - 1)) + within_y / (m * (m - 1)) - 2.0 * cross / (n * m)
    return (within_x + n) / (n * n) + (within_y + m) / (m * m) - 2.0 * cross / (n * m)


def _threads_of(ctx: PerturbationContext | None) -> Threads:
    """The run's threads of a metric call, or the call's own (one BLAS look-up per call)."""
    threads = None if ctx is None else ctx.threads
    return threads if threads is not None else Threads()


def check_sizes(n: int, m: int, unbiased: bool) -> None:
    """Raise :class:`DegenerateInput` unless both populations are large enough.

    Parameters
    ----------
    n, m
        Number of cells of the truth and of the prediction.
    unbiased
        The unbiased form needs 2 cells per population, the plug-in form 1.

    """
    needed = 2 if unbiased else 1
    if n < needed or m < needed:
        form = "the unbiased estimate" if unbiased else "the estimate"
        raise DegenerateInput(
            f"{form} needs at least {needed} cell(s) per population; got {n} true and "
            f"{m} predicted cell(s)"
        )


# ---------------------------------------------------------------------------- metrics


def _register(description: str, **meta: Any) -> Decorator:
    """Register a population metric (lower is better, 0 perfect) under its function's name."""
    return register_metric(
        description,
        representation="population",
        scope="perturbation",
        better="lower",
        perfect=0.0,
        **meta,
    )


@_register("energy distance between cell populations (unbiased within-sample terms)")
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
    x, y = cloud_pair(gt, pred)
    check_sizes(x.shape[0], y.shape[0], unbiased)
    sums = three_sums(partial(pair_sums, threads=_threads_of(ctx)), centred(x, y), SQRT)
    return energy_distance_from_sums(*sums, x.shape[0], y.shape[0], unbiased=unbiased)


@_register("squared maximum mean discrepancy, RBF kernel, median-heuristic bandwidth")
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
    x, y = cloud_pair(gt, pred)
    check_sizes(x.shape[0], y.shape[0], unbiased)
    threads = _threads_of(ctx)
    sigma = mmd_bandwidth(
        bandwidth,
        lambda pooled: median_pairwise_distance(
            np.vstack([x, y]) if pooled else x, threads=threads
        ),
    )
    sums = three_sums(partial(pair_sums, threads=threads), centred(x, y), rbf_transform(sigma))
    return mmd_from_sums(*sums, x.shape[0], y.shape[0], unbiased=unbiased)


def mmd_bandwidth(bandwidth: float | str | None, median: Callable[[bool], float]) -> float:
    """The RBF width ``sigma`` that :func:`mmd`'s ``bandwidth`` option names.

    Parameters
    ----------
    bandwidth
        ``None`` (the median heuristic on the pooled sample), ``"truth"`` (on the
        truth alone) or a positive finite number (that width).
    median
        ``median(pooled)``: the median pairwise distance of the pooled sample
        (``pooled=True``) or of the truth (``pooled=False``).

    Returns
    -------
    float
        The width; 1 when the median is 0 (no two points differ).

    Raises
    ------
    ValueError
        If ``bandwidth`` is another string or not a positive finite number.

    """
    if bandwidth is None or bandwidth == "truth":
        return median(bandwidth is None) or 1.0
    if isinstance(bandwidth, str):
        raise ValueError(f"bandwidth must be None, 'truth' or a number, got {bandwidth!r}")
    return check_bandwidth(bandwidth)


def check_stopping(tol: float | None, max_iter: int) -> None:
    """Raise ``ValueError`` unless ``tol`` is ``None`` or positive and ``max_iter`` >= 1.

    Parameters
    ----------
    tol
        Stopping tolerance of :func:`scperteval.kernels.sinkhorn.converge`, or ``None``.
    max_iter
        Cap on its iterations.

    """
    if tol is not None and not _positive_number(tol):
        raise ValueError(f"tol must be None or a positive finite number, got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")


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


@_register("debiased Sinkhorn estimate of the 2-Wasserstein distance", check=check_sinkhorn_options)
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
        ``tol * eps`` (see :func:`scperteval.kernels.sinkhorn.converge`).
        :data:`DEFAULT_TOL` (1e-7) gives values
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
    x, y = cloud_pair(gt, pred)
    check_sizes(x.shape[0], y.shape[0], unbiased=False)
    device = None if ctx is None else ctx.device
    if backend != "tensorized" or device is not None:
        try:
            import torch
            from geomloss import SamplesLoss
        except ImportError:
            raise MissingExtraError("Sinkhorn distance", "ot", "geomloss") from None
    x, y = centred(x, y)
    pooled_range = np.maximum(x.max(axis=0), y.max(axis=0)) - np.minimum(
        x.min(axis=0), y.min(axis=0)
    )
    if not pooled_range.any():
        return 0.0
    diameter = float(np.linalg.norm(pooled_range))
    from scperteval.kernels.sinkhorn import debiased_sinkhorn

    solve = partial(
        debiased_sinkhorn, blur=blur, scaling=scaling, diameter=diameter, tol=tol, max_iter=max_iter
    )
    if backend == "tensorized" and device is None:
        return math.sqrt(2.0 * max(solve(x, y), 0.0))
    target = torch.device(device if device is not None else "cpu")
    on_cpu = target.type == "cpu"
    single_thread = Threads.single_threaded_torch(torch) if on_cpu else contextlib.nullcontext()
    with torch.no_grad(), single_thread:
        tx, ty = torch.from_numpy(x).to(target), torch.from_numpy(y).to(target)
        if tol is None:
            loss = SamplesLoss(
                "sinkhorn", p=2, blur=blur, scaling=scaling, debias=True, backend=backend
            )
            divergence = float(loss(tx, ty).item())
        else:
            divergence = solve(tx, ty, soft_c_transform=_torch_softmin(torch))
    return math.sqrt(2.0 * max(divergence, 0.0))


def _torch_softmin(torch: Any) -> Any:
    """The soft-C-transform of the Sinkhorn iterations as a ``logsumexp`` on tensors."""

    def softmin(cost: Any, potential: Any, eps: float) -> Any:
        return -eps * torch.logsumexp(potential[None, :] - cost / eps, dim=1)

    return softmin
