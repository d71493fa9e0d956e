"""Perturbation-scope metrics on centroids: one value per feature in truth and prediction.

Every function has the signature ``f(gt, pred, ctx=None, **options) -> float`` where
``gt`` and ``pred`` are 1-D arrays aligned by feature. Centering (deltas against the
control or the perturbed mean) is done by the protocol before the call, never here.

NaN rules, common to the module: a value that is mathematically undefined on the
given vectors (the correlation of a constant vector, R^2 of a constant truth, the
cosine of a zero vector, a weighted metric whose weights are all zero) is returned as
NaN, silently. Non-finite input values raise
:class:`~scperteval.metrics.DegenerateInput`; vectors of different shapes raise
``ValueError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import ArrayLike

from scperteval.metrics.common import Decorator, as_vector_pair, register_metric
from scperteval.metrics.metric_context import PerturbationContext

__all__ = [
    "pearson",
    "r2",
    "mse",
    "mae",
    "l2",
    "cosine",
    "weighted_mse",
    "weighted_pearson",
    "weighted_r2",
]

_NAN = float("nan")


def _register(description: str, **meta: Any) -> Decorator:
    """Register a perturbation-scope centroid metric under its function's name."""
    return register_metric(description, representation="centroid", scope="perturbation", **meta)


def _is_constant(values: npt.NDArray[np.float64]) -> bool:
    # Exact comparison on purpose: a vector that merely looks constant still has a
    # defined (if noisy) correlation, as in scipy.stats.pearsonr.
    return bool(values.size == 0 or np.all(values == values[0]))


def _unit(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64] | None:
    """``values`` divided by its norm, or None when the norm is zero or unusable."""
    # Scaling by the largest magnitude first keeps the norm of tiny values from
    # underflowing to zero.
    scale = np.abs(values).max()
    if scale == 0:
        return None
    scaled = values / scale
    norm = np.linalg.norm(scaled)
    if not np.isfinite(norm) or norm == 0:
        return None
    return scaled / norm


def _cosine_of(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> float:
    """Cosine of the angle between two vectors, NaN where either has no direction."""
    ux = _unit(x)
    uy = _unit(y)
    if ux is None or uy is None:
        return _NAN
    return float(np.clip(np.dot(ux, uy), -1.0, 1.0))


def _r2_from(residual: float, total: float) -> float:
    """``1 - residual / total``, NaN where the deviations underflow to a zero total."""
    if total == 0:
        return _NAN
    return float(1.0 - residual / total)


@_register("Pearson correlation between truth and prediction", better="higher", perfect=1.0)
def pearson(gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None) -> float:
    """Pearson correlation coefficient of truth and prediction across features.

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    float
        In [-1, 1]; higher is better, 1 is perfect (any positive affine map of the
        truth scores 1). NaN when either vector is constant (including an all-zero
        delta) or has fewer than two features: the correlation is undefined there, and
        reporting 0 would reward a constant prediction.

    Examples
    --------
    >>> round(pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.5]), 4)
    0.9979

    """
    x, y = as_vector_pair(gt, pred)
    if x.size < 2 or _is_constant(x) or _is_constant(y):
        return _NAN
    return _cosine_of(x - x.mean(), y - y.mean())


@_register(
    "coefficient of determination R^2 of the prediction (unbounded below)",
    better="higher",
    perfect=1.0,
)
def r2(gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None) -> float:
    """Coefficient of determination ``1 - SS_res / SS_tot`` across features.

    The same value as :func:`sklearn.metrics.r2_score` ``(gt, pred)`` wherever the truth
    is not constant.

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    float
        In (-inf, 1]; higher is better, 1 is perfect, 0 is as good as predicting the
        truth's own mean, negative is worse. NaN when the truth is constant, where
        ``SS_tot`` is 0 (scikit-learn returns 1.0 or 0.0 there instead). On deltas
        against the perturbed mean, the mean baseline (an all-zero delta) scores at
        most 0.

    Examples
    --------
    >>> round(r2([1.0, 0.0, 0.0, -0.05, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]), 6)
    -0.219586

    """
    x, y = as_vector_pair(gt, pred)
    if _is_constant(x):
        return _NAN
    return _r2_from(np.sum((x - y) ** 2), np.sum((x - x.mean()) ** 2))


@_register("mean squared error", better="lower", perfect=0.0)
def mse(gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None) -> float:
    """Mean squared error across features.

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    float
        In [0, inf); lower is better, 0 is perfect. Never NaN on finite input.

    Examples
    --------
    >>> round(mse([2, 1, 0.5, 0.2, 0.1], [1.5, 1.2, 0.5, 0.3, 0]), 6)
    0.062

    """
    x, y = as_vector_pair(gt, pred)
    return float(np.mean((x - y) ** 2))


@_register("mean absolute error", better="lower", perfect=0.0)
def mae(gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None) -> float:
    """Mean absolute error across features.

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    float
        In [0, inf); lower is better, 0 is perfect. Never NaN on finite input.

    """
    x, y = as_vector_pair(gt, pred)
    return float(np.mean(np.abs(x - y)))


@_register(
    "Euclidean norm of the difference between truth and prediction", better="lower", perfect=0.0
)
def l2(gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None) -> float:
    """Euclidean distance ``||gt - pred||_2`` (not divided by the number of features).

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    float
        In [0, inf); lower is better, 0 is perfect. Never NaN on finite input.

    """
    x, y = as_vector_pair(gt, pred)
    return float(np.linalg.norm(x - y))


@_register("cosine similarity between truth and prediction", better="higher", perfect=1.0)
def cosine(gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None) -> float:
    """Cosine similarity ``dot(gt, pred) / (||gt|| ||pred||)`` (no centering).

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    float
        In [-1, 1]; higher is better, 1 is perfect (any positive multiple of the
        truth). NaN when either vector is all zero, where the angle is undefined.

    """
    return _cosine_of(*as_vector_pair(gt, pred))


def _weighted(
    gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None, metric: str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Truth, prediction and the context's weights, checked to match."""
    x, y = as_vector_pair(gt, pred)
    if ctx is None or ctx.weights is None:
        raise ValueError(f"{metric} needs DEG weights: pass a context with weights")
    weights = np.asarray(ctx.weights, dtype=np.float64)
    if weights.shape != x.shape:
        raise ValueError(f"{metric}: {weights.size} weights for {x.size} features")
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise ValueError(f"{metric}: weights must be finite and non-negative")
    return x, y, weights


@_register(
    "DEG-weighted mean squared error (Mejia et al. 2025)",
    better="lower",
    perfect=0.0,
    needs=("weights",),
)
def weighted_mse(gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None) -> float:
    """Weighted mean squared error ``sum_g w_g (gt_g - pred_g)^2 / sum_g w_g``.

    With DEG weights, which sum to 1, this is ``sum_g w_g (gt_g - pred_g)^2``; dividing
    by the sum makes the value independent of how the weights are scaled.

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Context whose ``weights`` (non-negative, aligned with the features) are used.

    Returns
    -------
    float
        In [0, inf); lower is better, 0 is perfect. NaN when all weights are zero (no
        feature is differentially expressed enough to be weighted, see
        :func:`~scperteval.metrics.deg_weights_from_statistic`).

    Raises
    ------
    ValueError
        If ``ctx`` has no weights, or they are negative, non-finite or of another
        length than the vectors.

    """
    x, y, w = _weighted(gt, pred, ctx, "weighted_mse")
    total = w.sum()
    if total == 0:
        return _NAN
    return float(np.dot(w, (x - y) ** 2) / total)


@_register(
    "DEG-weighted Pearson correlation (weighted means and covariance)",
    better="higher",
    perfect=1.0,
    needs=("weights",),
)
def weighted_pearson(
    gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None
) -> float:
    """Weighted Pearson correlation: weighted means, covariance and variances.

    ``r_w = cov_w(gt, pred) / sqrt(var_w(gt) var_w(pred))`` with
    ``cov_w(x, y) = sum w (x - m_w(x)) (y - m_w(y))`` and ``m_w(x) = sum w x / sum w``.
    Uniform weights give :func:`pearson`.

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Context whose ``weights`` (non-negative, aligned with the features) are used.

    Returns
    -------
    float
        In [-1, 1]; higher is better, 1 is perfect. NaN when all weights are zero, or
        when either vector is constant over the features with positive weight.

    Raises
    ------
    ValueError
        If ``ctx`` has no weights, or they are negative, non-finite or of another
        length than the vectors.

    """
    x, y, w = _weighted(gt, pred, ctx, "weighted_pearson")
    support = w > 0
    if not support.any() or _is_constant(x[support]) or _is_constant(y[support]):
        return _NAN
    w, x, y = w[support] / w[support].sum(), x[support], y[support]
    # Multiplying by sqrt(w) turns the weighted moments into plain dot products.
    root = np.sqrt(w)
    return _cosine_of(root * (x - np.dot(w, x)), root * (y - np.dot(w, y)))


@_register(
    "DEG-weighted R^2 (sample_weight = DEG weights; Mejia et al. 2025)",
    better="higher",
    perfect=1.0,
    needs=("weights",),
)
def weighted_r2(gt: ArrayLike, pred: ArrayLike, ctx: PerturbationContext | None = None) -> float:
    """Weighted coefficient of determination ``1 - SS_res,w / SS_tot,w``.

    ``SS_res,w = sum w (gt - pred)^2`` and ``SS_tot,w = sum w (gt - m_w(gt))^2`` with the
    weighted mean ``m_w``: the value of :func:`sklearn.metrics.r2_score` with
    ``sample_weight=w`` wherever the truth is not constant.

    Parameters
    ----------
    gt, pred
        1-D arrays of one length: truth and prediction per feature.
    ctx
        Context whose ``weights`` (non-negative, aligned with the features) are used.

    Returns
    -------
    float
        In (-inf, 1]; higher is better, 1 is perfect. NaN when all weights are zero or
        the truth is constant over the features with positive weight. On deltas
        against the perturbed mean, the mean baseline (an all-zero delta) scores at
        most 0.

    Raises
    ------
    ValueError
        If ``ctx`` has no weights, or they are negative, non-finite or of another
        length than the vectors.

    """
    x, y, w = _weighted(gt, pred, ctx, "weighted_r2")
    support = w > 0
    if not support.any() or _is_constant(x[support]):
        return _NAN
    w = w / w.sum()
    return _r2_from(np.dot(w, (x - y) ** 2), np.dot(w, (x - np.dot(w, x)) ** 2))
