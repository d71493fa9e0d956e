"""Dataset-scope protocols: every perturbation of a covariate group at once.

A dataset-scope metric compares the stack of the truths of a covariate group's
perturbations with the stack of a candidate's (rank metrics, the perturbation
discrimination score, control-relative views). :func:`dataset_rows` computes one
protocol for every candidate, one candidate's stack at a time.

Rank, transpose rank and NIR are functions of one matrix, the distances from
every prediction to every truth, and the default suite asks for all three in the
same space with the same centering: the matrix of each candidate is computed once
and kept (a few megabytes for hundreds of perturbations, within
:data:`~scperteval.engine.engine.DATASET_DISTANCES_BYTES`) for the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from functools import partial
from typing import Any

import numpy as np

from scperteval.engine.candidates import Candidate, SourceGetter, candidate_identity, candidate_key
from scperteval.engine.control_views import CONTROL_REPRESENTATIONS, candidate_reference
from scperteval.engine.engine import Engine
from scperteval.engine.protocol import Protocol
from scperteval.engine.result_rows import UNDEFINED_REASON, failure_reason, result_row
from scperteval.engine.spaces import resolve_space
from scperteval.engine.views import centering_vector, make_view
from scperteval.metrics import DatasetContext
from scperteval.metrics.dataset import (
    DEFAULT_DISTANCE,
    Distance,
    ShiftedTruths,
    prediction_truth_distances,
    shifted_truths,
    sqeuclidean_to_truths,
)

__all__ = ["dataset_rows"]


def dataset_rows(
    engine: Engine, protocol: Protocol, covariate: int, candidates: Sequence[Candidate]
) -> list[dict[str, Any]]:
    """The rows of one dataset-scope protocol for every candidate in one covariate group.

    Parameters
    ----------
    engine
        Shared data of the dataset.
    protocol
        A dataset-scope protocol.
    covariate
        Index of the covariate group.
    candidates
        The controls or models to evaluate.

    Returns
    -------
    list of dict
        One row per perturbation of the group and candidate; a failure gives NaN and
        its reason, for that candidate (or, before any candidate, for all).

    """
    rows: list[dict[str, Any]] = []
    for pool, conditions in engine.candidate_pools(covariate):
        rows += _pool_rows(engine, protocol, covariate, pool, conditions, candidates)
    return rows


def _pool_rows(
    engine: Engine,
    protocol: Protocol,
    covariate: int,
    pool: str | None,
    conditions: np.ndarray,
    candidates: Sequence[Candidate],
) -> list[dict[str, Any]]:
    """The rows of one protocol for the perturbations ``conditions``, ranked among them."""
    # Registered sources (no getter of their own) are fixed for the engine.
    named = [(c.role, *c.resolve(protocol), c.getter is None) for c in candidates]
    rows: list[dict[str, Any]] = []
    try:
        space = resolve_space(engine, protocol.space, int(conditions[0]))
        references = [centering_vector(engine, protocol.centering, int(k)) for k in conditions]
        stack_of = partial(_stack, engine, protocol, conditions, space, references)
        truth = stack_of(lambda e, k: e.source("truth", k), "truth")
        ctx = DatasetContext(
            covariate=engine.covariates[covariate],
            perturbations=tuple(
                engine.context.layout.conditions[int(k)].perturbation for k in conditions
            ),
            features=space.feature_names,
            target_features=tuple(
                space.positions_of(engine.target_genes(int(k))) for k in conditions
            ),
        )
    except Exception as exc:  # noqa: BLE001 - recorded as NaN with its reason
        reason = failure_reason(exc)
        return [
            result_row(engine, int(k), protocol, role, name, math.nan, reason)
            for k in conditions
            for role, name, _, _ in named
        ]
    from_distances = _distance_function(protocol)
    distances_to_truth = _DistancesToTruth(truth)
    for role, name, getter, registered in named:
        try:
            # The candidate's stack is freed on return, before the next one is built.
            stack = partial(stack_of, getter, candidate_key(protocol, name, getter, registered))
            if from_distances is None:
                values = np.asarray(protocol.metric(truth, stack(), ctx), dtype=np.float64)
            else:
                distance = protocol.metric.options.get("distance", DEFAULT_DISTANCE)
                key = (
                    covariate,
                    pool,
                    protocol.space,
                    protocol.centering,
                    distance,
                    candidate_identity(name, getter, registered),
                )
                distances = engine.dataset_distances(
                    key, partial(distances_to_truth, stack, distance)
                )
                values = np.asarray(from_distances(distances), dtype=np.float64)
            reasons = ["" if math.isfinite(v) else UNDEFINED_REASON for v in values]
        except Exception as exc:  # noqa: BLE001 - recorded as NaN with its reason
            values = np.full(len(conditions), math.nan)
            reasons = [failure_reason(exc)] * len(conditions)
        for k, value, reason in zip(conditions, values, reasons, strict=True):
            rows.append(result_row(engine, int(k), protocol, role, name, float(value), reason))
    return rows


class _DistancesToTruth:
    """Distances from candidates' stacks to one truth stack, the truth prepared once.

    For squared Euclidean distances the truth's distinct rows are shifted once, in
    place (the truth stack is then used by distances only), and every candidate's
    stack is reordered where it lies: no copies of either.
    """

    def __init__(self, truth: np.ndarray) -> None:
        self._truth = truth
        self._shifted: ShiftedTruths | None = None

    def __call__(self, stack: Callable[[], np.ndarray], distance: Distance) -> np.ndarray:
        if distance != "sqeuclidean":
            return prediction_truth_distances(self._truth, stack(), distance)
        if self._shifted is None:
            self._shifted = shifted_truths(self._truth, overwrite=True)
        return sqeuclidean_to_truths(stack(), self._shifted, overwrite_pred=True)


def _distance_function(protocol: Protocol) -> Callable[[np.ndarray], np.ndarray] | None:
    """The metric as a function of the prediction-truth distances, where it is one.

    Only for centroid stacks and a metric bound to no option but its distance: the
    shared matrix is then exactly the one the metric would compute.
    """
    function = protocol.metric.entry.meta.get("from_distances")
    if function is None or protocol.representation != "centroid":
        return None
    if not set(protocol.metric.options) <= {"distance"}:
        return None
    return function  # type: ignore[no-any-return]


def _stack(
    engine: Engine,
    protocol: Protocol,
    conditions: Iterable[int],
    space: Any,
    references: Sequence[np.ndarray | None],
    getter: SourceGetter,
    cache_key: Hashable | None = None,
) -> Any:
    if protocol.representation in CONTROL_REPRESENTATIONS:
        # One view per perturbation, in row order: DE tables or distances.
        views = [
            make_view(engine, protocol, int(k), getter(engine, int(k)), space, None, cache_key)
            for k in conditions
        ]
        return views if protocol.representation == "control_de" else np.asarray(views)
    # Filled row by row, not stacked from a list of rows: one copy of the stack.
    stacked: np.ndarray | None = None
    for row, (k, truth_reference) in enumerate(zip(conditions, references, strict=True)):
        source = getter(engine, int(k))
        reference = candidate_reference(protocol.centering, source, truth_reference)
        vector = source.centroid if reference is None else source.centroid - reference
        mapped = np.asarray(space.vector(vector, is_delta=reference is not None))
        if stacked is None:
            stacked = np.empty((len(references), *mapped.shape), dtype=mapped.dtype)
        stacked[row] = mapped
    return stacked if stacked is not None else np.empty((0, 0))
