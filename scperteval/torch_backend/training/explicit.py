"""A plan from explicit truth centroids, without a Context (the full gene space only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from scperteval.engine.featuremap import FeatureMap
from scperteval.engine.protocol import Protocol
from scperteval.errors import SpecError
from scperteval.metrics import DatasetContext
from scperteval.torch_backend.training.kernels import WEIGHTED
from scperteval.torch_backend.training.plan import (
    CentroidTask,
    DatasetTask,
    GroupTask,
    Plan,
    check_supported,
)

__all__ = ["leave_one_out_means", "plan_from_arrays"]


def leave_one_out_means(truth: np.ndarray, covariates: Sequence[str]) -> np.ndarray:
    """Per row, the mean of the other rows of its covariate group (NaN when alone)."""
    labels, inverse = np.unique(np.asarray(covariates, dtype=object), return_inverse=True)
    totals = np.zeros((labels.size, truth.shape[1]))
    np.add.at(totals, inverse, truth)
    counts = np.bincount(inverse, minlength=labels.size).astype(np.float64)[inverse] - 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (totals[inverse] - truth) / counts[:, None]
    return np.where(counts[:, None] > 0, means, np.nan)


def plan_from_arrays(
    truth: np.ndarray,
    perturbations: Sequence[str],
    genes: Sequence[str],
    protocols: Sequence[Protocol],
    *,
    covariates: Sequence[str] | None = None,
    control: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> Plan:
    """A plan from explicit truth centroids, on all genes (no Context, no DE).

    Parameters
    ----------
    truth
        ``(conditions, genes)`` truth centroids.
    perturbations
        The conditions' perturbation labels.
    genes
        Gene names of the columns.
    protocols
        Protocols on the ``full`` space only (selections by DE need a Context).
    covariates
        The conditions' covariate groups (default: one group, ``"all"``).
    control
        Control mean, ``(genes,)`` or ``(conditions, genes)``; needed for ``control``
        centering.
    weights
        ``(conditions, genes)`` non-negative DEG weights; needed by weighted metrics.

    Returns
    -------
    Plan
        The plan; ``perturbed`` centering is the leave-one-out mean of the truths.

    Raises
    ------
    SpecError
        If a protocol needs what is not given, or shapes disagree.

    """
    truth = np.asarray(truth, dtype=np.float64)
    n, n_genes = truth.shape if truth.ndim == 2 else (-1, -1)
    labels = tuple(map(str, perturbations))
    groups = tuple(map(str, covariates)) if covariates is not None else ("all",) * len(labels)
    if truth.ndim != 2 or len(labels) != n or len(groups) != n or len(genes) != n_genes:
        raise SpecError(
            f"truth of shape {truth.shape} needs one perturbation (and covariate) per row and "
            "one gene name per column"
        )
    if len(set(zip(groups, labels, strict=True))) != n:
        raise SpecError("each (covariate, perturbation) must have one truth row")
    if not np.isfinite(truth).all():
        raise SpecError("truth centroids must be finite")
    references = {"perturbed": leave_one_out_means(truth, groups)}
    if control is not None:
        control = np.broadcast_to(np.asarray(control, dtype=np.float64), truth.shape).copy()
        references["control"] = control
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != truth.shape or not np.isfinite(weights).all() or (weights < 0).any():
            raise SpecError("weights must be finite, non-negative and shaped like the truth")
    plan = Plan(labels, groups, tuple(map(str, genes)), truth, references, has_covariate=False)
    plan.has_covariate = covariates is not None
    full = FeatureMap("full", np.asarray(plan.genes), genes=np.arange(n_genes))
    gene_index = {g: i for i, g in enumerate(plan.genes)}
    for protocol in protocols:
        check_supported(protocol)
        if protocol.space != "full":
            raise SpecError(
                f"protocol {protocol.name!r}: space {protocol.space!r} needs a Context "
                "(PerturbationMetrics.from_context); explicit truths support 'full' only"
            )
        if protocol.centering == "control" and control is None:
            raise SpecError(f"protocol {protocol.name!r} needs the control mean (control=...)")
        if protocol.metric.name in WEIGHTED and weights is None:
            raise SpecError(f"protocol {protocol.name!r} needs DEG weights (weights=...)")
        if protocol.scope == "dataset":
            plan.dataset.append(_array_dataset_task(plan, protocol, full, gene_index))
            continue
        reference = plan.reference(protocol.centering)
        selected = np.ones(n, bool) if reference is None else np.isfinite(reference).all(axis=1)
        reasons = ["" if ok else "no reference for this row" for ok in selected]
        task_weights = weights if protocol.metric.name in WEIGHTED else None
        plan.centroid.append(CentroidTask(protocol, None, selected, [], task_weights, reasons))
    return plan


def _array_dataset_task(
    plan: Plan, protocol: Protocol, space: FeatureMap, gene_index: dict[str, int]
) -> DatasetTask:
    groups: list[GroupTask] = []
    covariates = np.asarray(plan.covariates, dtype=object)
    reference = plan.reference(protocol.centering)
    for label in dict.fromkeys(plan.covariates):
        conditions = np.flatnonzero(covariates == label)
        truth: Any = plan.truth[conditions]
        if reference is not None:
            truth = truth - reference[conditions]
        if not np.isfinite(truth).all():
            groups.append(GroupTask(conditions, None, None, None, "no reference for this group"))
            continue
        targets = tuple(
            tuple(
                sorted(
                    gene_index[part]
                    for part in plan.perturbations[k].split("+")
                    if part in gene_index
                )
            )
            for k in conditions
        )
        ctx = DatasetContext(
            covariate=label,
            perturbations=tuple(plan.perturbations[k] for k in conditions),
            features=plan.genes,
            target_features=targets,
        )
        groups.append(GroupTask(conditions, space, np.asarray(truth), ctx))
    return DatasetTask(protocol, groups)
