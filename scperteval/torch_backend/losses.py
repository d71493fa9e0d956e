"""Differentiable DEG-weighted training losses with the definitions of the metrics.

For one row (one perturbation: a prediction, its target and its gene weights ``w``):

- :func:`weighted_mse_loss` is ``sum_g w_g (target_g - pred_g)^2 / sum_g w_g``, the
  value of :func:`scperteval.metrics.weighted_mse`;
- :func:`weighted_r2_loss` is ``1 - R^2_w = SS_res,w / SS_tot,w`` with
  ``SS_res,w = sum w (target - pred)^2`` and ``SS_tot,w = sum w (target - m_w)^2``,
  ``m_w`` the weighted mean of the target: one minus
  :func:`scperteval.metrics.weighted_r2`, so minimising it maximises the metric.

Both are invariant to the scale of the weights, so DEG weights (which sum to 1 over
all genes) may be restricted to a subset of genes without renormalising.

Degenerate rows, where the metric is undefined, are never turned into a number:

- weighted MSE: every weight of the row is zero (or there are no genes);
- weighted R^2: every weight is zero, or the target is constant over the genes of
  positive weight (which includes a single gene), or its weighted variance
  underflows to zero;
- either loss: a weight or target value that is negative (weights only), NaN or
  infinite.

With ``degenerate="raise"`` (default) such a row raises :class:`ValueError` naming
the rows and the reason; with ``degenerate="nan"`` its loss is NaN (no host-device
synchronisation, no warning) and the gradient of the other rows is unaffected.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["weighted_mse_loss", "weighted_r2_loss"]

Reduction = Literal["mean", "sum", "none"]
Degenerate = Literal["raise", "nan"]
_REDUCTIONS = ("mean", "sum", "none")
_DEGENERATE = ("raise", "nan")
# Rows listed in an error message.
_SHOWN_ROWS = 10


def _check_inputs(
    pred: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    reduction: str,
    degenerate: str,
    loss: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, str]]]:
    """Validate shapes and options.

    Returns the target and the weights in ``pred``'s dtype, the weights broadcast to
    ``pred``'s shape, the row sums of the weights, and the row masks of the checks
    every loss shares (invalid values, no weight) with their reasons.
    """
    for name, value in (("pred", pred), ("target", target), ("weights", weights)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{loss}: {name} must be a torch.Tensor, got {type(value).__name__}")
        if name == "pred" and not value.is_floating_point():
            raise TypeError(f"{loss}: {name} must be a floating-point tensor, got {value.dtype}")
        if value.is_complex():
            # Target and weights are cast to pred's dtype: any real dtype will do.
            raise TypeError(f"{loss}: {name} must be a real tensor, got {value.dtype}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{loss}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if degenerate not in _DEGENERATE:
        raise ValueError(f"{loss}: degenerate must be one of {_DEGENERATE}, got {degenerate!r}")
    if pred.ndim not in (1, 2):
        raise ValueError(
            f"{loss}: pred must have shape (genes,) or (batch, genes), got {tuple(pred.shape)}"
        )
    if target.shape != pred.shape:
        raise ValueError(
            f"{loss}: target has shape {tuple(target.shape)} but pred has {tuple(pred.shape)}"
        )
    genes = pred.shape[-1]
    if weights.shape not in (pred.shape, (genes,)):
        raise ValueError(
            f"{loss}: weights must have shape ({genes},) or {tuple(pred.shape)}, "
            f"got {tuple(weights.shape)}"
        )
    target, weights = target.to(pred.dtype), weights.to(pred.dtype).expand(pred.shape)
    total = weights.sum(dim=-1)
    bad_weights = ((weights < 0) | ~torch.isfinite(weights)).any(dim=-1)
    checks = [
        (bad_weights, "weights must be finite and non-negative"),
        ((~torch.isfinite(target)).any(dim=-1), "the target has non-finite values"),
        (total == 0, "all weights are zero"),
    ]
    return target, weights, total, checks


def _raise_if_degenerate(checks: list[tuple[torch.Tensor, str]], loss: str) -> None:
    """Raise ValueError for the first check whose row mask has a True entry."""
    batched = checks[0][0].ndim == 1
    masks = torch.stack([mask.reshape(-1) for mask, _ in checks])
    if not bool(masks.any()):
        return
    for (_, reason), flags in zip(checks, masks.cpu(), strict=True):
        rows = torch.nonzero(flags).flatten().tolist()
        if not rows:
            continue
        where = "the input"
        if batched:
            shown = ", ".join(str(r) for r in rows[:_SHOWN_ROWS])
            more = f" and {len(rows) - _SHOWN_ROWS} more" if len(rows) > _SHOWN_ROWS else ""
            where = f"row(s) {shown}{more}"
        raise ValueError(
            f"{loss} is undefined for {where}: {reason} "
            "(pass degenerate='nan' to get NaN for such rows instead)"
        )


def _any_row(checks: list[tuple[torch.Tensor, str]]) -> torch.Tensor:
    """Rows where any of the checks' masks is True."""
    return torch.stack([mask for mask, _ in checks]).any(dim=0)


def _finish(
    value: torch.Tensor,
    undefined: torch.Tensor,
    checks: list[tuple[torch.Tensor, str]],
    reduction: str,
    degenerate: str,
    loss: str,
) -> torch.Tensor:
    if degenerate == "raise":
        _raise_if_degenerate(checks, loss)
    else:
        value = torch.where(undefined, torch.full_like(value, torch.nan), value)
    if reduction == "mean":
        return value.mean()
    if reduction == "sum":
        return value.sum()
    return value


def weighted_mse_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    *,
    reduction: Reduction = "mean",
    degenerate: Degenerate = "raise",
) -> torch.Tensor:
    """DEG-weighted mean squared error, ``sum_g w_g (target_g - pred_g)^2 / sum_g w_g``.

    Row by row the value of :func:`scperteval.metrics.weighted_mse` (with the same
    weights in a :class:`~scperteval.metrics.PerturbationContext`), differentiable
    with respect to ``pred`` (and ``target`` and ``weights``).

    Parameters
    ----------
    pred, target
        Tensors of one shape, ``(genes,)`` or ``(batch, genes)``, on one device. The
        target and the weights are cast to ``pred``'s dtype.
    weights
        Non-negative weights, shape ``(genes,)`` (shared by every row) or the shape of
        ``pred`` (one row per perturbation, e.g. from :meth:`DEGWeights.lookup`).
    reduction
        ``"mean"`` (default) over the rows, ``"sum"``, or ``"none"``: one value per
        row (shape ``(batch,)``, or ``()`` for 1-D input).
    degenerate
        ``"raise"`` (default): a row whose weights are all zero, or with negative or
        non-finite weights or non-finite target values, raises ``ValueError``.
        ``"nan"``: such a row's loss is NaN (so is a ``"mean"`` or ``"sum"`` over it),
        and no host-device synchronisation happens.

    Returns
    -------
    torch.Tensor
        The loss, in ``pred``'s dtype; 0 is perfect.

    Raises
    ------
    ValueError
        On a degenerate row (``degenerate="raise"``), on mismatched shapes, or an
        unknown option.
    TypeError
        If ``pred`` is not a floating-point tensor, or ``target`` or ``weights`` is
        complex (integer ones are cast to ``pred``'s dtype).

    Examples
    --------
    >>> import torch
    >>> pred = torch.tensor([1.5, 2.0, 2.5], dtype=torch.float64, requires_grad=True)
    >>> target = torch.tensor([1.0, 0.0, 3.0], dtype=torch.float64)
    >>> weights = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    >>> loss = weighted_mse_loss(pred, target, weights)
    >>> loss.backward()
    >>> loss.item(), pred.grad.tolist()
    (1.1875, [0.5, 1.0, -0.25])

    """
    name = "weighted_mse_loss"
    target, w, total, checks = _check_inputs(pred, target, weights, reduction, degenerate, name)
    undefined = _any_row(checks)
    safe_total = torch.where(undefined, torch.ones_like(total), total)
    value = (w * (target - pred) ** 2).sum(dim=-1) / safe_total
    return _finish(value, undefined, checks, reduction, degenerate, name)


def weighted_r2_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    *,
    reduction: Reduction = "mean",
    degenerate: Degenerate = "raise",
) -> torch.Tensor:
    """One minus the DEG-weighted R^2: ``SS_res,w / SS_tot,w``, to be minimised.

    Row by row ``1 - weighted_r2`` (:func:`scperteval.metrics.weighted_r2` with the
    same weights), differentiable with respect to ``pred`` (and ``target`` and
    ``weights``). 0 is perfect, 1 is as good as predicting the target's weighted mean,
    and the loss is unbounded above.

    Parameters
    ----------
    pred, target
        Tensors of one shape, ``(genes,)`` or ``(batch, genes)``, on one device. The
        target and the weights are cast to ``pred``'s dtype.
    weights
        Non-negative weights, shape ``(genes,)`` (shared by every row) or the shape of
        ``pred``.
    reduction
        ``"mean"`` (default) over the rows, ``"sum"``, or ``"none"``: one value per
        row (shape ``(batch,)``, or ``()`` for 1-D input).
    degenerate
        ``"raise"`` (default): a row whose weights are all zero, whose target is
        constant over the genes of positive weight (a single gene included), or with
        negative or non-finite weights or non-finite target values, raises
        ``ValueError``. ``"nan"``: such a row's loss is NaN, without host-device
        synchronisation.

    Returns
    -------
    torch.Tensor
        The loss, in ``pred``'s dtype.

    Raises
    ------
    ValueError
        On a degenerate row (``degenerate="raise"``), on mismatched shapes, or an
        unknown option.
    TypeError
        If ``pred`` is not a floating-point tensor, or ``target`` or ``weights`` is
        complex (integer ones are cast to ``pred``'s dtype).

    """
    name = "weighted_r2_loss"
    target, w, total, checks = _check_inputs(pred, target, weights, reduction, degenerate, name)
    support = w > 0
    # Exact comparison, as in the metric: constant over the genes of positive weight.
    highest = torch.where(support, target, torch.full_like(target, -torch.inf)).amax(dim=-1)
    lowest = torch.where(support, target, torch.full_like(target, torch.inf)).amin(dim=-1)
    constant = (total != 0) & (highest == lowest)
    checks.append((constant, "the target is constant over the genes of positive weight"))
    early = _any_row(checks)
    share = w / torch.where(early, torch.ones_like(total), total).unsqueeze(-1)
    mean = (share * target).sum(dim=-1, keepdim=True)
    spread = (share * (target - mean) ** 2).sum(dim=-1)
    underflow = ~early & (spread == 0)
    checks.append((underflow, "the weighted variance of the target underflows to zero"))
    undefined = early | underflow
    residual = (share * (target - pred) ** 2).sum(dim=-1)
    value = residual / torch.where(undefined, torch.ones_like(spread), spread)
    return _finish(value, undefined, checks, reduction, degenerate, name)
