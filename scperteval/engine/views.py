"""Views: what a metric sees of a source, per representation, space and centering."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from scperteval.engine.control_views import CONTROL_REPRESENTATIONS, control_view
from scperteval.engine.featuremap import FeatureMap
from scperteval.engine.sources import SourceData
from scperteval.engine.spaces import space_is_per_condition
from scperteval.metrics import DegenerateInput, DEView, PerturbationContext
from scperteval.metrics.weights import deg_weights_from_statistic
from scperteval.stats.de_methods import WELCH_METHODS
from scperteval.stats.diffexp import DEResult, welch_between, welch_statistic_between
from scperteval.stats.multiple_testing import benjamini_hochberg

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine
    from scperteval.engine.protocol import Protocol

__all__ = ["centering_vector", "make_view", "metric_context"]


def centering_vector(engine: Engine, centering: str, condition: int) -> np.ndarray | None:
    """Full-gene reference subtracted from truth and candidate (``None``: no centering)."""
    if centering == "control":
        return engine.control_mean(condition)
    if centering == "perturbed":
        return engine.dataset_mean(condition)
    return None


def make_view(
    engine: Engine,
    protocol: Protocol,
    condition: int,
    source: SourceData,
    space: FeatureMap,
    reference: np.ndarray | None,
    cache_key: Hashable | None = None,
) -> object:
    """The view of ``source`` a metric of ``protocol`` receives for one condition.

    ``cache_key`` names a source whose data is fixed for the engine (the truth;
    for the views against the control also the other candidates): its DE over
    all genes is then computed once per condition and shared by every protocol,
    and its cells mapped to a space are kept for the next population protocol on
    that space (:meth:`~scperteval.engine.engine.Engine.population_points`).
    """
    if protocol.representation in CONTROL_REPRESENTATIONS:
        return control_view(engine, protocol.representation, condition, source, space, cache_key)
    if protocol.representation == "centroid":
        vector = source.centroid if reference is None else source.centroid - reference
        return space.vector(vector, is_delta=reference is not None)
    if protocol.representation == "population":
        if cache_key is None:
            cells = _population_cells(engine, protocol, source, space)
        else:
            key = ("population_points", cache_key, condition, protocol.space)
            shared = engine.population_points(
                key, lambda: _population_cells(engine, protocol, source, space)
            )
            cells = shared.copy()
        if reference is not None:
            cells -= space.vector(reference)
        return cells
    return _de_view(engine, condition, source, space, None if cache_key is None else str(cache_key))


def _population_cells(
    engine: Engine, protocol: Protocol, source: SourceData, space: FeatureMap
) -> np.ndarray:
    """Cells x features of a source in a space (a new array the caller may modify).

    Cells of the group's perturbed sample are cut from the sample's matrix in the
    space (kept for a shared space): a row of a gene selection, or of the product
    of sparse rows with a projection, depends only on its cell, so the values are
    those of the cells' own rows.
    """
    if source.rows is not None:
        return space.matrix(source.rows)
    if source.sample is not None:
        covariate, index = source.sample
        shared = not space_is_per_condition(protocol.space)
        sample_size = engine.perturbed_sample(covariate)[0].size
        exact = space.genes is not None or engine.sample_is_sparse(covariate)
        # A few cells are quicker to read than the whole sample to map.
        if exact and (shared or 2 * index.size >= sample_size):
            points = engine.sample_points(covariate, space, shared)
            return np.asarray(points[index], dtype=np.float64)  # indexing copies
        if exact:
            # The cells' own rows; for a backed file, cut from the sample kept in
            # memory rather than read again from disk.
            if engine.keeps_sample_rows:
                return space.matrix(engine.sample_subset_rows(covariate, index))
            return _mapped_cells(engine, space, engine.perturbed_sample(covariate)[0][index])
    if source.positions is not None:
        return _mapped_cells(engine, space, source.positions)
    raise DegenerateInput("this source has no cells for a population metric")


def _mapped_cells(engine: Engine, space: FeatureMap, positions: np.ndarray) -> np.ndarray:
    """The dataset's cells at ``positions`` in a space; a CSR matrix in memory is read in place."""
    whole = engine.context.dataset.resident_csr()
    if whole is not None:
        return space.matrix_of_rows(whole, positions)
    return space.matrix(engine.context.dataset.rows(positions))


def _de_view(
    engine: Engine,
    condition: int,
    source: SourceData,
    space: FeatureMap,
    cache_key: str | None = None,
) -> DEView:
    """DE of a source against the truth's reference cells (:meth:`Engine.de_reference`).

    Cells: Welch t from their moments. A centroid without cells: its difference
    from the reference mean, standardised as a t statistic would be with the
    reference's variance standing in for the unknown target variance and the
    truth's cell count (no p-values). Without the standardisation, genes with a
    large spread would rank high whatever the prediction.
    """
    assert space.genes is not None
    table = _de_table_holding(engine, source)
    if table is not None:
        statistic = table.statistic[condition]
        return DEView(
            statistic=statistic[space.genes],
            pvalue_adj=lambda: np.asarray(table.pvalue_adj[condition][space.genes]),
        )
    rest = engine.de_reference(condition)
    if source.moments is not None:
        moments = source.moments
        overestimate = engine.context.de_method == "t-test_overestim_var"
        statistic = welch_statistic_between(moments, rest, overestimate, engine.threads)[0]

        def all_genes() -> np.ndarray:
            pvalues = welch_between(moments, rest, overestimate, engine.threads)[1]
            return np.asarray(benjamini_hochberg(pvalues, threads=engine.threads)[0])

        def adjusted_pvalues() -> np.ndarray:
            key = (
                None if cache_key is None else ("de_view_padj", cache_key, condition, overestimate)
            )
            return np.asarray(engine.memo(key, all_genes)[space.genes])

        return DEView(statistic=statistic[space.genes], pvalue_adj=adjusted_pvalues)
    n_truth = engine.context.condition_stats(engine.truth_half).n[condition]
    spread = np.sqrt(rest.variance()[0] * (1.0 / n_truth + 1.0 / rest.n[0]))
    with np.errstate(divide="ignore", invalid="ignore"):
        statistic = (source.centroid - rest.mean[0]) / spread
    statistic = np.where(np.isfinite(statistic), statistic, 0.0)
    return DEView(statistic=statistic[space.genes], pvalue_adj=np.full(space.genes.shape, np.nan))


def _de_table_holding(engine: Engine, source: SourceData) -> DEResult | None:
    """The run's DE table of which the source's DE is a row, or ``None``.

    A share of the perturbation's own cells (the truth, the technical duplicate)
    tested against the rest by a t-test is a row of the context's DE of that share:
    the same moments through the same kernel, so the same values bit for bit. The
    truth's table is computed for every DE protocol anyway; another share's is used
    only once it is computed. A table read from a file stands for the truth's DE in
    weights and DEG sets, but the view keeps testing the cells themselves.
    """
    half = source.half
    if half is None or source.control is not None or engine.context.de_method not in WELCH_METHODS:
        return None
    origin = engine.de_origin(half)
    if origin == "table" or (origin is None and half != engine.truth_half):
        return None
    return engine.de(half)


def metric_context(
    engine: Engine, protocol: Protocol, condition: int, space: FeatureMap
) -> PerturbationContext:
    """The explicit per-perturbation context given to a metric."""
    layout = engine.context.layout
    target = layout.conditions[condition]
    weights = None
    if "weights" in protocol.metric.entry.meta.get("needs", ()):
        weights = _space_weights(engine, condition, space)
    return PerturbationContext(
        perturbation=target.perturbation,
        covariate=target.covariate,
        features=space.feature_names,
        weights=weights,
        target_features=space.positions_of(engine.target_genes(condition)),
        seed=engine.seed,
        device=engine.device,
        threads=engine.threads,
    )


def _space_weights(engine: Engine, condition: int, space: FeatureMap) -> np.ndarray:
    if space.genes is None:
        raise DegenerateInput("DEG weights are defined on genes, not on a projection")
    statistic = engine.truth_de().statistic[condition]
    exponent = engine.context.weight_exponent
    # Weights are recomputed on the space's genes so they stay min-max normalised there.
    return deg_weights_from_statistic(statistic[space.genes], exponent)
