"""Assignment of cells to statistic groups (condition x half, controls per covariate)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from scperteval.data.dataset import Condition, Dataset
from scperteval.data.halves import split_halves

__all__ = ["GroupLayout", "HALVES"]

HALVES = ("all", "truth", "duplicate")


@dataclass(frozen=True)
class GroupLayout:
    """Group codes of every cell.

    Group ``2k`` holds the truth half of condition ``k``, group ``2k + 1`` its
    technical duplicate, and group ``2P + c`` the control cells of covariate
    group ``c`` (``P`` conditions). Cells of perturbations left out by
    ``min_cells`` have code ``-1``.

    Attributes
    ----------
    conditions
        The evaluated conditions, in order.
    covariates
        Covariate group names, in order.
    condition_covariate
        Index into ``covariates`` of each condition.
    codes
        Group code of every kept cell of the dataset.

    """

    conditions: tuple[Condition, ...]
    covariates: tuple[str, ...]
    condition_covariate: np.ndarray
    codes: np.ndarray

    @property
    def n_conditions(self) -> int:
        """Number of conditions ``P``."""
        return len(self.conditions)

    @property
    def n_groups(self) -> int:
        """Total number of groups ``2P + C``."""
        return 2 * len(self.conditions) + len(self.covariates)

    def control_group(self, covariate_index: int) -> int:
        """Group code of the control cells of a covariate group."""
        return 2 * len(self.conditions) + covariate_index

    def positions(self, condition_index: int, half: str = "all") -> np.ndarray:
        """Sorted cell positions of a condition's half (``all``, ``truth``, ``duplicate``)."""
        if half not in HALVES:
            raise ValueError(f"unknown half {half!r}; valid: {', '.join(HALVES)}")
        if half != "all":
            return self._group_cells(2 * condition_index + (half == "duplicate")).copy()
        both = np.concatenate([self._group_cells(2 * condition_index + h) for h in (0, 1)])
        both.sort()
        return both

    def control_positions(self, covariate_index: int) -> np.ndarray:
        """Sorted cell positions of a covariate group's controls."""
        return self._group_cells(self.control_group(covariate_index)).copy()

    def _group_cells(self, code: int) -> np.ndarray:
        """The cells of one group, ascending: a view of the shared order, not to be changed."""
        order, starts = self._cells_by_group
        if not 0 <= code < self.n_groups:
            return order[:0]
        return order[starts[code + 1] : starts[code + 2]]

    @cached_property
    def _cells_by_group(self) -> tuple[np.ndarray, np.ndarray]:
        """Cell positions ordered by group, and where each group starts in that order.

        The sort is stable, so each group's cells are ascending; the cells left out
        (code ``-1``) come first. Built once: finding a group's cells by comparing
        every cell's code costs a pass over all cells, for each of thousands of groups.
        """
        shifted = self.codes + 1
        order = np.argsort(shifted, kind="stable")
        starts = np.searchsorted(shifted[order], np.arange(self.n_groups + 2))
        return order, starts

    def index_of(self, covariate: str, perturbation: str) -> int:
        """Index of a condition; ``KeyError`` naming it when absent."""
        for k, condition in enumerate(self.conditions):
            if condition.covariate == covariate and condition.perturbation == perturbation:
                return k
        raise KeyError(f"no perturbation {perturbation!r} in covariate group {covariate!r}")

    @classmethod
    def build(cls, dataset: Dataset, seed: int) -> GroupLayout:
        """Assign every kept cell of ``dataset`` to its group, splitting halves by ``seed``."""
        conditions = tuple(dataset.conditions)
        covariates = tuple(dataset.covariates)
        covariate_index = {name: i for i, name in enumerate(covariates)}
        codes = np.full(dataset.n_cells, -1, dtype=np.int64)
        covariate_codes, covariate_names = pd.factorize(dataset.covariate_labels)
        perturbation_codes, perturbation_names = pd.factorize(dataset.perturbation_labels)
        covariate_code = {str(name): i for i, name in enumerate(covariate_names)}
        perturbation_code = {str(name): i for i, name in enumerate(perturbation_names)}
        # One integer key per (covariate, perturbation); a stable sort keeps each
        # condition's cells in ascending order.
        keys = covariate_codes.astype(np.int64) * len(perturbation_names) + perturbation_codes
        # numpy sorts 16-bit keys by radix, several times faster than 64-bit ones.
        small = keys.size == 0 or keys.max() < np.iinfo(np.int16).max
        order = np.argsort(keys.astype(np.int16) if small else keys, kind="stable")
        sorted_keys = keys[order]
        for k, condition in enumerate(conditions):
            key = (
                covariate_code[condition.covariate] * len(perturbation_names)
                + perturbation_code[condition.perturbation]
            )
            lo, hi = np.searchsorted(sorted_keys, [key, key + 1])
            truth, duplicate = split_halves(
                order[lo:hi], seed, condition.covariate, condition.perturbation
            )
            codes[truth] = 2 * k
            codes[duplicate] = 2 * k + 1
        controls = dataset.perturbation_labels == dataset.control_label
        # Every covariate group holds cells: the covariates are the labels present.
        for c, name in enumerate(covariates):
            codes[controls & (covariate_codes == covariate_code[name])] = 2 * len(conditions) + c
        condition_covariate = np.array(
            [covariate_index[c.covariate] for c in conditions], dtype=np.int64
        )
        return cls(conditions, covariates, condition_covariate, codes)
