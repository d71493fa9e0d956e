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
from scperteval.metrics.common import METRICS, DegenerateInput
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
    "ControlDE",
    "DEView",
    "DatasetContext",
    "DegenerateInput",
    "PerturbationContext",
    "clustering_agreement",
    "cosine",
    "de_auprc",
    "de_auroc",
    "de_topk_overlap",
    "deg_weights_from_statistic",
    "distance_matrix",
    "distance_sum",
    "energy_distance",
    "energy_distance_from_sums",
    "kernel_sum",
    "l2",
    "mae",
    "median_pairwise_distance",
    "mmd",
    "mmd_from_sums",
    "mse",
    "nir",
    "nir_from_distances",
    "pds",
    "pds_from_distances",
    "pearson",
    "r2",
    "rank",
    "rank_from_distances",
    "sinkhorn",
    "transpose_rank",
    "transpose_rank_from_distances",
    "weighted_mse",
    "weighted_pearson",
    "weighted_r2",
    "within_distance_sum",
    "within_kernel_sum",
]
