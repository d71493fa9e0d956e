"""Perturbation-scope metrics on differential-expression results.

The truth's DE result defines which genes are differentially expressed; the
prediction's DE statistic ranks genes by ``|statistic|``. Both are :class:`DEView`
objects aligned by feature. Every metric has the signature
``f(gt, pred, ctx=None, **options) -> float``, and all are higher-is-better with 1
perfect.

Shared rules:

- A gene is a positive when the truth's adjusted p-value is below ``alpha``; a NaN
  p-value is not a positive.
- A NaN statistic (a gene without variance in either group) ranks as ``|t| = 0``, the
  lowest possible evidence; an infinite statistic ranks above every finite one.
- AUPRC and AUROC are undefined when the truth has no positive or no negative gene:
  they raise :class:`~scperteval.metrics.DegenerateInput`, which is recorded as NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from scperteval.metrics.common import Decorator, DegenerateInput, register_metric
from scperteval.metrics.metric_context import PerturbationContext
from scperteval.stats.ranking import ranking_keys

__all__ = ["DEView", "de_auprc", "de_auroc", "de_topk_overlap"]

Float64Array = npt.NDArray[np.float64]


class DEView:
    """The part of a DE result the DE metrics read, aligned by feature.

    Parameters
    ----------
    statistic
        Test statistic per feature (e.g. Welch t); its magnitude ranks the features.
    pvalue_adj
        Multiple-testing adjusted p-value per feature, or a function without
        arguments that returns them: computed on first access then. Only the
        truth's adjusted p-values are read (they define the positives), and exact
        p-values cost far more than the statistics, so a candidate's are never
        computed unless asked for.

    Raises
    ------
    ValueError
        If the arrays are not 1-D or differ in length (for a function: when its
        values are first read).

    """

    __slots__ = ("_descending", "_pending", "_pvalue_adj", "statistic")

    def __init__(
        self,
        statistic: npt.ArrayLike,
        pvalue_adj: npt.ArrayLike | Callable[[], npt.ArrayLike],
    ) -> None:
        self.statistic: Float64Array = np.asarray(statistic, dtype=np.float64)
        if self.statistic.ndim != 1:
            raise ValueError("DE statistic and adjusted p-values must be one-dimensional")
        self._pending: Callable[[], npt.ArrayLike] | None = None
        self._pvalue_adj: Float64Array | None = None
        self._descending: tuple[npt.NDArray[np.intp], Float64Array] | None = None
        if callable(pvalue_adj):
            self._pending = pvalue_adj
        else:
            self._pvalue_adj = self._checked(pvalue_adj)

    def _checked(self, pvalue_adj: npt.ArrayLike) -> Float64Array:
        values = np.asarray(pvalue_adj, dtype=np.float64)
        if values.ndim != 1:
            raise ValueError("DE statistic and adjusted p-values must be one-dimensional")
        if values.shape != self.statistic.shape:
            raise ValueError(
                f"{self.statistic.size} DE statistics but {values.size} adjusted p-values"
            )
        return values

    def ranked(self) -> tuple[npt.NDArray[np.intp], Float64Array]:
        """Features by decreasing evidence ``|statistic|``, and that evidence in this order.

        NaN counts as 0 and infinity above every finite value; evidence is
        rounded to :data:`~scperteval.stats.ranking.RANKING_BITS` significant bits
        so that values equal in exact arithmetic tie, and ties keep feature order.
        Sorted once and kept, since every DE metric ranks the same view.

        Returns
        -------
        order : numpy.ndarray
            Feature indices, most evidence first.
        evidence : numpy.ndarray
            The rounded ``|statistic|`` of those features, non-increasing.

        """
        ranked = self._descending
        if ranked is None:
            # Ranked on rounded evidence: |t| equal in exact arithmetic ties (see
            # ranking_keys), and ties keep feature order.
            evidence = ranking_keys(np.nan_to_num(np.abs(self.statistic), nan=0.0, posinf=np.inf))
            order = np.argsort(-evidence, kind="stable")
            ranked = (order, evidence[order])
            self._descending = ranked
        return ranked

    @property
    def pvalue_adj(self) -> Float64Array:
        """Adjusted p-values per feature (computed now if they were deferred)."""
        values = self._pvalue_adj
        if values is None:
            assert self._pending is not None
            # Two threads racing here compute the same values; either result is kept.
            values = self._checked(self._pending())
            self._pvalue_adj = values
        return values

    def __len__(self) -> int:
        return int(self.statistic.size)


def _positives(gt: DEView, pred: DEView, alpha: float) -> npt.NDArray[np.bool_]:
    """The truth's DE genes (``pvalue_adj < alpha``), checked to leave both classes."""
    _check_same_length(gt, pred)
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha!r}")
    positive = gt.pvalue_adj < alpha
    n_positive = int(positive.sum())
    if n_positive == 0 or n_positive == positive.size:
        kind = "no" if n_positive == 0 else "only"
        raise DegenerateInput(
            f"the truth has {kind} DE genes at adjusted p < {alpha} among {positive.size} "
            "features, so the ranking cannot be scored"
        )
    return positive


def _register(description: str) -> Decorator:
    """Register a DE metric (higher is better, 1 perfect) under its function's name."""
    return register_metric(
        description, representation="de", scope="perturbation", better="higher", perfect=1.0
    )


def _check_same_length(gt: DEView, pred: DEView) -> None:
    if len(gt) != len(pred):
        raise ValueError(f"truth has {len(gt)} features but prediction has {len(pred)}")


def _tie_runs(ordered: Float64Array) -> npt.NDArray[np.intp]:
    """End (exclusive) of each run of equal values in a sorted array."""
    # Compared, not differenced: two infinite scores are tied, their difference is NaN.
    return np.r_[np.flatnonzero(ordered[1:] != ordered[:-1]) + 1, ordered.size]


def _average_precision(positive: npt.NDArray[np.bool_], ordered: Float64Array) -> float:
    """Average precision of labels ranked by scores, highest first; ties share a threshold.

    The value of :func:`sklearn.metrics.average_precision_score`: the sum over distinct
    score thresholds, from the highest, of recall increment times precision.

    Parameters
    ----------
    positive
        Whether each item is a positive, in the order of ``ordered``; at least one is.
    ordered
        The items' scores (ranking keys), in descending order.

    Returns
    -------
    float
        In [0, 1].

    """
    hits = np.cumsum(positive)
    # The last item of each run of tied scores closes one threshold.
    closes = _tie_runs(ordered) - 1
    true_positives = hits[closes].astype(np.float64)
    precision = true_positives / (closes + 1)
    recall = true_positives / true_positives[-1]
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def _roc_auc(positive: npt.NDArray[np.bool_], ordered: Float64Array) -> float:
    """Area under the ROC curve of labels ranked by scores, highest first; ties count half.

    The probability that a random positive scores above a random negative (the
    Mann-Whitney statistic with average ranks for ties).

    Parameters
    ----------
    positive
        Whether each item is a positive, in the order of ``ordered``; at least one is
        and one is not.
    ordered
        The items' scores (ranking keys), in descending order.

    Returns
    -------
    float
        In [0, 1].

    """
    n_items = positive.size
    # A run of tied items at descending positions [start, stop) holds the ascending
    # ranks n - stop + 1 ... n - start, whose mean every item of the run gets.
    stops = _tie_runs(ordered)
    starts = np.r_[0, stops[:-1]]
    hits = np.r_[0, np.cumsum(positive)]
    positives_in_run = hits[stops] - hits[starts]
    # Twice the mean rank is an integer and so is every partial sum: exact in float64.
    twice_rank_sum = float(np.dot(positives_in_run, 2 * n_items + 1 - starts - stops))
    rank_sum = twice_rank_sum / 2.0
    n_positive = int(hits[-1])
    n_negative = n_items - n_positive
    return (rank_sum - n_positive * (n_positive + 1) / 2.0) / (n_positive * n_negative)


@_register("area under the precision-recall curve of truth DEGs ranked by |predicted t|")
def de_auprc(
    gt: DEView, pred: DEView, ctx: PerturbationContext | None = None, *, alpha: float = 0.05
) -> float:
    """Average precision of the truth's DE genes when ranked by the predicted ``|statistic|``.

    ``AP = sum_k (R_k - R_(k-1)) P_k`` over the distinct score thresholds in decreasing
    order, where ``P_k`` and ``R_k`` are precision and recall of the genes scoring at
    least threshold ``k``: the definition of :func:`sklearn.metrics.average_precision_score`
    (no interpolation). Genes tied in score enter together.

    Parameters
    ----------
    gt
        Truth DE result: genes with ``pvalue_adj < alpha`` are the positives.
    pred
        Predicted DE result: ``|statistic|`` is the score.
    ctx
        Unused; accepted for the common metric signature.
    alpha
        Significance level defining the positives.

    Returns
    -------
    float
        In [0, 1]; higher is better, 1 is perfect (every positive ranked above every
        negative). A random ranking scores about the fraction of positives.

    Raises
    ------
    DegenerateInput
        If the truth has no positive or no negative gene.

    """
    positive = _positives(gt, pred, alpha)
    order, evidence = pred.ranked()
    return _average_precision(positive[order], evidence)


@_register("area under the ROC curve of truth DEGs ranked by |predicted t|")
def de_auroc(
    gt: DEView, pred: DEView, ctx: PerturbationContext | None = None, *, alpha: float = 0.05
) -> float:
    """Area under the ROC curve of the truth's DE genes ranked by the predicted ``|statistic|``.

    Computed as the Mann-Whitney probability that a random positive gene scores above a
    random negative one, ties counting one half: the value of
    :func:`sklearn.metrics.roc_auc_score`.

    Parameters
    ----------
    gt
        Truth DE result: genes with ``pvalue_adj < alpha`` are the positives.
    pred
        Predicted DE result: ``|statistic|`` is the score.
    ctx
        Unused; accepted for the common metric signature.
    alpha
        Significance level defining the positives.

    Returns
    -------
    float
        In [0, 1]; higher is better, 1 is perfect, 0.5 is a random or constant ranking.

    Raises
    ------
    DegenerateInput
        If the truth has no positive or no negative gene.

    """
    positive = _positives(gt, pred, alpha)
    order, evidence = pred.ranked()
    return _roc_auc(positive[order], evidence)


@_register("fraction of the truth's top-k genes by |t| among the prediction's top k")
def de_topk_overlap(
    gt: DEView, pred: DEView, ctx: PerturbationContext | None = None, *, k: int = 50
) -> float:
    """Overlap of the top-``k`` genes by ``|statistic|`` in truth and prediction, over ``k``.

    Tie rules: the truth's top ``k`` breaks ties in ``|statistic|`` by feature order
    (lower index first). The prediction's top ``k`` breaks ties against the prediction:
    among genes tied at its cut-off, those outside the truth's top ``k`` are taken
    first, so a prediction cannot gain overlap from genes it does not order (a constant
    statistic scores the smallest overlap possible, ``max(0, 2k - G) / k``).

    Parameters
    ----------
    gt, pred
        Truth and predicted DE results; only ``statistic`` is read.
    ctx
        Unused; accepted for the common metric signature.
    k
        Size of the top sets, at least 1.

    Returns
    -------
    float
        In [0, 1]; higher is better, 1 is perfect.

    Raises
    ------
    ValueError
        If ``k < 1`` or the results differ in length.
    DegenerateInput
        If ``k`` is not smaller than the number of features (the overlap would be 1
        whatever the prediction).

    """
    _check_same_length(gt, pred)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k!r}")
    n_features = len(gt)
    if k >= n_features:
        raise DegenerateInput(
            f"k={k} is not smaller than the {n_features} features: every prediction "
            "would overlap fully"
        )
    truth_top = np.zeros(n_features, dtype=bool)
    truth_top[gt.ranked()[0][:k]] = True
    order, evidence = pred.ranked()
    # Every gene scoring above the k-th highest score is in the prediction's top k;
    # the rest are drawn from the genes tied with it, the truth's top ones last.
    cutoff = evidence[k - 1]
    above = int(np.count_nonzero(evidence > cutoff))
    tied = order[above : above + int(np.count_nonzero(evidence == cutoff))]
    tied_in_truth_top = int(np.count_nonzero(truth_top[tied]))
    taken_from_truth_top = max(0, (k - above) - (tied.size - tied_in_truth_top))
    overlap = int(np.count_nonzero(truth_top[order[:above]])) + taken_from_truth_top
    return float(overlap) / k
