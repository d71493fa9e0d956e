"""What a training-loop metric fixes before the first batch: truths, references, spaces.

A :class:`Plan` holds, per condition (covariate group and perturbation), the truth
centroid and the references deltas are taken against, and per protocol the feature
space of every condition, its DEG weights and the reason a condition cannot be scored.
Built from a :class:`~scperteval.context.Context` through the engine's own spaces,
centerings, weights and truth source, so that a prediction scores what ``score`` gives;
or from explicit truth centroids, without a Context, on the full gene space only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scperteval.engine.engine import Engine
from scperteval.engine.featuremap import FeatureMap
from scperteval.engine.protocol import Protocol
from scperteval.engine.spaces import resolve_space
from scperteval.engine.views import centering_vector, metric_context
from scperteval.errors import SpecError
from scperteval.metrics import DatasetContext
from scperteval.torch_backend.training.kernels import CENTROID_KERNELS, WEIGHTED

__all__ = ["CentroidTask", "DatasetTask", "GroupTask", "Plan", "DATASET_METRICS"]

#: Dataset-scope metrics the training metric computes (on the epoch's centroids).
DATASET_METRICS = frozenset({"rank", "transpose_rank", "nir", "pds"})


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass(eq=False)
class CentroidTask:
    """A perturbation-scope centroid protocol, ready to score a matrix of centroids.

    Attributes
    ----------
    protocol
        The protocol.
    mask
        ``(conditions, genes)`` selection of each condition's genes, or ``None`` when
        every selected condition uses all genes.
    selected
        Conditions scored in a gene selection (the others are projections or failed).
    projections
        ``(conditions, components, offset)`` per shared projection (PCA) space.
    weights
        ``(conditions, genes)`` DEG weights on each condition's space (weighted metrics).
    reasons
        Per condition, why it cannot be scored (``""`` when it can).

    """

    protocol: Protocol
    mask: np.ndarray | None
    selected: np.ndarray
    projections: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]
    weights: np.ndarray | None
    reasons: list[str]


@dataclass(eq=False)
class GroupTask:
    """One covariate group of a dataset-scope protocol."""

    conditions: np.ndarray
    space: FeatureMap | None
    truth: np.ndarray | None
    context: DatasetContext | None
    reason: str = ""


@dataclass(eq=False)
class DatasetTask:
    """A dataset-scope protocol: its covariate groups."""

    protocol: Protocol
    groups: list[GroupTask]


@dataclass(eq=False)
class Plan:
    """Everything fixed before training: conditions, genes, truths, tasks.

    Attributes
    ----------
    perturbations, covariates
        Per condition, its perturbation label and covariate group (``"all"`` when
        the data has none).
    genes
        Gene names, in the order of the predicted columns.
    truth
        ``(conditions, genes)`` truth centroids.
    references
        ``control`` and ``perturbed`` references, ``(conditions, genes)`` each.
    centroid, dataset
        The tasks by scope, in the protocols' order.
    controls
        Per protocol, the positive and negative controls' values per condition (only
        when the truth is a truth half, for calibrated values).
    has_covariate
        Whether the data has a covariate column.

    """

    perturbations: tuple[str, ...]
    covariates: tuple[str, ...]
    genes: tuple[str, ...]
    truth: np.ndarray
    references: dict[str, np.ndarray]
    centroid: list[CentroidTask] = field(default_factory=list)
    dataset: list[DatasetTask] = field(default_factory=list)
    controls: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    has_covariate: bool = False

    @property
    def protocols(self) -> list[Protocol]:
        """Every protocol, centroid ones first."""
        return [t.protocol for t in self.centroid] + [t.protocol for t in self.dataset]

    def reference(self, centering: str) -> np.ndarray | None:
        """The ``(conditions, genes)`` reference of a centering (``None`` for ``none``)."""
        return None if centering == "none" else self.references[centering]


def check_supported(protocol: Protocol) -> None:
    """Raise :class:`SpecError` unless the training metric can compute ``protocol``."""
    name = protocol.metric.name
    centroid = protocol.scope == "perturbation" and name in CENTROID_KERNELS
    dataset = protocol.scope == "dataset" and name in DATASET_METRICS
    if protocol.representation != "centroid" or not (centroid or dataset):
        raise SpecError(
            f"protocol {protocol.name!r} ({protocol.representation} {name}) is not computed "
            "during training; supported: centroid metrics "
            f"({', '.join(sorted(CENTROID_KERNELS))}) and the dataset-scope "
            f"{', '.join(sorted(DATASET_METRICS))}"
        )
    if centroid and protocol.metric.options:
        raise SpecError(f"protocol {protocol.name!r}: centroid metrics take no options here")


def _centroid_task(engine: Engine, protocol: Protocol, n_genes: int) -> CentroidTask:
    n = engine.context.layout.n_conditions
    reasons = [""] * n
    weighted = protocol.metric.name in WEIGHTED
    mask = np.zeros((n, n_genes), dtype=bool)
    weights = np.zeros((n, n_genes)) if weighted else None
    selected = np.zeros(n, dtype=bool)
    shared: dict[int, tuple[list[int], FeatureMap]] = {}
    for k in range(n):
        try:
            space = resolve_space(engine, protocol.space, k)
            view = _truth_view(engine, protocol, space, k)
            if not np.isfinite(view).all():
                raise ValueError("the truth view has non-finite values")
            if weights is not None:
                ctx = metric_context(engine, protocol, k, space)
                assert space.genes is not None and ctx.weights is not None
                weights[k, space.genes] = ctx.weights
        except Exception as exc:  # noqa: BLE001 - the condition is NaN with this reason
            reasons[k] = _failure(exc)
            continue
        if space.genes is not None:
            mask[k, space.genes] = True
            selected[k] = True
        else:
            shared.setdefault(id(space), ([], space))[0].append(k)
    projections = []
    for rows, space in shared.values():
        assert space.components is not None
        projections.append((np.asarray(rows, dtype=np.int64), space.components, space.offset))
    full = bool(mask[selected].all())
    return CentroidTask(protocol, None if full else mask, selected, projections, weights, reasons)


def centred_view(space: FeatureMap, vector: np.ndarray, reference: np.ndarray | None) -> np.ndarray:
    """``vector`` less its ``reference`` (none: as it is), in ``space``."""
    if reference is None:
        return space.vector(vector, is_delta=False)
    return space.vector(vector - reference, is_delta=True)


def _truth_view(engine: Engine, protocol: Protocol, space: FeatureMap, k: int) -> np.ndarray:
    """Condition ``k``'s truth centroid, centred as ``protocol`` says, in ``space``."""
    reference = centering_vector(engine, protocol.centering, k)
    return centred_view(space, engine.source("truth", k).centroid, reference)


def _dataset_task(engine: Engine, protocol: Protocol) -> DatasetTask:
    layout = engine.context.layout
    groups = []
    for covariate in range(len(layout.covariates)):
        conditions = engine.conditions_of(covariate)
        try:
            space = resolve_space(engine, protocol.space, int(conditions[0]))
            rows = [_truth_view(engine, protocol, space, int(k)) for k in conditions]
            ctx = DatasetContext(
                covariate=engine.covariates[covariate],
                perturbations=tuple(layout.conditions[int(k)].perturbation for k in conditions),
                features=space.feature_names,
                target_features=tuple(
                    space.positions_of(engine.target_genes(int(k))) for k in conditions
                ),
            )
            groups.append(GroupTask(conditions, space, np.vstack(rows), ctx))
        except Exception as exc:  # noqa: BLE001 - the group is NaN with this reason
            groups.append(GroupTask(conditions, None, None, None, _failure(exc)))
    return DatasetTask(protocol, groups)


def _control_values(
    engine: Engine, protocols: Sequence[Protocol]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Positive and negative controls' values per protocol and condition (truth half)."""
    from scperteval.engine.dispatch import CONTROLS, run_protocols

    layout = engine.context.layout
    table = run_protocols(engine, protocols, CONTROLS)
    index = {(c.covariate, c.perturbation): k for k, c in enumerate(layout.conditions)}
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for protocol in protocols:
        values = {role: np.full(layout.n_conditions, np.nan) for role in ("positive", "negative")}
        part = table[table["protocol"] == protocol.name]
        for row in part.itertuples():
            values[str(row.source)][index[(str(row.covariate), str(row.perturbation))]] = float(
                row.value  # type: ignore[arg-type]
            )
        found[protocol.name] = (values["positive"], values["negative"])
    return found


def plan_from_engine(engine: Engine, protocols: Sequence[Protocol]) -> Plan:
    """The plan of ``protocols`` on an engine's context and truth.

    Parameters
    ----------
    engine
        The engine: ``truth="all"`` for plain values, ``"half"`` for calibrated ones.
    protocols
        Centroid and dataset-scope rank protocols (see :func:`check_supported`).

    Returns
    -------
    Plan
        Truths, references and tasks; controls for a truth half.

    """
    for protocol in protocols:
        check_supported(protocol)
    context = engine.context
    layout = context.layout
    n = layout.n_conditions
    genes = tuple(map(str, context.genes))

    def stacked(rows: list[np.ndarray]) -> np.ndarray:
        return np.vstack(rows) if rows else np.zeros((0, len(genes)))

    truth = stacked([engine.source("truth", k).centroid for k in range(n)])
    references = {
        centering: stacked([np.asarray(centering_vector(engine, centering, k)) for k in range(n)])
        for centering in ("control", "perturbed")
    }
    plan = Plan(
        perturbations=tuple(c.perturbation for c in layout.conditions),
        covariates=tuple(c.covariate for c in layout.conditions),
        genes=genes,
        truth=truth,
        references=references,
        has_covariate=context.dataset.covariate_key is not None,
    )
    for protocol in protocols:
        if protocol.scope == "dataset":
            plan.dataset.append(_dataset_task(engine, protocol))
        else:
            plan.centroid.append(_centroid_task(engine, protocol, len(genes)))
    if engine.truth_half != "all":
        plan.controls = _control_values(engine, protocols)
    return plan


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
        truth = plan.truth[conditions]
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
