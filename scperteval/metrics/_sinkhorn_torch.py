"""The Sinkhorn solver of :mod:`scperteval.kernels.sinkhorn` on torch tensors.

The same annealing, iterations at the final temperature and stopping rule, with the
soft-C-transform written as a ``logsumexp`` over a float64 tensor on the chosen
device; torch is imported by the caller (the ``ot`` extra).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from scperteval.kernels.sinkhorn_loop import solve, temperature_schedule


def _half_squared_distances(torch: Any, x: Any, y: Any) -> Any:
    cost = (x * x).sum(dim=1)[:, None] - 2.0 * (x @ y.T)
    cost += (y * y).sum(dim=1)[None, :]
    return cost / 2.0


def torch_divergence(
    x: np.ndarray,
    y: np.ndarray,
    *,
    blur: float,
    scaling: float,
    diameter: float,
    tol: float | None,
    max_iter: int,
    device: Any,
) -> float:
    """Debiased Sinkhorn divergence ``S_eps`` computed with torch on ``device``.

    Parameters
    ----------
    x, y
        Cells x features float64 arrays (centred, not all points coinciding).
    blur, scaling, tol, max_iter
        As for :func:`scperteval.kernels.sinkhorn.debiased_sinkhorn`.
    diameter
        Length of the diagonal of the pooled bounding box.
    device
        A torch device.

    Returns
    -------
    float
        ``S_eps``, equal to the NumPy solver's to the stopping tolerance.

    """
    import torch

    def softmin(cost: Any, potential: Any, eps: float) -> Any:
        return -eps * torch.logsumexp(potential[None, :] - cost / eps, dim=1)

    with torch.no_grad():
        tx = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).to(device)
        ty = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64)).to(device)
        costs = (
            _half_squared_distances(torch, tx, ty),
            _half_squared_distances(torch, ty, tx),
            _half_squared_distances(torch, tx, tx),
            _half_squared_distances(torch, ty, ty),
        )
        log_weights = (
            torch.full(
                (tx.shape[0],), math.log(1.0 / tx.shape[0]), dtype=torch.float64, device=device
            ),
            torch.full(
                (ty.shape[0],), math.log(1.0 / ty.shape[0]), dtype=torch.float64, device=device
            ),
        )
        temperatures = temperature_schedule(diameter, blur, scaling)
        return solve(softmin, costs, log_weights, temperatures, tol, max_iter)
