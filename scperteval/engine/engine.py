"""The :class:`Engine`: shared, cached inputs of every protocol on one dataset."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import scipy.sparse as sp

from scperteval._memo import BoundedStore
from scperteval.context import Context
from scperteval.data.halves import derive_seed
from scperteval.data.matrix_io import is_dask
from scperteval.engine.fold_de import TrainingReference, training_de
from scperteval.engine.folds import FoldPlan
from scperteval.engine.pairs import pair_backend
from scperteval.engine.population_cap import (
    DEFAULT_MAX_POPULATION_CELLS,
    Subsampled,
    check_max_population_cells,
)
from scperteval.engine.sources import SOURCES
from scperteval.stats.diffexp import DEResult
from scperteval.stats.groups import GroupStats, merge_groups, subtract_group

if TYPE_CHECKING:
    from scperteval.engine.featuremap import FeatureMap
    from scperteval.kernels.threads import Threads
    from scperteval.splits.split import Split

__all__ = ["Engine"]

T = TypeVar("T")

DEFAULT_SAMPLE_CELLS = 8192
DEFAULT_PCA_CELLS = 10_000
#: Largest sample matrix in a shared feature space kept in memory (bytes).
SAMPLE_POINTS_BYTES = 256 * 2**20
#: Memory for stored pairwise distances of samples (see :mod:`scperteval.engine.fastpath`).
PAIR_STORE_BYTES = 1024 * 2**20
#: Memory bound for the mapped cells kept for the next population protocol (bytes).
POPULATION_POINTS_BYTES = 64 * 2**20
#: Memory bound for the prediction-truth distance matrices that rank metrics of one
#: space and centering share (bytes; 500 perturbations: 2 MB per candidate).
DATASET_DISTANCES_BYTES = 64 * 2**20
#: Memory bound for the statistics of samples without a perturbation's cells, kept
#: for the perturbation's next protocols (bytes).
SAMPLE_WITHOUT_BYTES = 16 * 2**20


def _owned_bytes(stats: GroupStats) -> int:
    """Bytes of the statistics' own arrays (views of cached tables count nothing)."""
    return sum(a.nbytes for a in (stats.n, stats.mean, stats.m2) if a.base is None)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


class Engine:
    """Everything protocols share on one dataset, computed once and cached.

    Parameters
    ----------
    context
        The dataset's :class:`~scperteval.context.Context` (group statistics, DE).
    truth
        ``"half"``: the truth is each perturbation's truth half and the
        technical duplicate is available (calibration, calibrated scores);
        ``"all"``: the truth is all of its cells (plain scores).
    sample_cells
        Cap on the shared sample of perturbed cells and of control cells.
    pca_cells
        Cap on the cells a PCA space is fitted on.
    device
        Where the population fast path sums over pairs of cells: ``None`` (default)
        for NumPy, the reference; ``"cpu"`` or ``"cuda"`` for torch (see
        :func:`~scperteval.engine.pairs.pair_backend`). Sinkhorn runs on the same
        torch device.
    precision
        ``"float64"`` (default) or ``"float32"`` (torch devices only).
    max_population_cells
        Cells a population protocol uses of each population at most, drawn by the
        seeded rule of :mod:`scperteval.engine.population_cap`; ``None``: all cells.

    """

    def __init__(
        self,
        context: Context,
        truth: str = "half",
        sample_cells: int = DEFAULT_SAMPLE_CELLS,
        pca_cells: int = DEFAULT_PCA_CELLS,
        device: str | None = None,
        precision: str = "float64",
        max_population_cells: int | None = DEFAULT_MAX_POPULATION_CELLS,
    ) -> None:
        if truth not in ("half", "all"):
            raise ValueError(f"truth must be 'half' or 'all', got {truth!r}")
        self.context = context
        self.truth_half = "truth" if truth == "half" else "all"
        self.sample_cells = int(sample_cells)
        self.pca_cells = int(pca_cells)
        self.device = device
        self.precision = precision
        self.max_population_cells = check_max_population_cells(max_population_cells)
        #: Populations the cap cut during the runs on this engine (see ``population_cap``).
        self.subsampled_populations: set[Subsampled] = set()
        #: Computes the population fast path's sums over pairs of cells.
        self.pairs = pair_backend(device, precision, context.threads)
        self._pair_store = BoundedStore(PAIR_STORE_BYTES)
        #: Cells of a source mapped to a space, shared by the protocols on that space
        #: (see :func:`population_points`).
        self._points_store = BoundedStore(POPULATION_POINTS_BYTES)
        self._sample_without_store = BoundedStore(SAMPLE_WITHOUT_BYTES)
        self._distances_store = BoundedStore(DATASET_DISTANCES_BYTES)
        #: Sums over pairs that the run's population protocols will ask for, by space
        #: (see :mod:`scperteval.engine.fastpath`).
        self.pair_plan: dict[str, frozenset[Any]] = {}
        #: The engine's :class:`~scperteval.engine.distributed.ClusterSession` on a dask
        #: cluster, once it was shipped to one.
        self.cluster_session: Any = None
        #: The split's folds on the conditions (see :meth:`use_split`); ``None``: no split.
        self.folds: FoldPlan | None = None
        # Values computed under a split are cached apart from the unsplit ones, so
        # that an unsplit engine on the same context never reads a fold's value.
        self._memo_scope: tuple[str, ...] = ("engine", self.truth_half)

    def __getstate__(self) -> dict[str, Any]:
        # A cluster session belongs to the process that holds its client.
        return {**self.__dict__, "cluster_session": None}

    @property
    def threads(self) -> Threads:
        """The run's kernel threads, claims and scheduling locks (the context's)."""
        return self.context.threads

    @property
    def pair_store_bytes(self) -> int:
        """Memory bound for the stored pairwise distances of cell samples (bytes)."""
        return self._pair_store.max_bytes

    @pair_store_bytes.setter
    def pair_store_bytes(self, value: int) -> None:
        self._pair_store.max_bytes = int(value)

    # --------------------------------------------------------------- basics
    @property
    def seed(self) -> int:
        """The run's seed."""
        return self.context.seed

    @property
    def covariates(self) -> tuple[str, ...]:
        """Covariate group names."""
        return self.context.layout.covariates

    @property
    def genes(self) -> Any:
        """Gene names of the dataset."""
        return self.context.genes

    def memo(self, key: Hashable | None, compute: Callable[[], T]) -> T:
        """Cached value shared by every protocol (thread-safe, computed once).

        With ``key=None`` the value is computed afresh and not kept.
        """
        if key is None:
            return compute()
        return self.context._memo.get((*self._memo_scope, key), compute)

    def covariate_index(self, condition: int) -> int:
        """Index of a condition's covariate group."""
        return int(self.context.layout.condition_covariate[condition])

    def conditions_of(self, covariate: int) -> np.ndarray:
        """Indices of the conditions of one covariate group."""
        return np.flatnonzero(self.context.layout.condition_covariate == covariate)

    # ------------------------------------------------------------------- split
    def use_split(self, split: Split) -> None:
        """Score under ``split``: held-out perturbations only, pooling training ones.

        Call before anything is computed on the engine: the sources pooling other
        perturbations (dataset mean, linear baseline, samples of other perturbed
        cells) then pool the training perturbations of the fold that holds the
        evaluated perturbation out, and only held-out perturbations are scored.

        Parameters
        ----------
        split
            The folds, checked against the data
            (:func:`~scperteval.splits.reading.read_split`).

        """
        self.folds = FoldPlan.build(split, self.context.layout)
        self._memo_scope = ("engine", self.truth_half, "split", split.digest())

    def scored_conditions(self) -> np.ndarray:
        """Indices of the conditions scored: all, or those a fold of the split holds out."""
        if self.folds is None:
            return np.arange(self.context.layout.n_conditions)
        return self.folds.scored()

    def candidate_pools(self, covariate: int) -> list[tuple[str | None, np.ndarray]]:
        """The sets of perturbations that rank metrics rank a group's perturbations among.

        Returns
        -------
        list of tuple
            ``(fold, conditions)``: without a split, one pool of every condition of
            the group (fold ``None``); under a split, one per fold that holds some
            of the group out, of its test perturbations, so that a fold's values
            are those of scoring it alone.

        """
        conditions = self.conditions_of(covariate)
        if self.folds is None:
            return [(None, conditions)]
        fold_of = self.folds.fold_of[conditions]
        return [
            (name, conditions[fold_of == index])
            for index, name in enumerate(self.folds.split.folds)
            if np.any(fold_of == index)
        ]

    def training_conditions(self, condition: int) -> np.ndarray:
        """The perturbations pooled for ``condition``: its fold's training ones, in its group.

        Without a split, every other condition of the group (leave-one-out).
        """
        covariate = self.covariate_index(condition)
        if self.folds is None:
            conditions = self.conditions_of(covariate)
            return conditions[conditions != condition]
        return self.folds.training_of(condition, covariate)

    def _fold_key(self, condition: int) -> tuple[str, int]:
        assert self.folds is not None
        return self.folds.fold_name(condition), self.covariate_index(condition)

    # ------------------------------------------------------------ derived data
    def truth_de(self) -> DEResult:
        """DE of the truth (half, or all cells) against its reference (:meth:`de`)."""
        return self.de(self.truth_half)

    def de(self, half: str) -> DEResult:
        """DE of a share of each perturbation's cells against its reference cells.

        The reference is every other perturbed cell of the group (the context's
        ``rest`` DE); under a split, the cells of the training perturbations of the
        fold that holds the perturbation out
        (:func:`~scperteval.engine.fold_de.training_de`, cached per split).
        """
        if self.folds is None:
            return self.context.de(reference="rest", half=half)
        return self.memo(
            ("training_de", half),
            lambda: training_de(self.context, self._training_reference(), half),
        )

    def de_adjusted_pvalues(self, half: str) -> np.ndarray:
        """The adjusted p-values of :meth:`de` (without the rest of an unsplit table)."""
        if self.folds is None:
            return self.context.de_adjusted_pvalues(reference="rest", half=half)
        return self.de(half).pvalue_adj

    def de_origin(self, half: str) -> str | None:
        """``"table"``, ``"computed"`` or ``None`` (to compute) for :meth:`de` of ``half``."""
        if self.folds is None:
            return self.context.de_origin(reference="rest", half=half)
        key = (*self._memo_scope, ("training_de", half))
        return "computed" if key in self.context._memo else None

    def de_reference(self, condition: int) -> GroupStats:
        """One-row moments of the reference cells of a condition's DE (:meth:`de`)."""
        if self.folds is None:
            return self.context.rest_stats().group(condition)
        return self._training_reference().of(condition)

    def _training_reference(self) -> TrainingReference:
        assert self.folds is not None
        folds = self.folds
        return self.memo("training_reference", lambda: TrainingReference(self.context, folds))

    def dataset_mean(self, condition: int) -> np.ndarray:
        """The mean of the centroids of the other perturbations of the condition's group.

        Parameters
        ----------
        condition
            Index of the perturbation (condition).

        Returns
        -------
        numpy.ndarray
            ``(total - own) / (count - 1)`` from the group's cached sum of centroids,
            one value per gene; NaN where the condition is alone in its group. Under a
            split, the mean of the centroids of the fold's training perturbations of
            the group (cached per fold and group).

        """
        if self.folds is not None:
            return self.memo(
                ("training_mean", *self._fold_key(condition)),
                lambda: self._training_mean(condition),
            )
        totals, counts = self.memo("centroid_totals", self._centroid_totals)
        covariate = self.covariate_index(condition)
        own_count = float(counts[covariate]) - 1.0
        if own_count <= 0:
            return np.full(totals.shape[1], np.nan)
        centroid = self.context.centroids("all")[condition]
        return (totals[covariate] - centroid) / own_count

    def _training_mean(self, condition: int) -> np.ndarray:
        training = self.training_conditions(condition)
        centroids = self.context.centroids("all")
        if training.size == 0:
            return _read_only(np.full(centroids.shape[1], np.nan))
        return _read_only(centroids[training].mean(axis=0))

    def training_cell_mean(self, condition: int) -> np.ndarray:
        """Cell-weighted mean of the cells of the condition's pooled perturbations.

        Without a split, the other perturbed cells of the group (the condition's
        "rest"); under a split, the cells of its fold's training perturbations.
        """
        if self.folds is None:
            return np.asarray(self.context.rest_stats().mean[condition])

        def build() -> np.ndarray:
            stats = self.context.condition_stats("all")
            training = self.training_conditions(condition)
            counts = stats.n[training]
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = counts @ stats.mean[training] / counts.sum()
            return _read_only(np.asarray(mean, dtype=np.float64))

        return self.memo(("training_cell_mean", *self._fold_key(condition)), build)

    def _centroid_totals(self) -> tuple[np.ndarray, np.ndarray]:
        layout = self.context.layout
        centroids = self.context.centroids("all")
        totals = np.zeros((len(layout.covariates), centroids.shape[1]))
        np.add.at(totals, layout.condition_covariate, centroids)
        counts = np.bincount(layout.condition_covariate, minlength=len(layout.covariates))
        return _read_only(totals), counts

    def control_mean(self, condition: int) -> np.ndarray:
        """Mean expression of the control cells of a condition's covariate group (read-only).

        The row of ``context.control_means()`` for the condition, without building that
        matrix: a row of a fresh ``(conditions x genes)`` array would keep all of it alive
        for as long as the row is kept (a reference per condition held gigabytes).
        """
        row = self.context.control_stats().mean[self.covariate_index(condition)].view()
        return _read_only(row)

    def covariate_all_stats(self) -> GroupStats:
        """Statistics of all cells (controls and evaluated perturbed) per covariate group."""

        def build() -> GroupStats:
            layout = self.context.layout
            labels = np.concatenate(
                [np.repeat(layout.condition_covariate, 2), np.arange(len(layout.covariates))]
            )
            return merge_groups(
                self.context.group_stats, labels, len(layout.covariates), self.threads
            )

        return self.memo("covariate_all_stats", build)

    def covariate_cells(self, covariate: int, controls: bool = True) -> np.ndarray:
        """Positions of every evaluated cell of a covariate group (its controls unless not)."""
        layout = self.context.layout
        conditions = self.conditions_of(covariate)
        groups = [2 * conditions, 2 * conditions + 1]
        if controls:
            groups.append(np.array([layout.control_group(covariate)]))
        return np.flatnonzero(np.isin(layout.codes, np.concatenate(groups)))

    def target_genes(self, condition: int) -> np.ndarray:
        """Indices of the measured genes named by a condition's perturbation(s)."""

        def build() -> np.ndarray:
            names = self.context.layout.conditions[condition].components
            genes = self.genes
            found = [genes.get_loc(n) for n in names if n in genes]
            return _read_only(np.array(found, dtype=np.int64))

        return self.memo(("target_genes", condition), build)

    def positions(self, condition: int, half: str = "all") -> np.ndarray:
        """Sorted positions of a condition's half (``all``, ``truth``, ``duplicate``); read-only."""
        return self.memo(
            ("positions", condition, half),
            lambda: _read_only(self.context.layout.positions(condition, half)),
        )

    def moments_of(self, positions: np.ndarray) -> GroupStats:
        """One-group statistics of the cells at ``positions`` (distinct)."""
        positions = np.sort(positions)
        resident = self.context.dataset.resident_csr()
        if resident is not None and not np.any(positions[1:] == positions[:-1]):
            # The kernel reads only the rows of the group, in ascending order as
            # from a copy of them: the same sums, without copying the rows.
            codes = np.full(resident.shape[0], -1, dtype=np.int64)
            codes[positions] = 0
            return GroupStats.from_chunk(resident, codes, 1, self.threads.serial())
        return self._rows_moments(self.context.dataset.rows(positions))

    def sample_moments(self, covariate: int, index: np.ndarray) -> GroupStats:
        """One-group statistics of the rows ``index`` (ascending) of the group's sample.

        The same rows as :meth:`moments_of` of their positions, cut from the sample
        kept in memory: a backed file is not read again.
        """
        return self._rows_moments(self.sample_subset_rows(covariate, np.asarray(index)))

    def _rows_moments(self, rows: Any) -> GroupStats:
        codes = np.zeros(rows.shape[0], dtype=np.int64)
        return GroupStats.from_chunk(rows, codes, 1, self.threads.serial())

    def perturbed_sample(self, covariate: int) -> tuple[np.ndarray, GroupStats]:
        """The group's seeded sample of evaluated perturbed cells and its statistics."""

        def build() -> tuple[np.ndarray, GroupStats]:
            pool = self.covariate_cells(covariate, controls=False)
            positions = self.seeded_sample(pool, "perturbed", covariate, self.sample_cells)
            return positions, self.moments_of(positions)

        return self.memo(("perturbed_sample", covariate), build)

    def sample_split(self, condition: int) -> tuple[np.ndarray, np.ndarray]:
        """Where a condition's cells are in its group's perturbed sample.

        Returns
        -------
        tuple of numpy.ndarray
            Indices into the sample's positions of the cells of other conditions
            (the ``all_perturbed_sample`` negative control), and of the condition's
            own cells; both sorted, read-only.

        """
        sample, _ = self.perturbed_sample(self.covariate_index(condition))

        def build() -> np.ndarray:
            own = np.isin(sample, self.positions(condition, "all"), assume_unique=True)
            return _read_only(np.flatnonzero(own))

        own = self.memo(("sample_own", condition), build)
        if self.folds is not None:
            return self._training_sample_rows(condition), own
        return _read_only(np.delete(np.arange(sample.size), own)), own

    def _training_sample_rows(self, condition: int) -> np.ndarray:
        """Rows of the group's perturbed sample from the fold's training perturbations."""
        covariate = self.covariate_index(condition)

        def build() -> np.ndarray:
            sample, _ = self.perturbed_sample(covariate)
            # Codes 2k and 2k + 1 are the two halves of condition k.
            sample_conditions = self.context.layout.codes[sample] // 2
            training = self.training_conditions(condition)
            return _read_only(np.flatnonzero(np.isin(sample_conditions, training)))

        return self.memo(("training_sample_rows", *self._fold_key(condition)), build)

    def sample_without(self, condition: int) -> GroupStats:
        """Statistics of the group's perturbed sample without the condition's cells.

        Under a split, of the sample's cells of the fold's training perturbations.
        """
        if self.folds is not None:
            covariate = self.covariate_index(condition)
            return self.memo(
                ("training_sample_stats", *self._fold_key(condition)),
                lambda: self.sample_moments(covariate, self._training_sample_rows(condition)),
            )

        def build() -> GroupStats:
            covariate = self.covariate_index(condition)
            positions, sample_stats = self.perturbed_sample(covariate)
            pool_size = self.context.condition_stats("all").n[self.conditions_of(covariate)].sum()
            if positions.size == int(pool_size):
                # The sample is every perturbed cell of the group, so without the
                # condition's cells it is exactly the condition's "rest": the same
                # statistics, not a recomputation that differs by rounding (a DE
                # ranking of two identical populations would rank rounding noise).
                return self.context.rest_stats().group(condition)
            _, own = self.sample_split(condition)
            if own.size == 0:
                return sample_stats
            # Cut from the group's cached sample rows: a backed file is then read once
            # per group, not again for every condition.
            return subtract_group(sample_stats, self.sample_moments(covariate, own))

        # Not kept for the whole run (two gene-long rows per perturbation): the tasks
        # that ask for it run perturbation by perturbation, so a few suffice.
        return self._sample_without_store.get(condition, build, _owned_bytes)

    def sample_rows(self, covariate: int) -> Any:
        """Cells x genes rows of the group's perturbed sample (CSR or dense).

        Kept once read where reading is costly (a backed file or a dask array), so
        that the file is read once per group; rows of a matrix in memory are cut
        afresh on each call instead of holding a copy of a large share of it.
        """

        def read() -> Any:
            return self.context.dataset.rows(self.perturbed_sample(covariate)[0])

        return self.memo(("sample_rows", covariate) if self.keeps_sample_rows else None, read)

    def sample_subset_rows(self, covariate: int, index: np.ndarray) -> Any:
        """Rows ``index`` (ascending) of the group's perturbed sample.

        Equal to ``sample_rows(covariate)[index]``: a row's values do not depend
        on the rows read with it. Only these rows are read from a matrix in memory.
        """
        if self.keeps_sample_rows:
            return self.sample_rows(covariate)[index]
        return self.context.dataset.rows(self.perturbed_sample(covariate)[0][index])

    def sample_is_sparse(self, covariate: int) -> bool:
        """Whether the group's sample rows are sparse (CSR) rather than dense; cached."""

        def build() -> bool:
            if self.keeps_sample_rows:
                return sp.issparse(self.sample_rows(covariate))
            # Asked for every population view: one row tells, not the whole sample.
            first = self.perturbed_sample(covariate)[0][:1]
            return sp.issparse(self.context.dataset.rows(first))

        return self.memo(("sample_is_sparse", covariate), build)

    @property
    def keeps_sample_rows(self) -> bool:
        """Whether perturbed samples' rows are kept in memory (a backed or dask matrix)."""
        dataset = self.context.dataset
        return dataset.is_backed or is_dask(dataset.matrix())

    def sample_columns(self, covariate: int) -> Any:
        """The sample's rows by column (CSC), for fast gene selections; cached."""

        def build() -> Any:
            rows = self.sample_rows(covariate)
            return sp.csc_matrix(rows) if sp.issparse(rows) else rows

        return self.memo(("sample_columns", covariate), build)

    def sample_points(self, covariate: int, space: FeatureMap, shared: bool) -> np.ndarray:
        """The group's perturbed sample in a feature space (``space.matrix`` of its rows).

        Each row depends only on its cell, so a subset of these rows is exactly
        what ``space.matrix`` gives for the subset's own rows. In a space shared by
        the group's conditions (``shared``), the matrix is computed once and kept
        (read-only) when it takes at most ``SAMPLE_POINTS_BYTES``.
        """
        n_cells = self.perturbed_sample(covariate)[0].size
        if not shared or 8 * n_cells * space.size > SAMPLE_POINTS_BYTES:
            return self._sample_points(covariate, space)
        return self.memo(
            ("sample_points", covariate, space.label),
            lambda: _read_only(self._sample_points(covariate, space)),
        )

    def _sample_points(self, covariate: int, space: FeatureMap) -> np.ndarray:
        # Gene selections read columns; projections need the rows in their CSR order
        # (a sparse product sums each row's entries in stored order).
        if space.genes is not None:
            return space.matrix(self.sample_columns(covariate))
        return space.matrix(self.sample_rows(covariate))

    def pair_store(self, key: Hashable, build: Callable[[], Any], nbytes: int) -> Any:
        """A large cached value (stored pairwise distances), least recently used first out.

        At most ``pair_store_bytes`` are kept; a value larger than that is built and
        not kept. Building is deterministic, so a value rebuilt after eviction is the
        same.
        """
        return self._pair_store.get(key, build, lambda _: nbytes)

    def dataset_distances(self, key: Hashable, build: Callable[[], np.ndarray]) -> np.ndarray:
        """A covariate group's prediction-truth distance matrix, kept for other protocols.

        Parameters
        ----------
        key
            Identifies the matrix (group, space, centering, distance, candidate).
        build
            Computes it; it must give the same matrix every time.

        Returns
        -------
        numpy.ndarray
            The matrix, read-only; kept while the matrices kept fit in
            :data:`DATASET_DISTANCES_BYTES` (least recently used out).

        """
        return self._distances_store.get(key, lambda: _read_only(build()), lambda a: a.nbytes)

    def population_points(self, key: Hashable, build: Callable[[], np.ndarray]) -> np.ndarray:
        """Cells x features of one source in one space, kept briefly for the next protocol.

        The population protocols on one space (energy distance, MMD, Sinkhorn) read
        the same cells of each source for a perturbation; their tasks run one after
        the other, so the most recent mappings (at most
        :data:`POPULATION_POINTS_BYTES`) are kept rather than read and mapped again.

        Parameters
        ----------
        key
            Identifies the source's cells and the space for the run.
        build
            Maps them (deterministic: a value built again is the same).

        Returns
        -------
        numpy.ndarray
            A read-only array shared by the callers.

        """
        return self._points_store.get(key, lambda: _read_only(build()), lambda a: a.nbytes)

    def control_sample(self, covariate: int) -> tuple[np.ndarray, GroupStats]:
        """The group's seeded sample of control cells and its statistics."""

        def build() -> tuple[np.ndarray, GroupStats]:
            pool = self.context.layout.control_positions(covariate)
            positions = self.seeded_sample(pool, "control", covariate, self.sample_cells)
            return positions, self.moments_of(positions)

        return self.memo(("control_sample", covariate), build)

    def seeded_sample(self, pool: np.ndarray, purpose: str, covariate: int, cap: int) -> np.ndarray:
        """At most ``cap`` positions of ``pool``, drawn by a seed of the run, purpose and group.

        Parameters
        ----------
        pool
            Sorted positions to draw from.
        purpose
            Names the draw (``"perturbed"``, ``"control"``, ``"pca"``), so that draws
            for different purposes are independent.
        covariate
            Index of the covariate group, whose name seeds the draw with the run's seed.
        cap
            Most positions kept.

        Returns
        -------
        numpy.ndarray
            ``pool`` itself when it has at most ``cap`` positions, else ``cap`` of
            them drawn without replacement, sorted.

        """
        if pool.size <= cap:
            return pool
        rng = np.random.default_rng(derive_seed(self.seed, purpose, self.covariates[covariate]))
        return np.sort(rng.choice(pool, cap, replace=False))

    def source(self, name: str, condition: int) -> Any:
        """A registered source's data for one condition (cheap sources are not cached)."""
        return SOURCES.get(name).func(self, condition)
