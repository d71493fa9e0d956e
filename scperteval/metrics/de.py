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

from scperteval.metrics._common import DegenerateInput
from scperteval.metrics._registry import METRICS
from scperteval.metrics.context import PerturbationContext

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

    __slots__ = ("_pending", "_pvalue_adj", "statistic")

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


def _evidence(view: DEView) -> Float64Array:
    """``|statistic|`` with NaN as 0; infinity is kept, and orders above every finite value."""
    return np.nan_to_num(np.abs(view.statistic), nan=0.0, posinf=np.inf)


def dense_ranks(values: npt.ArrayLike) -> Float64Array:
    """Ranks 1, 2, ... of the distinct values, ties sharing one (``rankdata`` "dense").

    Parameters
    ----------
    values
        One-dimensional, without NaN.

    Returns
    -------
    numpy.ndarray
        Float64 ranks, same length.

    """
    _, inverse = np.unique(np.asarray(values), return_inverse=True)
    return inverse.reshape(-1).astype(np.float64) + 1.0


def average_ranks(values: npt.ArrayLike) -> Float64Array:
    """Ranks from 1, ties given the mean of the positions they span (``rankdata`` "average").

    Parameters
    ----------
    values
        One-dimensional, without NaN.

    Returns
    -------
    numpy.ndarray
        Float64 ranks, same length; every value is a multiple of 0.5, so exact.

    """
    values = np.asarray(values).reshape(-1)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    stops = np.r_[starts[1:], values.size]
    ranks = np.empty(values.size)
    ranks[order] = np.repeat((starts + stops + 1) / 2.0, stops - starts)
    return ranks


def _labels_and_scores(
    gt: DEView, pred: DEView, alpha: float
) -> tuple[npt.NDArray[np.bool_], Float64Array]:
    if len(gt) != len(pred):
        raise ValueError(f"truth has {len(gt)} features but prediction has {len(pred)}")
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
    # Ranks replace the scores: both metrics depend only on their order and ties, and
    # ranks keep infinite statistics in order without special cases.
    scores = dense_ranks(_evidence(pred))
    return positive, scores


@METRICS.register(
    "de_auprc",
    description="area under the precision-recall curve of truth DEGs ranked by |predicted t|",
    representation="de",
    scope="perturbation",
    better="higher",
    perfect=1.0,
)
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
    positive, scores = _labels_and_scores(gt, pred, alpha)
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    hits = np.cumsum(positive[order])
    # The last gene of each run of tied scores closes one threshold.
    closes = np.r_[np.flatnonzero(np.diff(sorted_scores)), sorted_scores.size - 1]
    true_positives = hits[closes].astype(np.float64)
    precision = true_positives / (closes + 1)
    recall = true_positives / true_positives[-1]
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


@METRICS.register(
    "de_auroc",
    description="area under the ROC curve of truth DEGs ranked by |predicted t|",
    representation="de",
    scope="perturbation",
    better="higher",
    perfect=1.0,
)
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
    positive, scores = _labels_and_scores(gt, pred, alpha)
    ranks = average_ranks(scores)
    n_positive = int(positive.sum())
    n_negative = positive.size - n_positive
    rank_sum = float(ranks[positive].sum())
    return (rank_sum - n_positive * (n_positive + 1) / 2.0) / (n_positive * n_negative)


@METRICS.register(
    "de_topk_overlap",
    description="fraction of the truth's top-k genes by |t| among the prediction's top k",
    representation="de",
    scope="perturbation",
    better="higher",
    perfect=1.0,
)
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
    if len(gt) != len(pred):
        raise ValueError(f"truth has {len(gt)} features but prediction has {len(pred)}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k!r}")
    n_features = len(gt)
    if k >= n_features:
        raise DegenerateInput(
            f"k={k} is not smaller than the {n_features} features: every prediction "
            "would overlap fully"
        )
    index = np.arange(n_features)
    truth_top = np.zeros(n_features, dtype=bool)
    truth_top[np.lexsort((index, -_evidence(gt)))[:k]] = True
    # lexsort sorts by the last key first: score, then truth-top membership (False
    # before True), then index.
    pred_order = np.lexsort((index, truth_top, -_evidence(pred)))
    return float(truth_top[pred_order[:k]].sum()) / k
