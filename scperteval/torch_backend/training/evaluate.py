"""What ``compute`` does with the epoch's centroids: the protocols' values, reasons and results."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from scperteval.scoring.headline import finite_aggregate
from scperteval.torch_backend.training.kernels import CENTROID_KERNELS
from scperteval.torch_backend.training.plan import CentroidTask, DatasetTask, Plan, centred_view

__all__ = [
    "UNDEFINED",
    "ProtocolResult",
    "centroid_values",
    "dataset_values",
    "device_tensors",
    "missing_reasons",
    "protocol_result",
]

UNDEFINED = "metric undefined on these inputs"


class ProtocolResult:
    """A protocol's per-perturbation values, their reasons and their aggregate.

    A plain object on purpose: torchmetrics rebuilds dataclasses and tuples found in a
    ``compute()`` result, and leaves other objects as they are.

    Attributes
    ----------
    protocol
        The protocol's name.
    values
        Per perturbation (indexed by ``perturbation``, or ``(covariate,
        perturbation)`` when the data has a covariate column), the value; NaN where
        undefined.
    reasons
        Aligned with ``values``: why a value is NaN (``""`` where it is not).
    aggregate
        The ``median`` (or ``mean``) of the finite values; NaN when none is.
    calibrated
        The calibrated values against the protocol's positive and negative controls
        (truth-half metrics only), else ``None``.
    calibrated_aggregate
        Their aggregate (NaN when none is finite), or ``None``.
    better
        ``higher`` or ``lower``.

    """

    def __init__(
        self,
        protocol: str,
        values: pd.Series,
        reasons: pd.Series,
        aggregate: float,
        better: str,
        calibrated: pd.Series | None = None,
        calibrated_aggregate: float | None = None,
    ) -> None:
        self.protocol = protocol
        self.values = values
        self.reasons = reasons
        self.aggregate = aggregate
        self.better = better
        self.calibrated = calibrated
        self.calibrated_aggregate = calibrated_aggregate

    @property
    def n_defined(self) -> int:
        """Number of perturbations with a finite value."""
        return int(np.isfinite(self.values.to_numpy(dtype=np.float64)).sum())

    def __float__(self) -> float:
        return float(self.aggregate)

    def __repr__(self) -> str:
        extra = (
            ""
            if self.calibrated_aggregate is None
            else f", calibrated={self.calibrated_aggregate:.4g}"
        )
        return (
            f"ProtocolResult({self.protocol!r}, aggregate={self.aggregate:.4g}{extra}, "
            f"defined={self.n_defined}/{len(self.values)})"
        )


def device_tensors(plan: Plan, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The plan's arrays as tensors on ``device`` (truths, references, masks, weights)."""

    def put(array: np.ndarray | None, kind: torch.dtype = dtype) -> torch.Tensor | None:
        return None if array is None else torch.as_tensor(array).to(device, kind)

    return {
        "truth": put(plan.truth),
        "references": {name: put(r) for name, r in plan.references.items()},
        "tasks": [
            {
                "mask": put(task.mask, torch.bool),
                "weights": put(task.weights),
                "projections": [
                    (torch.as_tensor(rows, device=device), put(c), put(o))
                    for rows, c, o in task.projections
                ],
            }
            for task in plan.centroid
        ],
    }


def missing_reasons(counts: torch.Tensor) -> list[str]:
    """Per condition, why its centroid is not usable (``""`` when it is)."""
    none = (counts == 0).all(dim=1).cpu().numpy()
    partial = (counts == 0).sum(dim=1).cpu().numpy()
    return [
        "no predictions for this perturbation"
        if empty
        else (f"no finite prediction for {int(gaps)} gene(s)" if gaps else "")
        for empty, gaps in zip(none, partial, strict=True)
    ]


def centroid_values(
    task: CentroidTask,
    task_tensors: Mapping[str, Any],
    tensors: Mapping[str, Any],
    means: torch.Tensor,
) -> np.ndarray:
    """One centroid protocol's values per condition (NaN where undefined)."""
    kernel = CENTROID_KERNELS[task.protocol.metric.name]
    truth = tensors["truth"]
    reference = tensors["references"].get(task.protocol.centering)
    x = truth if reference is None else truth - reference
    y = means if reference is None else means - reference
    values = torch.full((truth.shape[0],), torch.nan, dtype=truth.dtype, device=truth.device)
    with torch.no_grad():
        if bool(task.selected.any()):
            rows = torch.as_tensor(np.flatnonzero(task.selected), device=truth.device)
            mask = task_tensors["mask"]
            mask = (
                torch.ones(rows.numel(), x.shape[1], dtype=torch.bool, device=x.device)
                if mask is None
                else mask[rows]
            )
            weights = task_tensors["weights"]
            values[rows] = kernel(
                x[rows], y[rows], mask, None if weights is None else weights[rows]
            )
        for rows, components, offset in task_tensors["projections"]:
            if reference is None and offset is not None:
                xp, yp = (truth[rows] - offset) @ components, (means[rows] - offset) @ components
            else:
                xp, yp = x[rows] @ components, y[rows] @ components
            ones = torch.ones_like(xp, dtype=torch.bool)
            values[rows] = kernel(xp, yp, ones, None)
    return values.detach().cpu().to(torch.float64).numpy()


def dataset_values(
    plan: Plan, task: DatasetTask, means: np.ndarray, missing: Sequence[str]
) -> tuple[np.ndarray, list[str]]:
    """A dataset-scope protocol's values and reasons, with the NumPy reference."""
    n = means.shape[0]
    values = np.full(n, np.nan)
    reasons = [""] * n
    reference = plan.reference(task.protocol.centering)
    offsets: list[np.ndarray | None] = [None] * n if reference is None else list(reference)
    for group in task.groups:
        rows = [int(k) for k in group.conditions]
        absent = [plan.perturbations[k] for k in rows if missing[k]]
        reason = group.reason
        if not reason and absent:
            reason = f"no complete predictions for {', '.join(absent[:3])}" + (
                " ..." if len(absent) > 3 else ""
            )
        if not reason:
            assert group.space is not None and group.truth is not None
            space = group.space
            try:
                candidate = np.vstack([centred_view(space, means[k], offsets[k]) for k in rows])
                values[rows] = np.asarray(
                    task.protocol.metric(group.truth, candidate, group.context), dtype=np.float64
                )
            except Exception as exc:  # noqa: BLE001 - NaN with its reason, never a crash
                reason = f"{type(exc).__name__}: {exc}"
        for k in rows:
            reasons[k] = reason
    return values, reasons


def protocol_result(
    plan: Plan,
    protocol: Any,
    values: np.ndarray,
    prepared: Sequence[str],
    missing: Sequence[str],
    aggregate_by: str,
) -> ProtocolResult:
    """The result of one protocol: values, reasons, aggregate, calibrated values."""
    reasons = [
        prepared_reason or missing_reason or ("" if math.isfinite(value) else UNDEFINED)
        for prepared_reason, missing_reason, value in zip(prepared, missing, values, strict=True)
    ]
    values[np.array([bool(reason) for reason in reasons], dtype=bool)] = math.nan
    if plan.has_covariate:
        index = pd.MultiIndex.from_arrays(
            [list(plan.covariates), list(plan.perturbations)],
            names=["covariate", "perturbation"],
        )
    else:
        index = pd.Index(list(plan.perturbations), name="perturbation")
    calibrated = calibrated_aggregate = None
    if protocol.name in plan.controls:
        from scperteval.scoring.calibrated import calibrated_values

        positive, negative = plan.controls[protocol.name]
        scaled = calibrated_values(values, positive, negative, protocol.better)
        calibrated = pd.Series(scaled, index=index, name=protocol.name)
        calibrated_aggregate = finite_aggregate(scaled, aggregate_by)
    return ProtocolResult(
        protocol.name,
        pd.Series(values, index=index, name=protocol.name),
        pd.Series(reasons, index=index, name="reason", dtype=object),
        finite_aggregate(values, aggregate_by),
        protocol.better,
        calibrated,
        calibrated_aggregate,
    )
