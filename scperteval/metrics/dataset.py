"""Dataset-scope rank metrics: every perturbation of a covariate group at once.

Inputs are two matrices (perturbations x features) whose row ``i`` holds the truth and
the prediction of the same perturbation. Every function has the signature
``f(gt, pred, ctx=None, **options)`` and returns one value per row (float64 array).

All metrics read the distance matrix ``D[i, j] = d(pred_i, truth_j)``
(:func:`distance_matrix`), computed with whole-matrix operations. Ranks only depend on
the order of distances, so squared Euclidean distance ranks exactly as Euclidean
distance does.

Tie rule, common to all: a competitor at a distance equal to the true one counts
against the prediction. Identical rows (of the prediction, or of the truth) are
detected before distances are computed, so they get bit-identical distances and the
rule applies to them exactly. Consequences for a constant (mode-collapsed) predictor,
whose rows are all equal:

- :func:`rank` is 1 for every perturbation, the worst value: all predictions are tied.
- :func:`transpose_rank`, :func:`nir` and :func:`pds` compare one prediction with all
  truths, so a constant prediction ranks the truths by their distance to it: the mean
  over perturbations is exactly chance level (0.5, or ``(n + 1) / (2 n)`` for PDS)
  when no two truths are equidistant, and the worst value for truths it cannot tell
  apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from scperteval.kernels.threads import Threads
from scperteval.metrics.common import Decorator, DegenerateInput, as_matrix, register_metric
from scperteval.metrics.metric_context import DatasetContext

__all__ = [
    "rank",
    "transpose_rank",
    "nir",
    "pds",
    "distance_matrix",
    "prediction_truth_distances",
    "shifted_truths",
    "sqeuclidean_to_truths",
    "ShiftedTruths",
    "rank_from_distances",
    "transpose_rank_from_distances",
    "nir_from_distances",
    "pds_from_distances",
]

Float64Array = npt.NDArray[np.float64]
Distance = Literal["sqeuclidean", "l1", "cosine"]
_DISTANCES = ("sqeuclidean", "l1", "cosine")
#: The distance of the rank metrics unless a protocol names another.
DEFAULT_DISTANCE: Distance = "sqeuclidean"


# ------------------------------------------------------------------------- distances


#: Bytes of rows compared at a time when looking for repeated rows.
_COMPARE_BYTES = 16 * 2**20
#: Columns compared first when looking for repeated rows.
_PROBE_COLUMNS = 16


def _as_records(matrix: Float64Array) -> np.ndarray:
    """The rows as one record each (a field per column), without copying.

    Records sort as ``np.unique(matrix, axis=0)`` sorts rows: column by column.
    """
    fields = [(f"f{i}", matrix.dtype) for i in range(matrix.shape[1])]
    return np.ascontiguousarray(matrix).view(fields).reshape(-1)


def _equal_to_previous(matrix: Float64Array, order: npt.NDArray[np.intp]) -> np.ndarray:
    """``same[k]``: row ``order[k]`` equals row ``order[k - 1]`` (``same[0]`` is False)."""
    n_rows = order.size
    same = np.zeros(n_rows, dtype=bool)
    if n_rows < 2:
        return same
    # Equal rows are equal in any few columns: only neighbours equal in a handful of
    # columns spread over the row are compared in full, usually a few rows instead of
    # copies of all of them. (A comparison, not a sum: it is equal exactly when the
    # full comparison would be, NaN, infinities and signed zeros included.)
    probes = np.unique(np.linspace(0, matrix.shape[1] - 1, _PROBE_COLUMNS).astype(np.intp))
    sampled = matrix[:, probes][order]
    candidates = 1 + np.flatnonzero((sampled[1:] == sampled[:-1]).all(axis=1))
    step = max(1, _COMPARE_BYTES // max(1, matrix.shape[1] * matrix.itemsize))
    for start in range(0, candidates.size, step):
        rows = candidates[start : start + step]
        same[rows] = (matrix[order[rows]] == matrix[order[rows - 1]]).all(axis=1)
    return same


def _unique_rows(
    matrix: Float64Array, mask: Float64Array | None = None
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Distinct rows (of ``matrix``, or of ``matrix`` and ``mask`` side by side).

    The rows ``np.unique(np.hstack([matrix, mask]), axis=0, return_inverse=True)``
    finds, in its order, without its copies of the whole input (sorted, flattened
    and stacked; several times the input for thousands of perturbations x genes):
    records are sorted in place of rows, repeats found a block of rows at a time.

    Returns
    -------
    tuple of numpy.ndarray
        The index of one row of each distinct kind, in sorted order, and for every
        row the position of its kind.

    """
    n_rows = matrix.shape[0]
    if n_rows == 0 or matrix.shape[1] == 0:
        key = matrix if mask is None else np.hstack([matrix, mask])
        _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)
    # The sort np.unique uses; which of two equal rows comes first does not matter.
    order = _as_records(matrix).argsort(kind="quicksort")
    same = _equal_to_previous(matrix, order)
    if mask is not None:
        # Rows equal in ``matrix`` are ordered, and told apart, by their mask rows.
        bounds = np.append(np.flatnonzero(~same), n_rows)
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            if stop - start > 1:
                run = order[start:stop]
                order[start:stop] = run[_as_records(mask[run]).argsort(kind="quicksort")]
        same &= _equal_to_previous(mask, order)
    first = ~same
    inverse = np.empty(n_rows, dtype=np.intp)
    inverse[order] = np.cumsum(first) - 1
    return order[first], inverse


def _expanded_sqeuclidean(
    pred: Float64Array, truth: Float64Array, truth_norms: Float64Array
) -> Float64Array:
    """``||p_i||^2 + truth_norms[., j] - 2 p_i.t_j``, with the rounding below 0 clipped."""
    d = pred @ truth.T
    d *= -2.0
    d += np.einsum("ij,ij->i", pred, pred)[:, None]
    d += truth_norms
    return np.maximum(d, 0.0, out=d)


def _distances_of_unique(
    pred: Float64Array, truth: Float64Array, keep: Float64Array | None, distance: str
) -> Float64Array:
    """Masked squared Euclidean or cosine distances between distinct rows.

    ``pred`` and ``truth`` may be overwritten. Squared Euclidean distances without a
    mask go through :func:`shifted_truths`, L1 distances through :func:`_l1_distances`.
    """
    if distance == "sqeuclidean" and keep is not None:
        # As in shifted_truths: a common shift; the rows are the caller's own copies,
        # shifted in place, not copied again.
        shift = truth.mean(axis=0)
        pred -= shift
        truth -= shift
        pred *= keep
        return _expanded_sqeuclidean(pred, truth, keep @ (truth * truth).T)
    p = pred if keep is None else pred * keep
    dot = p @ truth.T
    pred_norms = np.sqrt(np.einsum("ij,ij->i", p, p))[:, None]
    if keep is not None:
        truth_norms = np.sqrt(keep @ (truth * truth).T)
    else:
        truth_norms = np.sqrt(np.einsum("ij,ij->i", truth, truth))[None, :]
    denominator = pred_norms * truth_norms
    # A zero vector has no direction: similarity 0 (distance 1) to everything, the
    # convention of sklearn.metrics.pairwise.cosine_similarity.
    similarity = np.divide(dot, denominator, out=np.zeros_like(dot), where=denominator > 0)
    return 1.0 - np.clip(similarity, -1.0, 1.0)


def _gather_rows_in_place(matrix: Float64Array, rows: npt.NDArray[np.intp]) -> None:
    """``matrix[: len(rows)] = matrix[rows]`` for distinct ``rows``, with one spare row.

    The permutation that takes the chosen rows to the front (the others after them,
    in any order) is followed cycle by cycle.
    """
    n_rows = matrix.shape[0]
    rest = np.setdiff1d(np.arange(n_rows), rows, assume_unique=True)
    source = np.concatenate([rows, rest])
    done = np.zeros(n_rows, dtype=bool)
    spare = np.empty(matrix.shape[1], dtype=matrix.dtype)
    for first in range(n_rows):
        if done[first] or source[first] == first:
            done[first] = True
            continue
        spare[:] = matrix[first]
        position = first
        while True:
            done[position] = True
            following = int(source[position])
            if following == first:
                matrix[position] = spare
                break
            matrix[position] = matrix[following]
            position = following


def _distinct_rows(
    matrix: Float64Array, overwrite: bool
) -> tuple[Float64Array, npt.NDArray[np.intp]]:
    """The distinct rows, and for every row the position of its distinct row.

    The rows are a copy, or gathered in front of ``matrix`` if it may be overwritten.
    """
    kept, index = _unique_rows(matrix)
    if overwrite and matrix.flags.writeable:
        _gather_rows_in_place(matrix, kept)
        return matrix[: kept.size], index
    return matrix[kept], index


def _l1_distances(
    pred: Float64Array, truth: Float64Array, keep: Float64Array | None, threads: Threads
) -> Float64Array:
    """L1 distances of all pairs of rows (C-contiguous float64), one compiled pass per pair."""
    from scperteval.kernels.distances import l1_distances

    out = np.empty((pred.shape[0], truth.shape[0]))
    mask = np.empty((0, 0)) if keep is None else np.ascontiguousarray(keep, dtype=np.float64)

    def fill(start: int, stop: int) -> None:
        # Each entry is one pair's own sum: splitting the rows between threads
        # leaves every value as it is.
        l1_distances(
            pred[start:stop], truth, mask[start:stop] if mask.size else mask, out[start:stop]
        )

    # Thousands of perturbations x thousands of genes is minutes of work: spread it.
    n_blocks = threads.count if pred.shape[0] * truth.size > 1 << 24 else 1
    threads.run_ranges(fill, threads.even_bounds(pred.shape[0], n_blocks))
    return out


@dataclass(frozen=True)
class ShiftedTruths:
    """A stack of truths made ready for squared Euclidean distances to predictions.

    Built once by :func:`shifted_truths` and used for every candidate's stack by
    :func:`sqeuclidean_to_truths`.

    Attributes
    ----------
    rows
        The distinct truth rows (in the order :func:`numpy.unique` sorts rows),
        less their mean.
    index
        For every truth row, the position of its distinct row.
    shift
        The mean subtracted (of the distinct rows).
    norms
        Squared norms of ``rows``, as a ``1 x n`` row.

    """

    rows: Float64Array
    index: npt.NDArray[np.intp]
    shift: Float64Array
    norms: Float64Array


def shifted_truths(truth: npt.ArrayLike, *, overwrite: bool = False) -> ShiftedTruths:
    """The distinct rows of a truth stack, shifted by their mean (see :class:`ShiftedTruths`).

    A common shift leaves distances unchanged and shrinks the cancellation error of
    the expansion ``||p||^2 + ||t||^2 - 2 p.t``.

    Parameters
    ----------
    truth
        ``n x features`` matrix.
    overwrite
        ``truth`` (a C-contiguous float64 array) may be overwritten: its distinct rows
        are then gathered and shifted where they lie instead of in a copy.

    Returns
    -------
    ShiftedTruths

    Raises
    ------
    DegenerateInput
        If ``truth`` has non-finite values.

    """
    rows, index = _distinct_rows(as_matrix(truth, "truths"), overwrite)
    shift = rows.mean(axis=0)
    rows -= shift
    norms = np.einsum("ij,ij->i", rows, rows)[None, :]
    return ShiftedTruths(rows=rows, index=index, shift=shift, norms=norms)


def sqeuclidean_to_truths(
    pred: npt.ArrayLike, truths: ShiftedTruths, *, overwrite_pred: bool = False
) -> Float64Array:
    """``D[i, j] = ||pred_i - truth_j||^2``, as :func:`distance_matrix` computes it.

    Parameters
    ----------
    pred
        ``n x features`` matrix of predictions.
    truths
        The truths, from :func:`shifted_truths`.
    overwrite_pred
        ``pred`` (a C-contiguous float64 array) may be overwritten.

    Returns
    -------
    numpy.ndarray
        ``(len(pred), n_truths)`` float64 matrix; identical rows of ``pred`` get
        identical rows, bit for bit.

    Raises
    ------
    ValueError
        If the numbers of features differ.
    DegenerateInput
        If ``pred`` has non-finite values.

    """
    p = as_matrix(pred, "predictions")
    if p.shape[1] != truths.rows.shape[1]:
        raise ValueError(
            f"predictions have {p.shape[1]} features but truths have {truths.rows.shape[1]}"
        )
    rows, index = _distinct_rows(p, overwrite_pred)
    rows -= truths.shift
    unique = _expanded_sqeuclidean(rows, truths.rows, truths.norms)
    return unique[np.ix_(index, truths.index)]


def distance_matrix(
    pred: npt.ArrayLike,
    truth: npt.ArrayLike,
    *,
    distance: Distance = "sqeuclidean",
    keep: npt.ArrayLike | None = None,
    threads: Threads | None = None,
) -> Float64Array:
    """Distances ``D[i, j] = d(pred_i, truth_j)`` between all rows.

    Parameters
    ----------
    pred, truth
        Matrices with the same number of columns (rows are perturbations).
    distance
        ``"sqeuclidean"`` (``||p - t||^2``), ``"l1"`` (``sum |p - t|``) or ``"cosine"``
        (``1 - cos(p, t)``; a zero vector is at distance 1 from everything).
    keep
        Optional 0/1 matrix shaped like ``pred``: row ``i`` of ``D`` is computed over
        the columns where ``keep[i]`` is 1 only (in both ``pred_i`` and every
        ``truth_j``).
    threads
        The run's kernel threads for the L1 distances (its own for the call when
        omitted).

    Returns
    -------
    numpy.ndarray
        ``(len(pred), len(truth))`` float64 matrix. Rows of ``pred`` (with their
        ``keep`` row) that are identical get identical rows of ``D``, bit for bit; so do
        identical rows of ``truth`` in the columns of ``D``.

    Raises
    ------
    ValueError
        If the shapes do not match or ``distance`` is unknown.
    DegenerateInput
        If an input has non-finite values.

    """
    if distance not in _DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; valid: {', '.join(_DISTANCES)}")
    p = as_matrix(pred, "predictions")
    t = as_matrix(truth, "truths")
    if p.shape[1] != t.shape[1]:
        raise ValueError(f"predictions have {p.shape[1]} features but truths have {t.shape[1]}")
    mask: Float64Array | None = None
    if keep is not None:
        mask = np.asarray(keep, dtype=np.float64)
        if mask.shape != p.shape:
            raise ValueError(f"keep has shape {mask.shape}, predictions {p.shape}")
    if distance == "l1":
        # Each pair's own compiled sum, in a fixed order: identical rows get identical
        # distances wherever they are, so there are no repeats to look for.
        return _l1_distances(p, t, mask, threads or Threads())
    # BLAS may round identical rows differently depending on their position; computing
    # each distinct row once makes ties between identical rows exact.
    if distance == "sqeuclidean" and mask is None:
        return sqeuclidean_to_truths(p, shifted_truths(t))
    kept_pred, pred_index = _unique_rows(p, mask)
    kept_truth, truth_index = _unique_rows(t)
    unique_mask = None if mask is None else mask[kept_pred]
    unique = _distances_of_unique(p[kept_pred], t[kept_truth], unique_mask, distance)
    return unique[np.ix_(pred_index, truth_index)]


# ------------------------------------------------------------------- from distances


def _square(distances: npt.ArrayLike) -> Float64Array:
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distances must be a square matrix, got shape {d.shape}")
    if d.shape[0] < 2:
        raise DegenerateInput(
            f"rank metrics need at least 2 perturbations in a covariate group, got {d.shape[0]}"
        )
    if np.isnan(d).any():
        raise DegenerateInput("distance matrix contains NaN")
    return d


def _competitors(distances: npt.ArrayLike, axis: int, of_others: bool = True) -> Float64Array:
    """Along ``axis``, the other entries at most the diagonal one, as a share.

    Axis 0: for each truth j, predictions i != j at distance <= d(pred_j, truth_j);
    axis 1: for each prediction i, truths j != i at distance <= d(pred_i, truth_i).
    The count is divided by ``n - 1`` (``of_others``) or ``n``.
    """
    d = _square(distances)
    counts = (d <= np.expand_dims(np.diag(d), axis)).sum(axis=axis) - 1
    return counts.astype(np.float64) / (d.shape[0] - 1 if of_others else d.shape[0])


def rank_from_distances(distances: npt.ArrayLike) -> Float64Array:
    """Reference-centric rank from ``D[i, j] = d(pred_i, truth_j)``; see :func:`rank`.

    Raises
    ------
    DegenerateInput
        If there are fewer than 2 perturbations or ``D`` has NaN.

    """
    return _competitors(distances, 0)


def transpose_rank_from_distances(distances: npt.ArrayLike) -> Float64Array:
    """Transpose rank from ``D[i, j] = d(pred_i, truth_j)``; see :func:`transpose_rank`.

    Raises
    ------
    DegenerateInput
        If there are fewer than 2 perturbations or ``D`` has NaN.

    """
    return _competitors(distances, 1)


def nir_from_distances(distances: npt.ArrayLike) -> Float64Array:
    """NIR from ``D[i, j] = d(pred_i, truth_j)``; see :func:`nir`.

    Raises
    ------
    DegenerateInput
        If there are fewer than 2 perturbations or ``D`` has NaN.

    Examples
    --------
    >>> nir_from_distances([[1, 2, 3], [0.5, 1, 4], [2, 1.5, 1]])
    array([1. , 0.5, 1. ])

    """
    d = _square(distances)
    farther = (d > np.diag(d)[:, None]).sum(axis=1)
    return farther / (d.shape[0] - 1.0)


def pds_from_distances(distances: npt.ArrayLike) -> Float64Array:
    """Perturbation discrimination score from ``D[i, j] = d(pred_i, truth_j)``; see :func:`pds`.

    Raises
    ------
    DegenerateInput
        If there are fewer than 2 perturbations or ``D`` has NaN.

    """
    return 1.0 - _competitors(distances, 1, of_others=False)


# --------------------------------------------------------------------------- metrics


def _register(description: str, **meta: Any) -> Decorator:
    """Register a dataset-scope centroid metric under its function's name."""
    return register_metric(description, representation="centroid", scope="dataset", **meta)


def prediction_truth_distances(
    gt: npt.ArrayLike, pred: npt.ArrayLike, distance: Distance = DEFAULT_DISTANCE
) -> Float64Array:
    """``D[i, j] = d(pred_i, truth_j)`` of two stacks, as :func:`rank` computes it.

    :func:`rank`, :func:`transpose_rank` and :func:`nir` are functions of this
    matrix alone (``*_from_distances``): a run computes it once for the three.

    Parameters
    ----------
    gt, pred
        ``n x features`` matrices; row ``i`` of both is perturbation ``i``.
    distance
        ``"sqeuclidean"`` (default), ``"l1"`` or ``"cosine"``; see :func:`distance_matrix`.

    Returns
    -------
    numpy.ndarray
        The ``n x n`` distances.

    Raises
    ------
    DegenerateInput
        If either matrix has non-finite values.

    """
    truth, prediction = _matrix_pair(gt, pred)
    return distance_matrix(prediction, truth, distance=distance)


def _matrix_pair(gt: npt.ArrayLike, pred: npt.ArrayLike) -> tuple[Float64Array, Float64Array]:
    truth = as_matrix(gt, "truths")
    prediction = as_matrix(pred, "predictions")
    if truth.shape != prediction.shape:
        raise ValueError(
            f"truths have shape {truth.shape} but predictions {prediction.shape}; "
            "row i of each must be the same perturbation"
        )
    return truth, prediction


@_register(
    "reference-centric rank of each prediction among all predictions (PerturBench)",
    better="lower",
    perfect=0.0,
    from_distances=rank_from_distances,
)
def rank(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    ctx: DatasetContext | None = None,
    *,
    distance: Distance = DEFAULT_DISTANCE,
) -> Float64Array:
    """Rank of each perturbation's prediction among all predictions, seen from its truth.

    For truth ``j``: ``#{i != j : d(pred_i, truth_j) <= d(pred_j, truth_j)} / (n - 1)``
    (Wu et al., PerturBench). Ties count against the prediction.

    Parameters
    ----------
    gt, pred
        ``n x features`` matrices; row ``i`` of both is perturbation ``i``.
    ctx
        Unused; accepted for the common metric signature.
    distance
        ``"sqeuclidean"`` (default), ``"l1"`` or ``"cosine"``; see :func:`distance_matrix`.

    Returns
    -------
    numpy.ndarray
        ``n`` values in [0, 1]; lower is better, 0 is perfect (the own prediction is
        the strictly closest one). A constant predictor gets 1 everywhere.

    Raises
    ------
    DegenerateInput
        If there are fewer than 2 perturbations or non-finite values.

    """
    return rank_from_distances(prediction_truth_distances(gt, pred, distance))


@_register(
    "rank of each truth among all truths, seen from its prediction",
    better="lower",
    perfect=0.0,
    from_distances=transpose_rank_from_distances,
)
def transpose_rank(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    ctx: DatasetContext | None = None,
    *,
    distance: Distance = DEFAULT_DISTANCE,
) -> Float64Array:
    """Rank of each perturbation's truth among all truths, seen from its prediction.

    For prediction ``i``: ``#{j != i : d(pred_i, truth_j) <= d(pred_i, truth_i)} / (n - 1)``.
    Ties count against the prediction.

    Parameters
    ----------
    gt, pred
        ``n x features`` matrices; row ``i`` of both is perturbation ``i``.
    ctx
        Unused; accepted for the common metric signature.
    distance
        ``"sqeuclidean"`` (default), ``"l1"`` or ``"cosine"``; see :func:`distance_matrix`.

    Returns
    -------
    numpy.ndarray
        ``n`` values in [0, 1]; lower is better, 0 is perfect. A constant predictor has
        mean 0.5 (chance) when no two truths are equidistant from it.

    Raises
    ------
    DegenerateInput
        If there are fewer than 2 perturbations or non-finite values.

    """
    return transpose_rank_from_distances(prediction_truth_distances(gt, pred, distance))


@_register(
    "fraction of other truths farther from the prediction than its own (Miller)",
    better="higher",
    perfect=1.0,
    from_distances=nir_from_distances,
)
def nir(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    ctx: DatasetContext | None = None,
    *,
    distance: Distance = DEFAULT_DISTANCE,
) -> Float64Array:
    """Fraction of the other truths strictly farther from each prediction than its own truth.

    For prediction ``i``: ``#{j != i : d(pred_i, truth_j) > d(pred_i, truth_i)} / (n - 1)``,
    which is ``1 - transpose_rank`` (Miller et al. 2025; Systema's centroid accuracy).
    Ties count against the prediction.

    Parameters
    ----------
    gt, pred
        ``n x features`` matrices; row ``i`` of both is perturbation ``i``.
    ctx
        Unused; accepted for the common metric signature.
    distance
        ``"sqeuclidean"`` (default), ``"l1"`` or ``"cosine"``; see :func:`distance_matrix`.

    Returns
    -------
    numpy.ndarray
        ``n`` values in [0, 1]; higher is better, 1 is perfect. A constant predictor has
        mean 0.5 (chance) when no two truths are equidistant from it.

    Raises
    ------
    DegenerateInput
        If there are fewer than 2 perturbations or non-finite values.

    """
    return nir_from_distances(prediction_truth_distances(gt, pred, distance))


@_register(
    "perturbation discrimination score, target genes excluded (Virtual Cell Challenge)",
    better="higher",
    perfect=1.0,
    needs=("target_features",),
)
def pds(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    ctx: DatasetContext | None = None,
    *,
    distance: Distance = "l1",
    exclude_targets: bool = True,
) -> Float64Array:
    """Perturbation discrimination score of the Virtual Cell Challenge.

    For prediction ``i``, the distances ``d_i(pred_i, truth_j)`` are computed over all
    features except perturbation ``i``'s target genes (``ctx.target_features[i]``),
    and ``PDS_i = 1 - r_i / n`` with
    ``r_i = #{j != i : d_i(pred_i, truth_j) <= d_i(pred_i, truth_i)}``, the number of
    other truths at least as close as the right one (ties count against the
    prediction). The inputs should be deltas against the control, as in the challenge.

    Parameters
    ----------
    gt, pred
        ``n x features`` matrices of deltas; row ``i`` of both is perturbation ``i``.
    ctx
        Context whose ``target_features`` name the columns to leave out per row;
        required when ``exclude_targets`` is true.
    distance
        ``"l1"`` (default, the challenge's choice), ``"sqeuclidean"`` or ``"cosine"``.
    exclude_targets
        Leave each row's target-gene columns out of its distances.

    Returns
    -------
    numpy.ndarray
        ``n`` values in [1/n, 1]; higher is better, 1 is perfect. A constant predictor
        has mean ``(n + 1) / (2 n)`` (chance) when no two truths are equidistant from it.

    Raises
    ------
    ValueError
        If ``exclude_targets`` is true and ``ctx`` is missing or has target features
        for another number of rows.
    DegenerateInput
        If there are fewer than 2 perturbations or non-finite values.

    """
    truth, prediction = _matrix_pair(gt, pred)
    keep = None
    if exclude_targets:
        if ctx is None:
            raise ValueError("pds needs a DatasetContext with target_features to exclude")
        if len(ctx.target_features) != truth.shape[0]:
            raise ValueError(
                f"context has target features for {len(ctx.target_features)} perturbations, "
                f"the matrices have {truth.shape[0]} rows"
            )
        rows = [i for i, targets in enumerate(ctx.target_features) for _ in targets]
        columns = [t for targets in ctx.target_features for t in targets]
        if any(c >= truth.shape[1] for c in columns):
            raise ValueError(
                f"target feature index {max(columns)} outside the {truth.shape[1]} features"
            )
        if rows:
            keep = np.ones_like(prediction)
            keep[rows, columns] = 0.0
    return pds_from_distances(distance_matrix(prediction, truth, distance=distance, keep=keep))
