"""The differential-expression metrics of cell-eval (the Virtual Cell Challenge evaluator).

Each perturbation of the truth and of a candidate is summarised by its DE against the
control cells (Wilcoxon rank-sum, Benjamini-Hochberg FDR over all genes, log2 fold
change of the back-transformed geometric means): a :class:`ControlDE`. A gene is
*significant* when its FDR is below ``alpha`` (0.05). The definitions follow cell-eval
0.8.2 value for value, including its rules for the corner cases:

- DE tables are stored in float32 (cell-eval casts them on loading), so FDRs and fold
  changes are compared and ranked at float32 precision;
- a log2 fold change of ``0/0`` is 0; infinite fold changes (a gene absent from one
  side) are kept and rank above every finite one;
- genes tied in ``|log2 fold change|`` keep their gene order (an ordinal rank);
- every ranking compares :func:`~scperteval.stats.ranking.ranking_keys` of the scores,
  as the default suite does, so that its order is a function of the numbers alone;
- a perturbation without truth DEGs scores 0 on the overlap and precision metrics, NaN
  on the AUCs, and has no value (:class:`~scperteval.metrics.DegenerateInput`) on the
  direction, Spearman and recall metrics, which cell-eval leaves out of its table.

Perturbation-scope metrics take two :class:`ControlDE`; the dataset-scope ones
(:func:`spearman_nsig`, :func:`pearson_edistance`) take one entry per perturbation and
return the same value for every row, as cell-eval repeats a dataset-level value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from scperteval.metrics.common import METRICS, Decorator, DegenerateInput
from scperteval.metrics.de import _average_precision, _roc_auc
from scperteval.metrics.metric_context import DatasetContext, PerturbationContext
from scperteval.stats.ranking import ranking_keys

__all__ = [
    "ControlDE",
    "check_options",
    "control_log2_fold_change",
    "top_significant",
    "overlap_at_k",
    "precision_at_k",
    "de_pr_auc",
    "de_roc_auc",
    "direction_match",
    "spearman_lfc_sig",
    "sig_genes_recall",
    "nsig_count",
    "spearman_nsig",
    "pearson_edistance",
]

Float64Array = npt.NDArray[np.float64]
#: FDR floor of the AUC scores: ``-log10`` of a zero FDR would be infinite.
FDR_FLOOR = 1e-10


def control_log2_fold_change(
    mean_target: npt.ArrayLike, mean_reference: npt.ArrayLike
) -> Float64Array:
    """Log2 ratio of the geometric means of two groups of log1p values, without pseudocount.

    ``log2(expm1(m_t) / expm1(m_r))`` where ``m`` is the mean log1p expression
    (``expm1`` of it is the geometric mean of ``x + 1``, less 1); ``0 / 0`` is 0 and a
    one-sided zero gives ``+-inf``: the fold change cell-eval's DE step reports.

    Parameters
    ----------
    mean_target, mean_reference
        Mean log1p expression per gene, broadcastable against each other.

    Returns
    -------
    numpy.ndarray
        Float64 log2 fold changes.

    """
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.log2(
            np.expm1(np.asarray(mean_target, dtype=np.float64))
            / np.expm1(np.asarray(mean_reference, dtype=np.float64))
        )
    return np.where(np.isnan(values), 0.0, values)


class ControlDE:
    """One perturbation's DE against the control, as cell-eval stores it.

    Parameters
    ----------
    log2_fold_change
        Log2 fold change per gene (see :func:`control_log2_fold_change`).
    fdr
        Benjamini-Hochberg adjusted p-value per gene; NaN is never significant.

    Raises
    ------
    ValueError
        If the arrays are not 1-D or differ in length.

    """

    __slots__ = ("fdr", "log2_fold_change")

    def __init__(self, log2_fold_change: npt.ArrayLike, fdr: npt.ArrayLike) -> None:
        # float32 storage is part of the definition: it decides ties and thresholds.
        self.log2_fold_change = np.asarray(log2_fold_change, dtype=np.float32)
        self.fdr = np.asarray(fdr, dtype=np.float32)
        if self.log2_fold_change.ndim != 1 or self.fdr.ndim != 1:
            raise ValueError("log2 fold changes and FDRs must be one-dimensional")
        if self.log2_fold_change.shape != self.fdr.shape:
            raise ValueError(f"{self.log2_fold_change.size} fold changes but {self.fdr.size} FDRs")

    def __len__(self) -> int:
        return int(self.fdr.size)

    def significant(self, alpha: float = 0.05) -> npt.NDArray[np.bool_]:
        """Mask of genes with ``fdr < alpha`` (NaN counts as not significant)."""
        return np.asarray(self.fdr < np.float32(alpha))


def check_options(k: int | None = None, alpha: float = 0.05, side: str = "pred") -> None:
    """Check the options of a cell-eval metric before a run (the registry's ``check``).

    Parameters
    ----------
    k
        Cut-off of the overlap and precision metrics: None or an integer of at least 1.
    alpha
        FDR threshold, in (0, 1].
    side
        ``"real"`` or ``"pred"`` (:func:`nsig_count`).

    Raises
    ------
    ValueError
        Naming the first invalid option.

    """
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"k must be an integer of at least 1 or None, got {k!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha <= 1:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha!r}")
    if side not in ("real", "pred"):
        raise ValueError(f"side must be 'real' or 'pred', got {side!r}")


def _register(name: str, description: str, **meta: Any) -> Decorator:
    """Register a cell-eval metric with the defaults below; a None in ``meta`` drops a key."""
    defaults = {"representation": "control_de", "scope": "perturbation", "better": "higher"}
    meta = {**defaults, "perfect": 1.0, "check": check_options, **meta}
    return METRICS.register(
        name, description=description, **{k: v for k, v in meta.items() if v is not None}
    )


def _pair(gt: ControlDE, pred: ControlDE) -> None:
    if len(gt) != len(pred):
        raise ValueError(f"truth has {len(gt)} genes but prediction has {len(pred)}")


def top_significant(view: ControlDE, alpha: float = 0.05) -> npt.NDArray[np.intp]:
    """Indices of the significant genes, by decreasing ``|log2 fold change|``.

    Ties keep gene order; infinite values come first; a NaN (not produced by
    :func:`control_log2_fold_change`) sorts as the largest value, as in polars.

    Parameters
    ----------
    view
        A DE table.
    alpha
        FDR threshold.

    Returns
    -------
    numpy.ndarray
        Gene indices.

    """
    genes = np.flatnonzero(view.significant(alpha))
    magnitude = np.abs(view.log2_fold_change[genes]).astype(np.float64)
    magnitude = ranking_keys(np.where(np.isnan(magnitude), np.inf, magnitude))
    # -inf sorts first; a stable sort keeps gene order among ties.
    return genes[np.argsort(-magnitude, kind="stable")]


def _overlap(gt: ControlDE, pred: ControlDE, k: int | None, alpha: float, by: str) -> float:
    _pair(gt, pred)
    if k is not None and int(k) < 1:
        raise ValueError(f"k must be at least 1 or None, got {k!r}")
    real = top_significant(gt, alpha)
    predicted = top_significant(pred, alpha)
    size = (real if by == "real" else predicted).size
    k_eff = size if not k else min(int(k), size)
    if k_eff == 0:
        return 0.0
    return float(np.intersect1d(real[:k_eff], predicted[:k_eff]).size) / k_eff


@_register(
    "cell_eval_overlap",
    "cell-eval overlap_at_N: top truth DEGs by |log2FC| found among the predicted",
)
def overlap_at_k(
    gt: ControlDE,
    pred: ControlDE,
    ctx: PerturbationContext | None = None,
    *,
    k: int | None = None,
    alpha: float = 0.05,
) -> float:
    """Overlap of the top significant genes by ``|log2 FC|`` (cell-eval ``overlap_at_N``).

    With ``R`` and ``P`` the truth's and the prediction's significant genes ranked by
    ``|log2 FC|`` and ``k_eff = min(k, |R|)`` (``|R|`` when ``k`` is None, the
    challenge's DES), the value is ``|R[:k_eff] & P[:k_eff]| / k_eff``; 0 when the
    truth has no significant gene.

    Parameters
    ----------
    gt, pred
        Truth and predicted DE tables against the control.
    ctx
        Unused; accepted for the common metric signature.
    k
        Cut-off, or None for the number of truth DEGs.
    alpha
        FDR threshold of significance.

    Returns
    -------
    float
        In [0, 1]; higher is better.

    """
    return _overlap(gt, pred, k, alpha, "real")


@_register(
    "cell_eval_precision",
    "cell-eval precision_at_N: top predicted DEGs by |log2FC| that are truth DEGs",
)
def precision_at_k(
    gt: ControlDE,
    pred: ControlDE,
    ctx: PerturbationContext | None = None,
    *,
    k: int | None = None,
    alpha: float = 0.05,
) -> float:
    """Precision of the top significant predicted genes (cell-eval ``precision_at_N``).

    As :func:`overlap_at_k` with ``k_eff = min(k, |P|)`` (``|P|`` when ``k`` is None):
    ``|R[:k_eff] & P[:k_eff]| / k_eff``, 0 when the prediction has no significant gene.

    Parameters
    ----------
    gt, pred
        Truth and predicted DE tables against the control.
    ctx
        Unused; accepted for the common metric signature.
    k
        Cut-off, or None for the number of predicted DEGs.
    alpha
        FDR threshold of significance.

    Returns
    -------
    float
        In [0, 1]; higher is better.

    """
    return _overlap(gt, pred, k, alpha, "pred")


def _auc_inputs(gt: ControlDE, pred: ControlDE) -> tuple[npt.NDArray[np.bool_], Float64Array]:
    """The truth's DEG labels and the predicted scores, by decreasing score."""
    _pair(gt, pred)
    labels = gt.significant(0.05)
    fdr = np.where(np.isnan(pred.fdr), np.float32(1.0), pred.fdr)
    fdr = np.clip(fdr, np.float32(FDR_FLOOR), np.float32(1.0))
    # -log10 at float32, as cell-eval computes it on its float32 column.
    scores = ranking_keys((-np.log10(fdr)).astype(np.float64))
    order = np.argsort(-scores, kind="stable")
    return labels[order], scores[order]


@_register(
    "cell_eval_pr_auc",
    "cell-eval pr_auc: average precision of truth DEGs scored by predicted -log10 FDR",
    check=None,
)
def de_pr_auc(gt: ControlDE, pred: ControlDE, ctx: PerturbationContext | None = None) -> float:
    """Average precision of the truth's DEGs (FDR < 0.05) scored by ``-log10`` predicted FDR.

    The predicted FDR is clipped to ``[1e-10, 1]`` (a missing one counts as 1); the
    value is :func:`sklearn.metrics.average_precision_score` of those scores: the sum
    over distinct score thresholds, from the highest, of recall increment times
    precision. NaN when the truth has no DEG or only DEGs.

    Parameters
    ----------
    gt, pred
        Truth and predicted DE tables against the control.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    float
        In [0, 1]; higher is better.

    """
    labels, scores = _auc_inputs(gt, pred)
    n_positive = int(labels.sum())
    if n_positive == 0 or n_positive == labels.size:
        return float("nan")
    return _average_precision(labels, scores)


@_register(
    "cell_eval_roc_auc",
    "cell-eval roc_auc: ROC AUC of truth DEGs scored by predicted -log10 FDR",
    check=None,
)
def de_roc_auc(gt: ControlDE, pred: ControlDE, ctx: PerturbationContext | None = None) -> float:
    """Area under the ROC curve of the truth's DEGs scored by ``-log10`` predicted FDR.

    Scores as in :func:`de_pr_auc`; the value is the probability that a random DEG
    scores above a random non-DEG, ties counting one half (the trapezoidal area of
    :func:`sklearn.metrics.roc_curve`). NaN when the truth has no DEG or only DEGs.

    Parameters
    ----------
    gt, pred
        Truth and predicted DE tables against the control.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    float
        In [0, 1]; higher is better, 0.5 is chance.

    """
    labels, scores = _auc_inputs(gt, pred)
    n_positive = int(labels.sum())
    if n_positive == 0 or n_positive == labels.size:
        return float("nan")
    return _roc_auc(labels, scores)


def _truth_degs(gt: ControlDE, pred: ControlDE, alpha: float) -> npt.NDArray[np.intp]:
    _pair(gt, pred)
    genes = np.flatnonzero(gt.significant(alpha))
    if genes.size == 0:
        raise DegenerateInput(
            f"the truth has no DE gene at FDR < {alpha}: the perturbation has no value"
        )
    return genes


@_register(
    "cell_eval_direction_match",
    "cell-eval de_direction_match: truth DEGs whose log2FC sign the prediction has",
)
def direction_match(
    gt: ControlDE, pred: ControlDE, ctx: PerturbationContext | None = None, *, alpha: float = 0.05
) -> float:
    """Fraction of the truth's DEGs whose predicted log2 fold change has the same sign.

    Signs are -1, 0 or 1 (a zero fold change matches only zero).

    Parameters
    ----------
    gt, pred
        Truth and predicted DE tables against the control.
    ctx
        Unused; accepted for the common metric signature.
    alpha
        FDR threshold of the truth's DEGs.

    Returns
    -------
    float
        In [0, 1]; higher is better.

    Raises
    ------
    DegenerateInput
        If the truth has no DEG.

    """
    genes = _truth_degs(gt, pred, alpha)
    real = np.sign(gt.log2_fold_change[genes])
    predicted = np.sign(pred.log2_fold_change[genes])
    return float(np.mean(real == predicted))


def _spearman(x: Float64Array, y: Float64Array) -> float:
    if x.size < 2:
        return float("nan")
    from scipy import stats

    # Average ranks; a NaN (never produced by the DE step) ranks with +inf.
    return _correlation(
        *(stats.rankdata(ranking_keys(np.where(np.isnan(v), np.inf, v))) for v in (x, y))
    )


def _correlation(x: Float64Array, y: Float64Array) -> float:
    """Pearson correlation; NaN when a side is constant."""
    dx, dy = x - x.mean(), y - y.mean()
    denominator = float(np.sqrt(np.dot(dx, dx) * np.dot(dy, dy)))
    return float(np.dot(dx, dy)) / denominator if denominator else float("nan")


@_register(
    "cell_eval_spearman_lfc_sig",
    "cell-eval de_spearman_lfc_sig: Spearman of log2FC on the truth's DEGs",
)
def spearman_lfc_sig(
    gt: ControlDE, pred: ControlDE, ctx: PerturbationContext | None = None, *, alpha: float = 0.05
) -> float:
    """Spearman correlation of truth and predicted log2 fold changes on the truth's DEGs.

    Average ranks for ties (infinite fold changes rank at the ends); NaN with fewer
    than two DEGs or a constant side.

    Parameters
    ----------
    gt, pred
        Truth and predicted DE tables against the control.
    ctx
        Unused; accepted for the common metric signature.
    alpha
        FDR threshold of the truth's DEGs.

    Returns
    -------
    float
        In [-1, 1]; higher is better.

    Raises
    ------
    DegenerateInput
        If the truth has no DEG.

    """
    genes = _truth_degs(gt, pred, alpha)
    return _spearman(
        gt.log2_fold_change[genes].astype(np.float64),
        pred.log2_fold_change[genes].astype(np.float64),
    )


@_register(
    "cell_eval_sig_genes_recall",
    "cell-eval de_sig_genes_recall: truth DEGs that are also predicted DEGs",
)
def sig_genes_recall(
    gt: ControlDE, pred: ControlDE, ctx: PerturbationContext | None = None, *, alpha: float = 0.05
) -> float:
    """Fraction of the truth's DEGs that are significant in the prediction too.

    Parameters
    ----------
    gt, pred
        Truth and predicted DE tables against the control.
    ctx
        Unused; accepted for the common metric signature.
    alpha
        FDR threshold of significance on both sides.

    Returns
    -------
    float
        In [0, 1]; higher is better.

    Raises
    ------
    DegenerateInput
        If the truth has no DEG.

    """
    genes = _truth_degs(gt, pred, alpha)
    return float(pred.significant(alpha)[genes].sum()) / genes.size


@_register(
    "cell_eval_nsig_count",
    "cell-eval de_nsig_counts: number of significant genes of the truth or candidate",
    perfect=0.0,
)
def nsig_count(
    gt: ControlDE,
    pred: ControlDE,
    ctx: PerturbationContext | None = None,
    *,
    side: str = "pred",
    alpha: float = 0.05,
) -> float:
    """Number of genes with FDR below ``alpha`` on one side (cell-eval ``de_nsig_counts``).

    A descriptive count, not a score: cell-eval gives it no best value and leaves it
    out of its baseline-scaled score.

    Parameters
    ----------
    gt, pred
        Truth and predicted DE tables against the control.
    ctx
        Unused; accepted for the common metric signature.
    side
        ``"real"`` (the truth's count, ``de_nsig_counts_real``) or ``"pred"``.
    alpha
        FDR threshold.

    Returns
    -------
    float
        The count.

    Raises
    ------
    ValueError
        If ``side`` is neither ``"real"`` nor ``"pred"``.

    """
    _pair(gt, pred)
    check_options(side=side)
    return float((gt if side == "real" else pred).significant(alpha).sum())


@_register(
    "cell_eval_spearman_sig",
    "cell-eval de_spearman_sig: Spearman over perturbations of the DEG counts",
    scope="dataset",
)
def spearman_nsig(
    gt: Sequence[ControlDE],
    pred: Sequence[ControlDE],
    ctx: DatasetContext | None = None,
    *,
    alpha: float = 0.05,
) -> Float64Array:
    """Spearman correlation across perturbations of the truth's and the prediction's DEG counts.

    Only perturbations with at least one truth DEG take part; 1.0 when none has one
    (cell-eval's convention), NaN with a single one. The value is repeated for every
    perturbation.

    Parameters
    ----------
    gt, pred
        One DE table per perturbation, in the same order.
    ctx
        Unused; accepted for the common metric signature.
    alpha
        FDR threshold.

    Returns
    -------
    numpy.ndarray
        One (equal) value per perturbation.

    Raises
    ------
    ValueError
        If the sequences differ in length.

    """
    if len(gt) != len(pred):
        raise ValueError(f"{len(gt)} truth tables but {len(pred)} predicted ones")
    real, predicted = (
        np.array([v.significant(alpha).sum() for v in side], float) for side in (gt, pred)
    )
    keep = real > 0
    value = 1.0 if not keep.any() else _spearman(real[keep], predicted[keep])
    return np.full(len(gt), value)


@_register(
    "cell_eval_pearson_edistance",
    "cell-eval pearson_edistance: Pearson over perturbations of energy distances to the control",
    representation="control_edistance",
    scope="dataset",
    check=None,
)
def pearson_edistance(
    gt: npt.ArrayLike, pred: npt.ArrayLike, ctx: DatasetContext | None = None
) -> Float64Array:
    """Pearson correlation across perturbations of each side's energy distance to its control.

    Parameters
    ----------
    gt, pred
        One energy distance per perturbation (truth cells vs control cells, candidate
        cells vs control cells), in the same order.
    ctx
        Unused; accepted for the common metric signature.

    Returns
    -------
    numpy.ndarray
        One (equal) value per perturbation; NaN for fewer than two perturbations or a
        side that is constant up to rounding (spread at most :data:`CONSTANT_TOLERANCE`
        times its largest magnitude).

    Raises
    ------
    ValueError
        If the inputs are not 1-D of one length.

    """
    x = np.asarray(gt, dtype=np.float64)
    y = np.asarray(pred, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"need two 1-D arrays of one length, got {x.shape} and {y.shape}")
    value = float("nan")
    finite = x.size >= 2 and np.isfinite(x).all() and np.isfinite(y).all()
    if finite and not (_constant(x) or _constant(y)):
        value = _correlation(x, y)
    return np.full(x.size, value)


#: Spread, relative to the largest magnitude, below which values count as equal.
CONSTANT_TOLERANCE = 1e-9


def _constant(values: Float64Array) -> bool:
    """Whether values are equal up to rounding.

    A prediction that is the same for every perturbation (a mean baseline) has the
    same energy distance to the control everywhere in exact arithmetic; rounding
    alone must not turn that into a correlation.
    """
    spread = float(values.max() - values.min())
    return spread <= CONSTANT_TOLERANCE * float(np.abs(values).max())
