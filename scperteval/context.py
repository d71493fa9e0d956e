"""The :class:`Context`: one dataset and everything derived from it, computed once.

A context owns a :class:`~scperteval.data.dataset.Dataset` and lazily caches the
expensive derived data: the group layout (truth halves), per-group statistics
from one chunked pass, centroids, differential expression and DEG weights.
Every accessor is safe to call from many threads at once: a value is computed
by the first caller and shared (see :class:`~scperteval._memo.Memo`), so
results do not depend on the number of threads.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from scperteval._memo import Memo
from scperteval.data.dataset import Dataset
from scperteval.data.layout import HALVES, GroupLayout
from scperteval.errors import SpecError
from scperteval.kernels.threads import Threads
from scperteval.metrics.weights import deg_weights_from_statistic
from scperteval.stats.de_methods import DE_METHODS, WELCH_METHODS
from scperteval.stats.de_tables import PrecomputedDE
from scperteval.stats.diffexp import REFERENCES, DEResult, welch_pvalues_between
from scperteval.stats.groups import GroupStats, leave_one_out, merge_groups
from scperteval.stats.multiple_testing import benjamini_hochberg

__all__ = ["Context"]

ProgressCallback = Callable[[int, int], None]


class Context:
    """Lazily computed, thread-safe derived data of one dataset.

    Parameters
    ----------
    dataset
        The validated dataset; anything else :func:`~scperteval.data.load.load_dataset`
        reads (an AnnData, a path to an ``.h5ad`` file) is read with its defaults.
    seed
        Seed of every random choice (truth halves, samples).
    de_method
        Default DE method for weights and DEG masks (``t-test``,
        ``t-test_overestim_var`` or ``wilcoxon``).
    deg_threshold
        Adjusted p-value below which a gene is a DEG.
    weight_exponent
        Default exponent of the DEG weights.
    progress
        Optional callback ``(done_cells, total_cells)`` called during the pass
        over the data.
    threads
        The run's kernel threads (:class:`~scperteval.kernels.threads.Threads`),
        shared by the engine built on this context; new ones when omitted.

    """

    def __init__(
        self,
        dataset: Dataset | Any,
        seed: int = 0,
        de_method: str = "t-test",
        deg_threshold: float = 0.05,
        weight_exponent: float = 2.0,
        progress: ProgressCallback | None = None,
        threads: Threads | None = None,
    ) -> None:
        DE_METHODS.get(de_method)
        if not isinstance(dataset, Dataset):
            from scperteval.data.load import load_dataset

            dataset = load_dataset(dataset)
        self.dataset = dataset
        self.seed = int(seed)
        self.de_method = de_method
        self.deg_threshold = float(deg_threshold)
        self.weight_exponent = float(weight_exponent)
        self.progress = progress
        self.threads = threads or Threads()
        self._memo = Memo()
        self._de_tables: dict[tuple[str, str, str], PrecomputedDE] = {}

    # ---------------------------------------------------------------- layout
    @property
    def layout(self) -> GroupLayout:
        """Group codes of every cell, with the seeded truth halves."""
        return self._memo.get("layout", lambda: GroupLayout.build(self.dataset, self.seed))

    @property
    def genes(self) -> Any:
        """Gene names (a :class:`pandas.Index`)."""
        return self.dataset.var_names

    # ------------------------------------------------------------ statistics
    @property
    def group_stats(self) -> GroupStats:
        """Statistics of every group from one chunked pass over the matrix."""
        return self._memo.get("group_stats", self._compute_group_stats)

    @property
    def has_group_stats(self) -> bool:
        """Whether :attr:`group_stats` is computed (or adopted) already."""
        return "group_stats" in self._memo

    def _compute_group_stats(self) -> GroupStats:
        total: GroupStats | None = None
        for positions, block in self.dataset.iter_chunks():
            chunk = self._summarise(positions, block)
            # Combining with the empty statistics changes no value; skipping it
            # spares several full-size temporaries when there is one chunk. Later
            # chunks are folded in place: memory stays at the total plus one chunk.
            if total is None:
                total = chunk
            else:
                total.absorb(chunk)
            if self.progress is not None:
                self.progress(positions.stop, self.dataset.n_cells)
        if total is None:
            return GroupStats.empty(self.layout.n_groups, self.dataset.n_genes)
        return total

    def _summarise(self, positions: slice, block: Any) -> GroupStats:
        layout = self.layout
        return GroupStats.from_chunk(block, layout.codes[positions], layout.n_groups, self.threads)

    def chunk_stats(self, positions: slice) -> GroupStats:
        """Statistics of one chunk of :meth:`Dataset.chunk_slices` (one task of a sharded pass).

        Folding the chunks' statistics in order with :meth:`GroupStats.combine`, from
        :meth:`GroupStats.empty`, gives exactly :attr:`group_stats`.
        """
        return self._summarise(positions, self.dataset.read_chunk(positions))

    def adopt_group_stats(self, stats: GroupStats) -> None:
        """Use group statistics computed elsewhere (merged from :meth:`chunk_stats`).

        Kept only when :attr:`group_stats` has not been computed yet.
        """
        layout = self.layout
        if stats.mean.shape != (layout.n_groups, self.dataset.n_genes):
            raise ValueError(
                f"group statistics of shape {stats.mean.shape} do not fit "
                f"{layout.n_groups} groups x {self.dataset.n_genes} genes"
            )
        self._memo.get("group_stats", lambda: stats)

    def __getstate__(self) -> dict[str, Any]:
        # A progress callback belongs to the process that shows it.
        return {**self.__dict__, "progress": None}

    def condition_stats(self, half: str = "all") -> GroupStats:
        """Statistics of each condition's cells of ``half``, one row per condition."""
        _check_choice("half", half, HALVES)
        return self._memo.get(("condition_stats", half), lambda: self._condition_stats(half))

    def _condition_stats(self, half: str) -> GroupStats:
        n_conditions = self.layout.n_conditions
        if half != "all":
            # Group 2k is condition k's truth half, group 2k + 1 its duplicate.
            return self.group_stats.select(slice(int(half == "duplicate"), 2 * n_conditions, 2))
        return self._merge_halves(np.arange(n_conditions), n_conditions)

    def _merge_halves(self, rows: np.ndarray, n_rows: int) -> GroupStats:
        """Both halves of every condition ``k`` merged into row ``rows[k]``; controls left out."""
        layout = self.layout
        labels = np.full(layout.n_groups, -1, dtype=np.int64)
        labels[: 2 * layout.n_conditions] = np.repeat(rows, 2)
        return merge_groups(self.group_stats, labels, n_rows, self.threads)

    def control_stats(self) -> GroupStats:
        """Statistics of the control cells, one row per covariate group."""
        n_conditions = self.layout.n_conditions
        return self.group_stats.select(slice(2 * n_conditions, None))

    def perturbed_stats(self) -> GroupStats:
        """Statistics of all evaluated perturbed cells, one row per covariate group."""
        layout = self.layout
        return self._memo.get(
            "perturbed_stats",
            lambda: self._merge_halves(layout.condition_covariate, len(layout.covariates)),
        )

    def rest_stats(self) -> GroupStats:
        """Per condition, all other perturbed cells of its covariate group (leave-one-out)."""
        return self._memo.get(
            "rest_stats",
            lambda: leave_one_out(
                self.condition_stats("all"), self.layout.condition_covariate, self.threads
            ),
        )

    # ------------------------------------------------------------- centroids
    def centroids(self, half: str = "all") -> np.ndarray:
        """Per-condition mean expression, shape ``(n_conditions, n_genes)``."""
        return self.condition_stats(half).mean

    def control_means(self) -> np.ndarray:
        """Control mean expression per condition's covariate group, ``(n_conditions, n_genes)``."""
        return self.control_stats().mean[self.layout.condition_covariate]

    # ------------------------------------------------------------------- DE
    def de(self, method: str | None = None, reference: str = "rest", half: str = "all") -> DEResult:
        """Differential expression of every condition (cached).

        Parameters
        ----------
        method
            ``t-test``, ``t-test_overestim_var`` or ``wilcoxon``; the context's
            default when omitted.
        reference
            ``rest`` (other perturbed cells of the covariate group, controls
            excluded) or ``control``.
        half
            Which cells of each perturbation form the target: ``all``, ``truth``
            or ``duplicate``. The ``rest`` reference always excludes all of the
            perturbation's own cells.

        """
        key = self._de_key(method, reference, half)
        compute = self._de_from_table if key in self._de_tables else self._de
        return self._memo.get(("de", *key), lambda: compute(*key))

    def de_adjusted_pvalues(
        self, method: str | None = None, reference: str = "rest", half: str = "all"
    ) -> np.ndarray:
        """The adjusted p-values of :meth:`de`, without keeping the rest of its table.

        The same values as ``de(...).pvalue_adj``. When the table is not at hand
        already, only the p-values are kept (a perturbations x genes array, not three):
        a source that needs nothing else of the table does not hold it for the run.

        Parameters
        ----------
        method, reference, half
            As for :meth:`de`.

        Returns
        -------
        numpy.ndarray
            ``(n_conditions, n_genes)`` adjusted p-values.

        """
        key = self._de_key(method, reference, half)
        if self.de_origin(*key) is not None:
            return self.de(*key).pvalue_adj
        return self._memo.get(("de_pvalue_adj", *key), lambda: self._tested(*key)[4])

    def _de_key(self, method: str | None, reference: str, half: str) -> tuple[str, str, str]:
        """The checked ``(method, reference, half)`` of a DE request."""
        method = method or self.de_method
        DE_METHODS.get(method)
        _check_choice("reference", reference, REFERENCES)
        _check_choice("half", half, HALVES)
        return method, reference, half

    def _tested(
        self, method: str, reference: str, half: str
    ) -> tuple[GroupStats, GroupStats, np.ndarray, np.ndarray | None, np.ndarray]:
        """Target and reference statistics, test statistic, raw and adjusted p-values.

        The Welch methods' raw p-values are adjusted in place and given as ``None``:
        a t-test gives them again from the moments, bit for bit, when asked.
        """
        target, ref = self._de_groups(reference, half)
        statistic, pvalue = DE_METHODS.get(method).func(self, target, ref, reference, half)
        welch = method in WELCH_METHODS
        adjusted = benjamini_hochberg(pvalue, overwrite=welch, threads=self.threads)
        return target, ref, statistic, None if welch else pvalue, adjusted

    def de_origin(
        self, method: str | None = None, reference: str = "rest", half: str = "all"
    ) -> str | None:
        """Where :meth:`de` of these arguments comes from, as of now.

        Parameters
        ----------
        method, reference, half
            As for :meth:`de` (the context's method when ``method`` is omitted).

        Returns
        -------
        str or None
            ``"table"`` when a table given to :meth:`use_de_table` supplies it,
            ``"computed"`` when it was computed from the data already, ``None`` when
            it is still to be computed.

        """
        key = (method or self.de_method, reference, half)
        if key in self._de_tables:
            return "table"
        return "computed" if ("de", *key) in self._memo else None

    def use_de_table(self, table: PrecomputedDE) -> None:
        """Read DE of ``(table.method, table.reference, table.half)`` from ``table``.

        The table (see :func:`~scperteval.stats.de_tables.read_de_table`) replaces the
        computation of that DE wherever the run needs it (spaces, weights, DEG masks,
        DE protocols); its mean columns, when absent, come from the group statistics.

        Raises
        ------
        SpecError
            If DE for the same method, reference and half was computed or given already.

        """
        key = (table.method, table.reference, table.half)
        if ("de", *key) in self._memo or key in self._de_tables:
            raise SpecError(
                f"DE for method {key[0]!r}, reference {key[1]!r}, half {key[2]!r} is given twice"
            )
        self._de_tables[key] = table

    @property
    def de_tables(self) -> list[dict[str, str]]:
        """The precomputed DE tables in use, as recorded in ``run.json``."""
        return [table.record() for table in self._de_tables.values()]

    def _de_groups(self, reference: str, half: str) -> tuple[GroupStats, GroupStats]:
        """Statistics of each condition's target cells and of its reference cells."""
        if reference == "rest":
            return self.condition_stats(half), self.rest_stats()
        control = self.control_stats().select(self.layout.condition_covariate)
        return self.condition_stats(half), control

    def _de_from_table(self, method: str, reference: str, half: str) -> DEResult:
        target, ref = self._de_groups(reference, half)
        return self._de_tables[(method, reference, half)].result(
            self.layout.conditions, self.genes, (target.mean, ref.mean)
        )

    def _de(self, method: str, reference: str, half: str) -> DEResult:
        target, ref, statistic, raw, pvalue_adj = self._tested(method, reference, half)
        # Raw p-values only serve tables written on request: a t-test gives them
        # again from the cached moments instead of holding them.
        overestimate = method == "t-test_overestim_var"
        pvalue = (
            partial(welch_pvalues_between, target, ref, overestimate, self.threads)
            if raw is None
            else raw
        )
        return DEResult(
            conditions=self.layout.conditions,
            genes=self.genes,
            statistic=statistic,
            pvalue=pvalue,
            pvalue_adj=pvalue_adj,
            mean_target=target.mean,
            mean_reference=ref.mean,
            method=method,
            reference=reference,
            half=half,
        )

    def deg_weights(self, exponent: float | None = None, half: str = "truth") -> np.ndarray:
        """DEG weights of every condition (Mejia et al.), shape ``(n_conditions, n_genes)``.

        From the ``rest``-referenced DE of ``half`` with the context's method.
        """
        exponent = self.weight_exponent if exponent is None else float(exponent)
        return self._memo.get(
            ("weights", exponent, half),
            lambda: np.vstack(
                [
                    deg_weights_from_statistic(row, exponent)
                    for row in self.de(reference="rest", half=half).statistic
                ]
            ),
        )

    def deg_mask(self, threshold: float | None = None, half: str = "truth") -> np.ndarray:
        """Boolean DEG mask (adjusted p-value below ``threshold``) per condition and gene."""
        threshold = self.deg_threshold if threshold is None else float(threshold)
        return self.de(reference="rest", half=half).pvalue_adj < threshold


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"unknown {what} {value!r}; valid: {', '.join(choices)}")
