"""Metrics: pure functions comparing a prediction with the truth.

Perturbation-scope metrics have the signature ``f(gt, pred, ctx=None, **options) ->
float`` and dataset-scope metrics ``f(gt, pred, ctx=None, **options) -> numpy.ndarray``
(one value per perturbation row). ``ctx`` is a :class:`PerturbationContext` or a
:class:`DatasetContext`; options are keyword-only. Every metric is registered in
:data:`METRICS` with the metadata ``representation``, ``scope``, ``better``, ``perfect``
and, where it reads the context, ``needs``.

Undefined values follow two rules. Centroid metrics return NaN where the value is
mathematically undefined (the correlation of a constant vector, for instance). Where an
input cannot be scored at all (too few cells, no DE gene, non-finite values) a metric
raises :class:`DegenerateInput`, whose ``reason`` the caller records next to a NaN.
"""

from scperteval.metrics._registry import METRICS
from scperteval.metrics.cell_eval import ControlDE
from scperteval.metrics.centroid import (
    cosine,
    l2,
    mae,
    mse,
    pearson,
    r2,
    weighted_mse,
    weighted_pearson,
    weighted_r2,
)
from scperteval.metrics.clustering import clustering_agreement
from scperteval.metrics.common import DegenerateInput
from scperteval.metrics.dataset import (
    distance_matrix,
    nir,
    nir_from_distances,
    pds,
    pds_from_distances,
    rank,
    rank_from_distances,
    transpose_rank,
    transpose_rank_from_distances,
)
from scperteval.metrics.de import DEView, de_auprc, de_auroc, de_topk_overlap
from scperteval.metrics.metric_context import DatasetContext, PerturbationContext
from scperteval.metrics.population import (
    distance_sum,
    energy_distance,
    energy_distance_from_sums,
    kernel_sum,
    median_pairwise_distance,
    mmd,
    mmd_from_sums,
    sinkhorn,
    within_distance_sum,
    within_kernel_sum,
)
from scperteval.metrics.weights import deg_weights_from_statistic

__all__ = [
    "METRICS",
    "DegenerateInput",
    "PerturbationContext",
    "DatasetContext",
    "DEView",
    "ControlDE",
    "clustering_agreement",
    "pearson",
    "r2",
    "mse",
    "mae",
    "l2",
    "cosine",
    "weighted_mse",
    "weighted_pearson",
    "weighted_r2",
    "deg_weights_from_statistic",
    "energy_distance",
    "mmd",
    "sinkhorn",
    "distance_sum",
    "within_distance_sum",
    "kernel_sum",
    "within_kernel_sum",
    "median_pairwise_distance",
    "energy_distance_from_sums",
    "mmd_from_sums",
    "de_auprc",
    "de_auroc",
    "de_topk_overlap",
    "rank",
    "transpose_rank",
    "nir",
    "pds",
    "distance_matrix",
    "rank_from_distances",
    "transpose_rank_from_distances",
    "nir_from_distances",
    "pds_from_distances",
]
