"""Clustering agreement of cell-eval 0.8.2: predicted centroids clustered as the truth's.

The truth's perturbation centroids and the prediction's are each turned into a
neighbourhood graph and clustered with Leiden; the value is the best agreement between
the truth's clustering (at one resolution) and the prediction's (at each resolution of a
grid). The steps reproduce cell-eval's pipeline, which runs scanpy's defaults:

1. **Rows.** One centroid per perturbation (the control excluded), taken in sorted
   label order: Leiden's result depends on the order of the vertices.
2. **Neighbours.** ``m = min(n_neighbors, n - 1)`` exact Euclidean neighbours per row,
   the row itself first (:class:`sklearn.neighbors.NearestNeighbors`, brute force),
   distances rounded to float32.
3. **Fuzzy graph** (UMAP's fuzzy simplicial set, McInnes et al. 2018). Per row ``i``,
   ``rho_i`` is the distance to the nearest other row at a positive distance and
   ``sigma_i`` solves ``sum_j exp(-max(d_ij - rho_i, 0) / sigma_i) = log2(m)`` over the
   ``m - 1`` neighbours, by at most 64 bisection steps that stop within ``1e-5``;
   ``sigma_i`` is at least ``1e-3`` times the row's mean neighbour distance. The
   directed weight is ``w_ij = exp(-(d_ij - rho_i) / sigma_i)`` (1 at or below ``rho_i``)
   and the graph is the fuzzy union ``W + W^T - W * W^T``, in float32
   (:mod:`scperteval.kernels.fuzzy_graph` keeps the reference's float types).
4. **Leiden.** igraph's implementation (:meth:`igraph.Graph.community_leiden`) on the
   undirected graph with every stored entry of the symmetric matrix as one edge (each
   pair twice, as scanpy builds it), modularity objective, two iterations, random
   numbers from ``numpy.random.RandomState(seed)``, a fresh generator per clustering.
5. **Agreement.** The truth clustered at ``real_resolution`` (1.0), the prediction at
   each of ``resolutions`` (0.2 to 2.0); the value is the largest score, and at least
   0: adjusted mutual information (``ami``, default), normalised mutual information
   (``nmi``) or ``(ARI + 1) / 2`` (``ari``), from :mod:`sklearn.metrics`.

One value per covariate group, repeated for each perturbation row as cell-eval repeats
it. Points equal up to rounding (a mean predictor's centroids) make the neighbour order
and so the clusters depend on the last bits of the centroids.

igraph is a core dependency, so the metric runs in every installation; in an
environment where it was removed anyway the metric raises
:class:`~scperteval.errors.MissingExtraError`, which a run records as the reason of a
NaN.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import sparse

from scperteval.errors import MissingExtraError
from scperteval.metrics.common import METRICS, DegenerateInput, _positive_number, as_matrix
from scperteval.metrics.metric_context import DatasetContext

__all__ = [
    "DEFAULT_RESOLUTIONS",
    "SCORES",
    "agreement_score",
    "check_options",
    "clustering_agreement",
    "fuzzy_neighbour_graph",
    "leiden_labels",
]

Float64Array = npt.NDArray[np.float64]
#: The prediction's resolution grid of cell-eval.
DEFAULT_RESOLUTIONS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0)
#: Agreement scores between two clusterings.
SCORES = ("ami", "nmi", "ari")
#: Where a thread keeps the seeded state its Leiden run draws from.
_GENERATOR_ATTRIBUTE = "scperteval_igraph_generator"


def check_options(
    score: str = "ami",
    real_resolution: float = 1.0,
    resolutions: Sequence[float] = DEFAULT_RESOLUTIONS,
    n_neighbors: int = 15,
    seed: int = 0,
) -> None:
    """Check the options of :func:`clustering_agreement` before a run.

    Parameters
    ----------
    score, real_resolution, resolutions, n_neighbors, seed
        As in :func:`clustering_agreement`.

    Raises
    ------
    ValueError
        Naming the first invalid option.

    """
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    if not _positive_number(real_resolution):
        raise ValueError(f"real_resolution must be a positive number, got {real_resolution!r}")
    listed = isinstance(resolutions, Sequence) and not isinstance(resolutions, str | bytes)
    if not listed or not resolutions or not all(_positive_number(r) for r in resolutions):
        raise ValueError(f"resolutions must be a list of positive numbers, got {resolutions!r}")
    if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, int) or n_neighbors < 2:
        raise ValueError(f"n_neighbors must be an integer of at least 2, got {n_neighbors!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")


def fuzzy_neighbour_graph(points: npt.ArrayLike, n_neighbors: int = 15) -> sparse.csr_matrix:
    """The symmetric fuzzy neighbourhood graph of the rows of ``points`` (steps 2 and 3).

    Parameters
    ----------
    points
        ``n x features`` matrix, ``n >= 2``.
    n_neighbors
        Neighbours per row counting the row itself, capped at ``n - 1``.

    Returns
    -------
    scipy.sparse.csr_matrix
        ``n x n`` float32 weights in (0, 1], sorted indices, no stored zeros.

    Raises
    ------
    DegenerateInput
        If there are fewer than 2 rows or non-finite values.

    """
    from sklearn.neighbors import NearestNeighbors

    from scperteval.kernels.fuzzy_graph import fuzzy_bandwidths, fuzzy_memberships

    matrix = as_matrix(points, "points")
    n = matrix.shape[0]
    if n < 2:
        raise DegenerateInput(f"clustering needs at least 2 perturbations, got {n}")
    m = min(int(n_neighbors), n - 1)
    search = NearestNeighbors(n_neighbors=m + 1, algorithm="brute", metric="euclidean")
    distances, indices = search.fit(matrix).kneighbors(matrix)
    indices, distances = indices[:, :m], distances[:, :m].copy()
    is_self = indices == np.arange(n)[:, None]
    distances[is_self] = 0.0
    d32 = distances.astype(np.float32)
    sigma, rho = fuzzy_bandwidths(d32, float(m))
    weights = fuzzy_memberships(indices, d32, sigma, rho)
    rows = np.repeat(np.arange(n), m)
    directed = sparse.coo_matrix((weights.ravel(), (rows, indices.ravel())), shape=(n, n)).tocsr()
    directed.eliminate_zeros()
    transpose = directed.transpose().tocsr()
    union = (directed + transpose - directed.multiply(transpose)).tocsr()
    union.eliminate_zeros()
    union.sort_indices()
    return union


def _igraph() -> Any:
    try:
        import igraph
    except ImportError:
        raise MissingExtraError("clustering_agreement", "cluster", "igraph") from None
    return igraph


class _CallingThreadsGenerator:
    """igraph's random source: the seeded state of the thread that draws, else ``random``.

    igraph has one random source per process and calls it from the thread running
    the algorithm. With this source installed, Leiden runs on two threads (two runs
    in one process) each draw from their own ``numpy.random.RandomState(seed)``, the
    methods igraph calls mapped on that legacy generator as scanpy maps them (so that
    a clustering repeats scanpy's for the same seed); a thread with no seeded state
    draws from :mod:`random`, igraph's default, so it is never taken out.
    """

    @staticmethod
    def _state() -> np.random.RandomState | None:
        return getattr(threading.current_thread(), _GENERATOR_ATTRIBUTE, None)

    def getrandbits(self, bits: int) -> int:
        """``bits`` random bits."""
        if (state := self._state()) is None:
            return random.getrandbits(bits)
        return int(state.tomaxint()) & ((1 << bits) - 1)

    def randint(self, low: int, high: int) -> int:
        """A random integer in ``[low, high]``."""
        if (state := self._state()) is None:
            return random.randint(low, high)
        return int(state.randint(low, high + 1))

    def random(self) -> float:
        """A random float in ``[0, 1)``."""
        if (state := self._state()) is None:
            return random.random()
        return float(state.random_sample())

    def gauss(self, mu: float, sigma: float) -> float:
        """A normal random number."""
        if (state := self._state()) is None:
            return random.gauss(mu, sigma)
        return float(state.normal(mu, sigma))


def leiden_labels(
    graph: sparse.spmatrix | sparse.sparray, resolution: float = 1.0, seed: int = 0
) -> npt.NDArray[np.int64]:
    """Leiden clusters of a weighted symmetric graph (step 4).

    Parameters
    ----------
    graph
        Symmetric sparse weights, as :func:`fuzzy_neighbour_graph` returns.
    resolution
        Modularity resolution: higher gives more, smaller clusters.
    seed
        Seed of the random numbers.

    Returns
    -------
    numpy.ndarray
        A cluster id per vertex.

    Raises
    ------
    MissingExtraError
        If igraph is not installed.

    """
    igraph = _igraph()
    adjacency = sparse.csr_matrix(graph)
    adjacency.eliminate_zeros()
    adjacency.sort_indices()
    n = adjacency.shape[0]
    sources = np.repeat(np.arange(n), np.diff(adjacency.indptr))
    edges = np.column_stack([sources, adjacency.indices]).tolist()
    network = igraph.Graph(n=n, edges=edges, directed=False)
    network.es["weight"] = adjacency.data.astype(np.float64).tolist()
    thread = threading.current_thread()
    setattr(thread, _GENERATOR_ATTRIBUTE, np.random.RandomState(seed))
    igraph.set_random_number_generator(_CallingThreadsGenerator())
    try:
        partition = network.community_leiden(
            objective_function="modularity",
            weights="weight",
            resolution=float(resolution),
            n_iterations=2,
        )
    finally:
        delattr(thread, _GENERATOR_ATTRIBUTE)
    return np.asarray(partition.membership, dtype=np.int64)


def agreement_score(labels_true: npt.ArrayLike, labels_pred: npt.ArrayLike, score: str) -> float:
    """Agreement of two clusterings (step 5, before the maximum).

    Parameters
    ----------
    labels_true, labels_pred
        A cluster label per item.
    score
        ``"ami"`` (adjusted mutual information, arithmetic normalisation), ``"nmi"``
        (normalised mutual information) or ``"ari"`` (``(ARI + 1) / 2``, in [0, 1]).

    Returns
    -------
    float
        The score; 1 for identical partitions.

    Raises
    ------
    ValueError
        If ``score`` is unknown.

    """
    from sklearn import metrics

    if score == "ami":
        return float(metrics.adjusted_mutual_info_score(labels_true, labels_pred))
    if score == "nmi":
        return float(metrics.normalized_mutual_info_score(labels_true, labels_pred))
    if score == "ari":
        return (float(metrics.adjusted_rand_score(labels_true, labels_pred)) + 1.0) / 2.0
    raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")


@METRICS.register(
    "cell_eval_clustering_agreement",
    description="cell-eval clustering_agreement: best AMI between Leiden clusterings of the "
    "truth's and the prediction's centroids",
    representation="centroid",
    scope="dataset",
    better="higher",
    perfect=1.0,
    check=check_options,
)
def clustering_agreement(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    ctx: DatasetContext | None = None,
    *,
    score: str = "ami",
    real_resolution: float = 1.0,
    resolutions: Sequence[float] = DEFAULT_RESOLUTIONS,
    n_neighbors: int = 15,
    seed: int = 0,
) -> Float64Array:
    """Best agreement between Leiden clusterings of the truth's and the prediction's centroids.

    See the module's description for the steps.

    Parameters
    ----------
    gt, pred
        ``n x features`` centroid matrices; row ``i`` of both is perturbation ``i``.
    ctx
        Where given, its ``perturbations`` order the rows by label before clustering,
        as cell-eval does; otherwise the rows' order is used.
    score
        ``"ami"``, ``"nmi"`` or ``"ari"`` (see :func:`agreement_score`).
    real_resolution
        Leiden resolution of the truth's clustering.
    resolutions
        Leiden resolutions tried for the prediction; the best score is kept.
    n_neighbors
        Neighbours per centroid, counting itself (capped at ``n - 1``).
    seed
        Seed of Leiden's random numbers.

    Returns
    -------
    numpy.ndarray
        ``n`` equal values in [0, 1]; higher is better.

    Raises
    ------
    MissingExtraError
        If igraph (the ``cluster`` extra) is not installed.
    DegenerateInput
        If there are fewer than 2 perturbations or non-finite values.
    ValueError
        If the matrices differ in shape or an option is invalid.

    """
    check_options(score, real_resolution, resolutions, n_neighbors, seed)
    _igraph()
    truth = as_matrix(gt, "truth")
    prediction = as_matrix(pred, "prediction")
    if truth.shape != prediction.shape:
        raise ValueError(f"truth has shape {truth.shape} but prediction {prediction.shape}")
    n = truth.shape[0]
    if ctx is not None and len(ctx.perturbations) == n:
        order = np.argsort(np.asarray(ctx.perturbations, dtype=object), kind="stable")
        truth, prediction = truth[order], prediction[order]
    real = leiden_labels(fuzzy_neighbour_graph(truth, n_neighbors), real_resolution, seed)
    graph = fuzzy_neighbour_graph(prediction, n_neighbors)
    scores = (agreement_score(real, leiden_labels(graph, r, seed), score) for r in resolutions)
    return np.full(n, max([0.0, *scores]))
