"""Differential expression of every perturbation at once, from group statistics.

Welch's t-test needs only each group's count, mean and variance per gene, so
the statistics of every perturbation (and of its leave-one-out reference, by
subtraction) come from one pass over the data; see :mod:`scperteval.stats.groups`.

Conventions, chosen to match scanpy's ``rank_genes_groups``:

- variances use ``ddof=1``;
- ``t-test_overestim_var`` replaces the reference's cell count by the target's
  in the reference variance term and in the Welch-Satterthwaite degrees of freedom;
- a gene with zero variance in both groups and equal means has ``t = 0, p = 1``;
  with different means ``t = +-inf`` and ``p = 0`` (the groups are perfectly
  separated; scipy's ``ttest_ind`` and scanpy give the same);
- log fold change is ``log2((expm1(mean_target) + 1e-9) / (expm1(mean_reference) + 1e-9))``
  (the data being log1p-transformed);
- p-values are two-sided and Benjamini-Hochberg adjusted across genes, per
  perturbation (:func:`scperteval.stats.multiple_testing.benjamini_hochberg`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from scipy import special

from scperteval.data.dataset import Condition
from scperteval.kernels.threads import Threads
from scperteval.stats.groups import GroupStats

__all__ = [
    "DEResult",
    "welch_t_test",
    "welch_between",
    "welch_statistic_between",
    "welch_pvalues_between",
    "two_sided_t_pvalues",
    "REFERENCES",
    "log_fold_change",
]

REFERENCES = ("rest", "control")
DE_COLUMNS = (
    "covariate",
    "perturbation",
    "gene",
    "statistic",
    "pvalue",
    "pvalue_adj",
    "log_fold_change",
    "mean_target",
    "mean_reference",
)
#: The per-gene value columns, each an attribute of :class:`DEResult`.
_VALUE_COLUMNS = DE_COLUMNS[3:]


class DEResult:
    """Differential expression of many perturbations over the same genes.

    Every array has shape ``(n_conditions, n_genes)``; row ``k`` belongs to
    ``conditions[k]`` and column ``g`` to ``genes[g]``.

    Raw p-values and log fold changes are needed only to write or show a table,
    not by any metric; they may be given as a zero-argument function, called on
    first access (its value is then kept), so that a cached result does not hold
    them. A fold change left out is computed from the two mean tables.

    Parameters
    ----------
    conditions
        The perturbations, one per row.
    genes
        The genes, one per column.
    statistic
        Test statistics.
    pvalue
        Two-sided p-values, or a function without arguments returning them (it must
        be picklable for a run on a cluster, e.g. a :func:`functools.partial` of a
        module-level function).
    pvalue_adj
        Benjamini-Hochberg adjusted p-values across genes, per row.
    mean_target, mean_reference
        Mean expression of each row's target and reference cells.
    log_fold_change
        :func:`log_fold_change` of the means, or ``None`` to compute it on first
        access.
    method, reference, half
        The DE method, the reference cells (``rest`` or ``control``) and the
        target cells (``all``, ``truth`` or ``duplicate``).

    """

    def __init__(
        self,
        conditions: tuple[Condition, ...],
        genes: pd.Index,
        statistic: np.ndarray,
        pvalue: np.ndarray | Callable[[], np.ndarray],
        pvalue_adj: np.ndarray,
        mean_target: np.ndarray,
        mean_reference: np.ndarray,
        log_fold_change: np.ndarray | None = None,
        method: str = "t-test",
        reference: str = "rest",
        half: str = "all",
    ) -> None:
        self.conditions = conditions
        self.genes = genes
        self.statistic = statistic
        self.pvalue_adj = pvalue_adj
        self.mean_target = mean_target
        self.mean_reference = mean_reference
        self.method = method
        self.reference = reference
        self.half = half
        self._pvalue = pvalue
        self._log_fold_change = log_fold_change
        self._lock = threading.Lock()

    @property
    def pvalue(self) -> np.ndarray:
        """Two-sided p-values before adjustment."""
        with self._lock:
            if callable(self._pvalue):
                self._pvalue = np.asarray(self._pvalue())
            return self._pvalue

    @property
    def log_fold_change(self) -> np.ndarray:
        """Log2 fold change of the target over the reference (:func:`log_fold_change`)."""
        with self._lock:
            if self._log_fold_change is None:
                self._log_fold_change = log_fold_change(self.mean_target, self.mean_reference)
            return self._log_fold_change

    def __repr__(self) -> str:
        n_conditions, n_genes = self.statistic.shape
        return (
            f"DEResult({self.method}, reference={self.reference!r}, half={self.half!r}, "
            f"{n_conditions} perturbations x {n_genes} genes)"
        )

    def __getstate__(self) -> dict[str, Any]:
        # A lock belongs to one process; the deferred columns travel as they are.
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def row(self, covariate: str, perturbation: str) -> int:
        """Row index of a condition; ``KeyError`` naming it when absent."""
        for k, condition in enumerate(self.conditions):
            if condition.covariate == covariate and condition.perturbation == perturbation:
                return k
        raise KeyError(f"no DE result for perturbation {perturbation!r} in group {covariate!r}")

    def for_condition(self, covariate: str, perturbation: str, genes: Any = None) -> pd.DataFrame:
        """One condition's result, indexed by gene (optionally reindexed by name)."""
        k = self.row(covariate, perturbation)
        frame = pd.DataFrame(
            {name: getattr(self, name)[k] for name in _VALUE_COLUMNS}, index=self.genes
        )
        if genes is not None:
            wanted = pd.Index(np.asarray(genes).astype(str))
            missing = wanted.difference(frame.index)
            if len(missing):
                raise KeyError(f"genes not in the DE result: {', '.join(missing[:10].tolist())}")
            frame = frame.loc[wanted]
        return frame

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per (covariate, perturbation, gene)."""
        n_conditions, n_genes = self.statistic.shape
        covariates = np.array([c.covariate for c in self.conditions], dtype=object)
        perturbations = np.array([c.perturbation for c in self.conditions], dtype=object)
        return pd.DataFrame(
            {
                "covariate": pd.Categorical(np.repeat(covariates, n_genes)),
                "perturbation": pd.Categorical(np.repeat(perturbations, n_genes)),
                "gene": pd.Categorical.from_codes(
                    np.tile(np.arange(n_genes), n_conditions), categories=self.genes
                ),
                **{name: getattr(self, name).ravel() for name in _VALUE_COLUMNS},
            },
            columns=list(DE_COLUMNS),
        )


def welch_t_test(
    n_target: np.ndarray,
    mean_target: np.ndarray,
    var_target: np.ndarray,
    n_reference: np.ndarray,
    mean_reference: np.ndarray,
    var_reference: np.ndarray,
    overestimate_variance: bool = False,
    threads: Threads | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Welch's two-sided t-test from group moments, vectorised.

    Parameters
    ----------
    n_target, n_reference
        Cell counts, broadcastable against the means (e.g. shape ``(P, 1)``).
    mean_target, mean_reference
        Group means per gene.
    var_target, var_reference
        Group variances per gene (``ddof=1``).
    overestimate_variance
        Use the target's cell count in place of the reference's (scanpy's
        ``t-test_overestim_var``).
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    tuple of numpy.ndarray
        t statistics and two-sided p-values, with the zero-variance rules of the
        module docstring.

    Examples
    --------
    >>> import numpy as np
    >>> t, p = welch_t_test(np.array(3.), np.array(2.), np.array(1.), np.array(3.),
    ...                     np.array(1.), np.array(1.))
    >>> round(float(t), 6), round(float(p), 6)
    (1.224745, 0.287864)

    """
    n_ref = n_target if overestimate_variance else n_reference
    with np.errstate(divide="ignore", invalid="ignore"):
        term_target = var_target / n_target
        term_reference = var_reference / n_ref
        variance = term_target + term_reference
        statistic = (mean_target - mean_reference) / np.sqrt(variance)
        dof = variance**2 / (term_target**2 / (n_target - 1) + term_reference**2 / (n_ref - 1))
        pvalue = two_sided_t_pvalues(dof, statistic, threads)
    statistic = np.where(np.isnan(statistic), 0.0, statistic)
    pvalue = np.where(np.isnan(pvalue), np.where(np.isinf(statistic), 0.0, 1.0), pvalue)
    return statistic, pvalue


def welch_statistic_between(
    target: GroupStats,
    reference: GroupStats,
    overestimate_variance: bool = False,
    threads: Threads | None = None,
) -> np.ndarray:
    """The t statistics of :func:`welch_between`, without the costly p-values.

    Parameters
    ----------
    target, reference
        Group statistics; row ``i`` of ``target`` is tested against row ``i`` of
        ``reference``.
    overestimate_variance
        As in :func:`welch_t_test`.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    numpy.ndarray
        The same values as the statistics :func:`welch_between` returns.

    """
    return _welch_rows(target, reference, overestimate_variance, False, threads)[0]


#: Below this many values, one thread computes the p-values.
PARALLEL_PVALUES = 1 << 15


def _run_row_blocks(
    block: Callable[[int, int], Any], n_values: int, n_rows: int, threads: Threads | None
) -> list[Any]:
    """``block(start, stop)`` over row blocks, on parallel threads from :data:`PARALLEL_PVALUES`."""
    threads = threads or Threads()
    blocks = 1 if n_values < PARALLEL_PVALUES else n_rows
    return threads.run_ranges(block, threads.even_bounds(n_rows, blocks))


def two_sided_t_pvalues(
    dof: np.ndarray, statistic: np.ndarray, threads: Threads | None = None
) -> np.ndarray:
    """``2 P(T_dof <= -|t|)`` elementwise: the two-sided p-values of t statistics.

    Computed by a compiled large-``dof`` expansion (see
    :mod:`scperteval.kernels.student_t`) where it reaches full precision, and by
    :func:`scipy.special.stdtr` elsewhere; both agree with high-precision values
    to about ``1e-14`` relative. Large arrays are cut into row blocks computed by
    parallel threads, with the same value for every element whatever the split.

    Parameters
    ----------
    dof, statistic
        Degrees of freedom and t statistics, broadcastable against each other.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    numpy.ndarray
        The p-values (NaN where the inputs are NaN).

    """
    from scperteval.kernels.student_t import tail_probabilities

    dof, statistic = np.broadcast_arrays(np.asarray(dof, dtype=float), statistic)
    if statistic.ndim == 0:
        return 2.0 * special.stdtr(dof, -np.abs(statistic))
    flat_dof = np.ascontiguousarray(dof, dtype=float).reshape(-1)
    flat_statistic = np.ascontiguousarray(statistic, dtype=float).reshape(-1)
    n_rows = statistic.shape[0]
    out = np.empty(flat_statistic.shape)
    per_row = flat_statistic.size // max(n_rows, 1)

    def block(start: int, stop: int) -> None:
        span = slice(start * per_row, stop * per_row)
        if tail_probabilities(flat_dof[span], flat_statistic[span], out[span]):
            left = np.flatnonzero(out[span] < 0.0) + start * per_row
            out[left] = 2.0 * special.stdtr(flat_dof[left], -np.abs(flat_statistic[left]))

    _run_row_blocks(block, flat_statistic.size, n_rows, threads)
    return out.reshape(statistic.shape)


def welch_between(
    target: GroupStats,
    reference: GroupStats,
    overestimate_variance: bool = False,
    threads: Threads | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`welch_t_test` of each group of ``target`` against the same row of ``reference``.

    Parameters
    ----------
    target, reference
        Group statistics with the same number of groups and genes.
    overestimate_variance
        As in :func:`welch_t_test`.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    tuple of numpy.ndarray
        t statistics and two-sided p-values, ``(n_groups, n_genes)``: the values
        of :func:`welch_t_test` on the groups' counts, means and variances,
        computed in one compiled pass.

    """
    return _welch_rows(target, reference, overestimate_variance, True, threads)


def welch_pvalues_between(
    target: GroupStats,
    reference: GroupStats,
    overestimate_variance: bool = False,
    threads: Threads | None = None,
) -> np.ndarray:
    """The two-sided p-values of :func:`welch_between` alone (the same values).

    Parameters
    ----------
    target, reference
        Statistics of the target and reference groups, row by row.
    overestimate_variance
        Scanpy's ``t-test_overestim_var``.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    numpy.ndarray
        P-values, ``(n_groups, n_genes)``.

    """
    return welch_between(target, reference, overestimate_variance, threads)[1]


def _welch_rows(
    target: GroupStats,
    reference: GroupStats,
    overestimate_variance: bool,
    with_pvalues: bool,
    threads: Threads | None,
) -> tuple[np.ndarray, np.ndarray]:
    from scperteval.kernels.student_t import welch_rows

    if target.mean.shape != reference.mean.shape:
        raise ValueError(
            f"target statistics {target.mean.shape} and reference {reference.mean.shape} differ"
        )
    shape = target.mean.shape
    statistic = np.empty(shape)
    pvalue = np.empty(shape if with_pvalues else (0, 0))
    # A half of each perturbation is every other row of the group statistics:
    # read in place, not copied.
    n_target, mean_target, m2_target = target.contiguous_arrays(strided_rows=True)
    n_reference, mean_reference, m2_reference = reference.contiguous_arrays(strided_rows=True)

    def block(start: int, stop: int) -> None:
        left = welch_rows(
            n_target,
            mean_target,
            m2_target,
            n_reference,
            mean_reference,
            m2_reference,
            overestimate_variance,
            start,
            stop,
            statistic,
            pvalue,
        )
        if left:
            rows = pvalue[start:stop]
            unfinished = np.signbit(rows)
            values = 2.0 * special.stdtr(
                -rows[unfinished], -np.abs(statistic[start:stop][unfinished])
            )
            # Only finite statistics are left here, so welch_t_test's rule reads: NaN -> 1.
            rows[unfinished] = np.where(np.isnan(values), 1.0, values)

    _run_row_blocks(block, int(np.prod(shape)), shape[0], threads)
    return statistic, pvalue


def log_fold_change(
    mean_target: np.ndarray, mean_reference: np.ndarray, threads: Threads | None = None
) -> np.ndarray:
    """Log2 ratio of the back-transformed means, ``expm1`` undoing ``log1p``.

    Parameters
    ----------
    mean_target, mean_reference
        Mean log1p expression, broadcastable against each other.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    numpy.ndarray
        ``log2((expm1(mean_target) + 1e-9) / (expm1(mean_reference) + 1e-9))``;
        large arrays are computed in row blocks by parallel threads, with the
        same values.

    """
    mean_target, mean_reference = np.broadcast_arrays(
        np.asarray(mean_target, dtype=float), np.asarray(mean_reference, dtype=float)
    )
    if mean_target.ndim == 0:
        return np.log2((np.expm1(mean_target) + 1e-9) / (np.expm1(mean_reference) + 1e-9))
    out = np.empty(mean_target.shape)

    def block(start: int, stop: int) -> None:
        part = out[start:stop]
        np.expm1(mean_target[start:stop], out=part)
        part += 1e-9
        reference = np.expm1(mean_reference[start:stop])
        reference += 1e-9
        np.divide(part, reference, out=part)
        np.log2(part, out=part)

    _run_row_blocks(block, mean_target.size, len(mean_target), threads)
    return out
