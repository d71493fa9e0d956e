"""``PerturbationMetrics``: the benchmark's protocols as a ``torchmetrics.Metric``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd
import torch
from torchmetrics import Metric

from scperteval.data.labels import unmatched_listing
from scperteval.errors import SpecError
from scperteval.torch_backend.training.evaluate import (
    ProtocolResult,
    centroid_values,
    dataset_values,
    device_tensors,
    missing_reasons,
    protocol_result,
)
from scperteval.torch_backend.training.plan import Plan, plan_from_arrays, plan_from_engine
from scperteval.torch_backend.weights import _ConditionIndex

__all__ = ["PerturbationMetrics"]

_PRECISIONS = MappingProxyType({"float64": torch.float64, "float32": torch.float32})
_AGGREGATES = ("median", "mean")


class PerturbationMetrics(Metric):
    """The benchmark's centroid and rank protocols, accumulated batch by batch.

    The state is, per condition (covariate group and perturbation) and gene, the sum
    of the predicted values and their count: additive, so batches, devices and metric
    objects merge by addition. :meth:`compute` takes each condition's mean prediction
    (its centroid, as ``score`` does for predicted cells or pseudobulk rows) and
    scores it against the truth of the :class:`~scperteval.context.Context` with
    each protocol's space, centering and DEG weights.

    Build it with :meth:`from_context` (every protocol, values equal to ``score``) or
    :meth:`from_tensors` (explicit truth centroids, full gene space only).

    Parameters
    ----------
    plan
        The truths and protocols (see :mod:`scperteval.torch_backend.training.plan`).
    aggregate
        ``median`` (default, as ``score``) or ``mean`` over perturbations.
    precision
        ``float64`` (default) or ``float32``: the dtype of the sums and of
        :meth:`compute`. Predictions of either dtype are accepted.
    columns
        Gene names of the predicted columns when they are not the plan's genes in
        its order; every plan gene must be present (extra columns are ignored).
    ignore_labels
        Perturbation labels whose rows are skipped (the control label, as ``score``
        ignores predicted control rows).
    **kwargs
        Passed to :class:`torchmetrics.Metric` (``dist_sync_fn``, ``sync_on_compute``...).

    Raises
    ------
    SpecError
        If ``aggregate`` or ``precision`` is unknown or a plan gene is missing from
        ``columns``.

    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    sums: torch.Tensor
    counts: torch.Tensor

    def __init__(
        self,
        plan: Plan,
        *,
        aggregate: str = "median",
        precision: str = "float64",
        columns: Sequence[str] | None = None,
        ignore_labels: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        if aggregate not in _AGGREGATES:
            raise SpecError(f"aggregate must be one of {', '.join(_AGGREGATES)}, got {aggregate!r}")
        if precision not in _PRECISIONS:
            raise SpecError(f"precision must be one of {', '.join(_PRECISIONS)}, got {precision!r}")
        super().__init__(**kwargs)
        self.plan = plan
        self.aggregate_by = aggregate
        self.state_dtype = _PRECISIONS[precision]
        n, g = plan.truth.shape
        self.add_state("sums", torch.zeros(n, g, dtype=self.state_dtype), dist_reduce_fx="sum")
        self.add_state("counts", torch.zeros(n, g, dtype=torch.int64), dist_reduce_fx="sum")
        self._columns: torch.Tensor | None = None
        if columns is not None:
            position = {str(name): i for i, name in enumerate(columns)}
            absent = [gene for gene in plan.genes if gene not in position]
            if absent:
                raise SpecError(
                    f"{len(absent)} gene(s) of the truth missing from the predicted columns: "
                    f"{', '.join(absent[:5])}" + (" ..." if len(absent) > 5 else "")
                )
            self._columns = torch.tensor([position[g] for g in plan.genes], dtype=torch.int64)
        self._ignored = frozenset(map(str, ignore_labels))
        index = _ConditionIndex(list(zip(plan.covariates, plan.perturbations, strict=True)))
        self._by_pair, self._by_label = index.by_pair, index.by_name
        self._tensors: dict[tuple[str, torch.dtype], dict[str, Any]] = {}

    # ------------------------------------------------------------------ building
    @classmethod
    def from_context(
        cls,
        context: Any,
        protocols: Any = "pearson_delta_ctrl,mse,weighted_mse",
        *,
        truth: str = "all",
        **kwargs: Any,
    ) -> PerturbationMetrics:
        """The metric of ``protocols`` on a context's truth, as ``score`` computes them.

        Parameters
        ----------
        context
            A :class:`~scperteval.context.Context` (its seed and DE method fix the
            spaces and weights, as ``score(..., seed=, de_method=)`` does).
        protocols
            Names, a suite or :class:`~scperteval.engine.protocol.Protocol` objects
            (as for :func:`scperteval.score`): centroid protocols and the
            dataset-scope ``rank``, ``transpose_rank``, ``nir`` and ``pds``.
        truth
            ``all`` (default): values equal to ``score(..., truth="all")``;
            ``half``: against the truth half, as ``score``'s default, with calibrated
            values against each protocol's positive and negative controls.
        **kwargs
            Passed to the constructor (``aggregate``, ``precision``, ``columns``...).

        Returns
        -------
        PerturbationMetrics
            The metric, with empty state.

        Raises
        ------
        SpecError
            If a protocol is unknown or not computed during training (population and
            DE protocols need cells and are scored by ``score``), or ``truth`` is
            neither ``all`` nor ``half``.

        """
        from scperteval.engine.engine import Engine
        from scperteval.engine.suites import resolve_protocols

        if truth not in ("all", "half"):
            raise SpecError(f"truth must be 'all' or 'half', got {truth!r}")
        chosen = resolve_protocols(protocols)
        plan = plan_from_engine(Engine(context, truth=truth), chosen)
        kwargs.setdefault("ignore_labels", (context.dataset.control_label,))
        return cls(plan, **kwargs)

    @classmethod
    def from_tensors(
        cls,
        truth: Any,
        perturbations: Sequence[str],
        genes: Sequence[str],
        protocols: Any = "pearson_delta_ctrl,mse",
        *,
        covariates: Sequence[str] | None = None,
        control: Any = None,
        weights: Any = None,
        **kwargs: Any,
    ) -> PerturbationMetrics:
        """The metric from explicit truth centroids, on all genes.

        Parameters
        ----------
        truth
            ``(conditions, genes)`` truth centroids (tensor or array).
        perturbations, genes
            Labels of the rows and names of the columns.
        protocols
            Protocols on the ``full`` space (``pearson_delta_ctrl``, ``mse``,
            ``weighted_mse``, ``rank_full``, ...).
        covariates
            Covariate group of each row (default: one group).
        control
            Control mean, ``(genes,)`` or ``(conditions, genes)``, for control deltas.
        weights
            ``(conditions, genes)`` DEG weights, for the weighted metrics.
        **kwargs
            Passed to the constructor.

        Returns
        -------
        PerturbationMetrics
            The metric, with empty state.

        Raises
        ------
        SpecError
            If a protocol needs a space other than ``full`` or an input not given.

        """
        from scperteval.engine.suites import resolve_protocols

        def array(value: Any) -> Any:
            # Tensors to float64 host arrays; the plan converts everything else.
            return (
                value.detach().cpu().double().numpy() if isinstance(value, torch.Tensor) else value
            )

        plan = plan_from_arrays(
            array(truth),
            perturbations,
            genes,
            resolve_protocols(protocols),
            covariates=covariates,
            control=array(control),
            weights=array(weights),
        )
        return cls(plan, **kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def protocol_names(self) -> list[str]:
        """Names of the protocols, in the order :meth:`compute` returns them."""
        return [p.name for p in self.plan.protocols]

    @property
    def genes(self) -> tuple[str, ...]:
        """Gene names, in the order the predicted columns must have (without ``columns``)."""
        return self.plan.genes

    @property
    def conditions(self) -> pd.DataFrame:
        """The conditions as a table (``covariate``, ``perturbation``); row ``k`` is index ``k``."""
        return pd.DataFrame(
            {"covariate": list(self.plan.covariates), "perturbation": list(self.plan.perturbations)}
        )

    # ------------------------------------------------------------------ update
    def condition_index(self, perturbations: Any, covariates: Any = None) -> torch.Tensor:
        """Condition indices of a batch's labels (``-1`` for a skipped row).

        Parameters
        ----------
        perturbations
            Labels (strings), or an integer tensor of condition indices (rows of
            :attr:`conditions`; negative for rows to skip).
        covariates
            Covariate labels, needed when a perturbation label occurs in several
            covariate groups.

        Returns
        -------
        torch.Tensor
            ``int64`` indices, one per row.

        Raises
        ------
        SpecError
            On an unknown label or index, or a label that needs its covariate.

        """
        if isinstance(perturbations, torch.Tensor) and not perturbations.is_floating_point():
            index = perturbations.to(torch.int64).reshape(-1)
            n_conditions = len(self.plan.perturbations)
            if index.numel() and int(index.max()) >= n_conditions:
                last = n_conditions - 1
                raise SpecError(f"condition index {int(index.max())} outside 0..{last}")
            return index
        labels = _label_list(perturbations, "perturbations")
        groups = None if covariates is None else _label_list(covariates, "covariates")
        if groups is not None and len(groups) != len(labels):
            raise SpecError(f"{len(groups)} covariates for {len(labels)} perturbation labels")
        found = []
        for row, label in enumerate(labels):
            skipped = _is_missing(label) or str(label) in self._ignored
            if skipped or (groups is not None and _is_missing(groups[row])):
                found.append(-1)
                continue
            if groups is not None:
                key = (str(groups[row]), str(label))
                if key not in self._by_pair:
                    raise SpecError(f"unknown condition {key[1]!r} in covariate group {key[0]!r}")
                found.append(self._by_pair[key])
                continue
            matches = self._by_label.get(str(label))
            if not matches:
                raise SpecError(
                    f"unknown perturbation {unmatched_listing([str(label)], list(self._by_label))}"
                )
            if len(matches) > 1:
                raise SpecError(
                    f"perturbation {label!r} occurs in {len(matches)} covariate groups; "
                    "pass covariates="
                )
            found.append(matches[0])
        return torch.tensor(found, dtype=torch.int64)

    def update(self, pred: torch.Tensor, perturbations: Any, covariates: Any = None) -> None:
        """Add a batch of predicted cells or centroids.

        Parameters
        ----------
        pred
            ``(batch, genes)`` predictions, a tensor (gradients are not tracked) or a
            NumPy array. A NaN value is left out of its gene's sum and count.
        perturbations
            One label per row (strings), or condition indices as an integer tensor;
            ``None``/NaN labels, negative indices and ignored labels (the control)
            skip their row.
        covariates
            One covariate label per row, when perturbation labels repeat across
            covariate groups.

        Raises
        ------
        SpecError
            On a shape that does not fit or an unknown label.

        """
        values = _as_tensor(pred)
        if values.ndim != 2:
            raise SpecError(f"predictions must be (batch, genes), got shape {tuple(values.shape)}")
        if self._columns is not None:
            values = values[:, self._columns.to(values.device)]
        if values.shape[1] != self.sums.shape[1]:
            raise SpecError(
                f"predictions have {values.shape[1]} genes, the truth {self.sums.shape[1]}"
            )
        index = self.condition_index(perturbations, covariates).to(self.sums.device)
        if index.numel() != values.shape[0]:
            raise SpecError(f"{index.numel()} labels for {values.shape[0]} predicted rows")
        values = values.to(device=self.sums.device, dtype=self.state_dtype)
        kept = (index >= 0)[:, None] & ~torch.isnan(values)
        rows = index.clamp(min=0)
        self.sums.index_add_(0, rows, torch.where(kept, values, 0.0))
        self.counts.index_add_(0, rows, kept.to(torch.int64))

    # ------------------------------------------------------------------ compute

    def compute(self) -> dict[str, ProtocolResult]:
        """Every protocol's values on the predictions seen since the last reset.

        Returns
        -------
        dict
            Protocol name to :class:`ProtocolResult`, in the protocols' order. A
            perturbation without predictions, or where a metric is undefined (a
            constant vector...), gets NaN and the reason; nothing raises.

        """
        plan = self.plan
        counts = self.counts.to(self.state_dtype)
        with torch.no_grad():
            means = torch.where(counts > 0, self.sums / counts.clamp(min=1), torch.nan)
        missing = missing_reasons(self.counts)
        key = (str(self.sums.device), self.state_dtype)
        if key not in self._tensors:
            self._tensors[key] = device_tensors(plan, self.sums.device, self.state_dtype)
        tensors = self._tensors[key]
        results: dict[str, ProtocolResult] = {}
        for task, task_tensors in zip(plan.centroid, tensors["tasks"], strict=True):
            values = centroid_values(task, task_tensors, tensors, means)
            results[task.protocol.name] = protocol_result(
                plan, task.protocol, values, task.reasons, missing, self.aggregate_by
            )
        if plan.dataset:
            host = means.detach().cpu().to(torch.float64).numpy()
            for dataset_task in plan.dataset:
                values, reasons = dataset_values(plan, dataset_task, host, missing)
                results[dataset_task.protocol.name] = protocol_result(
                    plan,
                    dataset_task.protocol,
                    values,
                    reasons,
                    [""] * len(reasons),
                    self.aggregate_by,
                )
        return {name: results[name] for name in self.protocol_names}


def _as_tensor(pred: Any) -> torch.Tensor:
    """A batch of predictions as a tensor without gradients; a NumPy array is taken as it is."""
    if isinstance(pred, torch.Tensor):
        return pred.detach()
    if isinstance(pred, np.ndarray) and pred.dtype.kind in "fiu":
        return torch.from_numpy(np.ascontiguousarray(pred))
    raise SpecError(
        f"predictions must be a torch.Tensor or a NumPy array of numbers, got {type(pred).__name__}"
    )


def _is_missing(label: Any) -> bool:
    """Whether a label marks a row to skip (``None``, NaN, ``pd.NA``)."""
    if label is None:
        return True
    if isinstance(label, float) and math.isnan(label):
        return True
    return label is pd.NA or label is pd.NaT


def _label_list(values: Any, name: str) -> list[Any]:
    """A batch's labels as a list; one label given as a string is a list of one, not letters."""
    if isinstance(values, (str, bytes)):
        return [values.decode() if isinstance(values, bytes) else values]
    if hasattr(values, "tolist"):
        listed = values.tolist()
        return listed if isinstance(listed, list) else [listed]
    if not isinstance(values, Iterable):
        raise SpecError(f"{name} must be a list of labels, got {type(values).__name__}")
    return list(values)
