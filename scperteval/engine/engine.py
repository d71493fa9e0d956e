"""The :class:`Engine`: shared, cached inputs of every protocol on one dataset."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np

from scperteval.context import Context
from scperteval.diffexp import DEResult
from scperteval.halves import derive_seed
from scperteval.stats import GroupStats, merge_groups

__all__ = ["Engine"]

T = TypeVar("T")

DEFAULT_SAMPLE_CELLS = 8192
DEFAULT_PCA_CELLS = 10_000


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

    """

    def __init__(
        self,
        context: Context,
        truth: str = "half",
        sample_cells: int = DEFAULT_SAMPLE_CELLS,
        pca_cells: int = DEFAULT_PCA_CELLS,
    ) -> None:
        if truth not in ("half", "all"):
            raise ValueError(f"truth must be 'half' or 'all', got {truth!r}")
        self.context = context
        self.truth_half = "truth" if truth == "half" else "all"
        self.sample_cells = int(sample_cells)
        self.pca_cells = int(pca_cells)

    # --------------------------------------------------------------- basics
    @property
    def seed(self) -> int:
        """The run's seed."""
        return self.context.seed

    @property
    def genes(self) -> Any:
        """Gene names of the dataset."""
        return self.context.genes

    @property
    def covariates(self) -> tuple[str, ...]:
        """Covariate group names."""
        return self.context.layout.covariates

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """Cached value shared by every protocol (thread-safe, computed once)."""
        return self.context._memo.get(("engine", self.truth_half, key), compute)

    def covariate_index(self, condition: int) -> int:
        """Index of a condition's covariate group."""
        return int(self.context.layout.condition_covariate[condition])

    def conditions_of(self, covariate: int) -> np.ndarray:
        """Indices of the conditions of one covariate group."""
        return np.flatnonzero(self.context.layout.condition_covariate == covariate)

    # ------------------------------------------------------------ derived data
    def truth_de(self) -> DEResult:
        """DE of the truth (half, or all cells) against the other perturbed cells."""
        return self.context.de(reference="rest", half=self.truth_half)

    def dataset_means(self) -> np.ndarray:
        """Per condition, the mean of the other perturbations' centroids in its group."""
        return self.memo("dataset_means", self._dataset_means)

    def _dataset_means(self) -> np.ndarray:
        layout = self.context.layout
        centroids = self.context.centroids("all")
        totals = np.zeros((len(layout.covariates), centroids.shape[1]))
        np.add.at(totals, layout.condition_covariate, centroids)
        counts = np.bincount(layout.condition_covariate, minlength=len(layout.covariates))
        own_counts = counts[layout.condition_covariate].astype(np.float64) - 1.0
        with np.errstate(invalid="ignore", divide="ignore"):
            means = (totals[layout.condition_covariate] - centroids) / own_counts[:, None]
        return np.where(own_counts[:, None] > 0, means, np.nan)

    def covariate_all_stats(self) -> GroupStats:
        """Statistics of all cells (controls and evaluated perturbed) per covariate group."""

        def build() -> GroupStats:
            layout = self.context.layout
            labels = np.concatenate(
                [np.repeat(layout.condition_covariate, 2), np.arange(len(layout.covariates))]
            )
            return merge_groups(self.context.group_stats, labels, len(layout.covariates))

        return self.memo("covariate_all_stats", build)

    def covariate_cells(self, covariate: int) -> np.ndarray:
        """Positions of every evaluated cell (controls included) of a covariate group."""
        layout = self.context.layout
        groups = np.concatenate(
            [
                2 * self.conditions_of(covariate),
                2 * self.conditions_of(covariate) + 1,
                [layout.control_group(covariate)],
            ]
        )
        return np.flatnonzero(np.isin(layout.codes, groups))

    def target_genes(self, condition: int) -> np.ndarray:
        """Indices of the measured genes named by a condition's perturbation(s)."""
        names = self.context.layout.conditions[condition].components
        genes = self.genes
        return np.array([genes.get_loc(n) for n in names if n in genes], dtype=np.int64)

    def moments_of(self, positions: np.ndarray) -> GroupStats:
        """One-group statistics of the cells at ``positions``."""
        rows = self.context.dataset.rows(np.sort(positions))
        return GroupStats.from_chunk(rows, np.zeros(rows.shape[0], dtype=np.int64), 1)

    def perturbed_sample(self, covariate: int) -> tuple[np.ndarray, GroupStats]:
        """The group's seeded sample of evaluated perturbed cells and its statistics."""

        def build() -> tuple[np.ndarray, GroupStats]:
            layout = self.context.layout
            groups = np.concatenate(
                [2 * self.conditions_of(covariate), 2 * self.conditions_of(covariate) + 1]
            )
            pool = np.flatnonzero(np.isin(layout.codes, groups))
            positions = self._sample(pool, "perturbed", covariate)
            return positions, self.moments_of(positions)

        return self.memo(("perturbed_sample", covariate), build)

    def control_sample(self, covariate: int) -> tuple[np.ndarray, GroupStats]:
        """The group's seeded sample of control cells and its statistics."""

        def build() -> tuple[np.ndarray, GroupStats]:
            pool = self.context.layout.control_positions(covariate)
            positions = self._sample(pool, "control", covariate)
            return positions, self.moments_of(positions)

        return self.memo(("control_sample", covariate), build)

    def _sample(self, pool: np.ndarray, purpose: str, covariate: int) -> np.ndarray:
        if pool.size <= self.sample_cells:
            return pool
        rng = np.random.default_rng(derive_seed(self.seed, purpose, self.covariates[covariate]))
        return np.sort(rng.choice(pool, self.sample_cells, replace=False))

    def source(self, name: str, condition: int) -> Any:
        """A registered source's data for one condition (cheap sources are not cached)."""
        from scperteval.engine.sources import SOURCES

        return SOURCES.get(name).func(self, condition)
