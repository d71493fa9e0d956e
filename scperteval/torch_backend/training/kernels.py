"""The centroid metrics on batches of vectors, with torch: one value per row.

Each kernel takes ``x`` (truth) and ``y`` (prediction) of shape ``(n, features)``, a
boolean ``mask`` of the same shape choosing each row's features (a gene selection that
differs between rows) and, for the weighted metrics, non-negative ``weights``. The
definitions and the NaN rules are those of :mod:`scperteval.metrics.centroid`: a value
undefined on its vectors (constant or zero vectors, no weight) is NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from torch import Tensor

__all__ = ["CENTROID_KERNELS", "WEIGHTED"]

Kernel = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]

#: Kernels that read the DEG weights.
WEIGHTED = frozenset({"weighted_mse", "weighted_pearson", "weighted_r2"})


def _zeroed(values: Tensor, mask: Tensor) -> Tensor:
    # ``where`` rather than a product: a NaN outside the mask must not leak into sums.
    return torch.where(mask, values, 0.0)


def _constant(values: Tensor, mask: Tensor) -> Tensor:
    """Rows whose selected values are all equal (exactly, as the NumPy reference tests)."""
    high = torch.where(mask, values, -torch.inf).amax(dim=1)
    low = torch.where(mask, values, torch.inf).amin(dim=1)
    return (high == low) | ~mask.any(dim=1)


def _nan_where(condition: Tensor, values: Tensor) -> Tensor:
    return torch.where(condition, torch.full_like(values, torch.nan), values)


def _correlation(dx: Tensor, dy: Tensor) -> Tensor:
    """Cosine of already centred (and zeroed) rows, NaN for a zero row."""
    # Scaling each row by its largest magnitude keeps tiny values from underflowing.
    sx = dx.abs().amax(dim=1, keepdim=True)
    sy = dy.abs().amax(dim=1, keepdim=True)
    ux = dx / torch.where(sx > 0, sx, torch.ones_like(sx))
    uy = dy / torch.where(sy > 0, sy, torch.ones_like(sy))
    nx = torch.linalg.vector_norm(ux, dim=1)
    ny = torch.linalg.vector_norm(uy, dim=1)
    value = (ux * uy).sum(dim=1) / (nx * ny)
    undefined = (sx[:, 0] == 0) | (sy[:, 0] == 0) | ~torch.isfinite(nx * ny) | (nx * ny == 0)
    return _nan_where(undefined, value.clamp(-1.0, 1.0))


def _count(mask: Tensor, dtype: torch.dtype) -> Tensor:
    return mask.sum(dim=1).to(dtype)


def mse(x: Tensor, y: Tensor, mask: Tensor, _: Tensor | None) -> Tensor:
    """Mean squared error over each row's features."""
    return _zeroed((x - y) ** 2, mask).sum(dim=1) / _count(mask, x.dtype)


def mae(x: Tensor, y: Tensor, mask: Tensor, _: Tensor | None) -> Tensor:
    """Mean absolute error over each row's features."""
    return _zeroed((x - y).abs(), mask).sum(dim=1) / _count(mask, x.dtype)


def l2(x: Tensor, y: Tensor, mask: Tensor, _: Tensor | None) -> Tensor:
    """Euclidean norm of the difference over each row's features."""
    return torch.linalg.vector_norm(_zeroed(x - y, mask), dim=1)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return _zeroed(values, mask).sum(dim=1, keepdim=True) / _count(mask, values.dtype)[:, None]


def pearson(x: Tensor, y: Tensor, mask: Tensor, _: Tensor | None) -> Tensor:
    """Pearson correlation over each row's features; NaN for a constant row."""
    dx = _zeroed(x - _masked_mean(x, mask), mask)
    dy = _zeroed(y - _masked_mean(y, mask), mask)
    undefined = (mask.sum(dim=1) < 2) | _constant(x, mask) | _constant(y, mask)
    return _nan_where(undefined, _correlation(dx, dy))


def r2(x: Tensor, y: Tensor, mask: Tensor, _: Tensor | None) -> Tensor:
    """Coefficient of determination over each row's features; NaN for a constant truth."""
    residual = _zeroed((x - y) ** 2, mask).sum(dim=1)
    total = _zeroed((x - _masked_mean(x, mask)) ** 2, mask).sum(dim=1)
    value = 1.0 - residual / total
    return _nan_where(_constant(x, mask) | (total == 0), value)


def cosine(x: Tensor, y: Tensor, mask: Tensor, _: Tensor | None) -> Tensor:
    """Cosine similarity over each row's features (no centering); NaN for a zero row."""
    return _correlation(_zeroed(x, mask), _zeroed(y, mask))


def _support(mask: Tensor, weights: Tensor | None) -> tuple[Tensor, Tensor]:
    if weights is None:
        raise ValueError("a weighted metric needs DEG weights")
    w = _zeroed(weights, mask)
    return w, mask & (w > 0)


def weighted_mse(x: Tensor, y: Tensor, mask: Tensor, weights: Tensor | None) -> Tensor:
    """``sum w (x - y)^2 / sum w`` per row; NaN where every weight is zero."""
    w, support = _support(mask, weights)
    total = w.sum(dim=1)
    value = (w * _zeroed((x - y) ** 2, support)).sum(dim=1) / total
    return _nan_where(total == 0, value)


def _shares(mask: Tensor, weights: Tensor | None) -> tuple[Tensor, Tensor]:
    """The support's weights divided by their row sums (rows without weight left at 0)."""
    w, support = _support(mask, weights)
    total = w.sum(dim=1, keepdim=True)
    return w / torch.where(total > 0, total, torch.ones_like(total)), support


def weighted_pearson(x: Tensor, y: Tensor, mask: Tensor, weights: Tensor | None) -> Tensor:
    """Weighted Pearson correlation per row; NaN without weight or for a constant row."""
    w, support = _shares(mask, weights)
    root = w.sqrt()
    mx = (w * _zeroed(x, support)).sum(dim=1, keepdim=True)
    my = (w * _zeroed(y, support)).sum(dim=1, keepdim=True)
    dx = _zeroed(root * (x - mx), support)
    dy = _zeroed(root * (y - my), support)
    undefined = _constant(x, support) | _constant(y, support)
    return _nan_where(undefined, _correlation(dx, dy))


def weighted_r2(x: Tensor, y: Tensor, mask: Tensor, weights: Tensor | None) -> Tensor:
    """Weighted coefficient of determination per row; NaN without weight or constant truth."""
    w, support = _shares(mask, weights)
    residual = (w * _zeroed((x - y) ** 2, support)).sum(dim=1)
    mx = (w * _zeroed(x, support)).sum(dim=1, keepdim=True)
    total = (w * _zeroed((x - mx) ** 2, support)).sum(dim=1)
    value = 1.0 - residual / total
    return _nan_where(_constant(x, support) | (total == 0), value)


CENTROID_KERNELS: Mapping[str, Kernel] = MappingProxyType(
    {
        "pearson": pearson,
        "r2": r2,
        "mse": mse,
        "mae": mae,
        "l2": l2,
        "cosine": cosine,
        "weighted_mse": weighted_mse,
        "weighted_pearson": weighted_pearson,
        "weighted_r2": weighted_r2,
    }
)
