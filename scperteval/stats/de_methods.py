"""Registered differential expression methods.

Each method is ``f(cells, target, reference, reference_kind, half)`` returning
per-condition statistics and two-sided p-values, shape ``(n_conditions, n_genes)``;
``target`` and ``reference`` are the moments of each condition's target cells
and of its reference cells, and ``cells`` (a :class:`CellAccess`, such as the
run's :class:`~scperteval.context.Context`) gives the dataset and the cells'
groups to a method that reads the cells themselves. Register another method with
``DE_METHODS.register(name, description=...)`` to make it available to
``Context.de``, the ``de`` command and DE-based spaces and weights.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from scperteval.data.dataset import Dataset
from scperteval.data.layout import GroupLayout
from scperteval.kernels.threads import Threads
from scperteval.registry import Registry
from scperteval.stats.diffexp import welch_between
from scperteval.stats.groups import GroupStats
from scperteval.stats.rank_test import wilcoxon_all

__all__ = ["DE_METHODS", "WELCH_METHODS", "CellAccess"]

DE_METHODS = Registry("DE method")
#: The methods that are Welch's t-test on the groups' moments (their values follow
#: from the statistics alone, without reading cells).
WELCH_METHODS = ("t-test", "t-test_overestim_var")


class CellAccess(Protocol):
    """What a DE method needs: the dataset, the cells' groups and the run's kernel threads."""

    @property
    def dataset(self) -> Dataset:
        """The dataset whose rows are read."""
        ...  # pragma: no cover

    @property
    def layout(self) -> GroupLayout:
        """Which statistic group each cell belongs to."""
        ...  # pragma: no cover

    @property
    def threads(self) -> Threads:
        """The run's kernel threads."""
        ...  # pragma: no cover


@DE_METHODS.register("t-test", description="Welch's t-test from group moments")
def welch(
    cells: CellAccess, target: GroupStats, reference: GroupStats, reference_kind: str, half: str
) -> tuple[np.ndarray, np.ndarray]:
    """Welch's t-test of every condition against its reference."""
    return welch_between(target, reference, threads=cells.threads)


@DE_METHODS.register(
    "t-test_overestim_var",
    description="scanpy's t-test with the target's cell count in the reference term",
)
def welch_overestimated_variance(
    cells: CellAccess, target: GroupStats, reference: GroupStats, reference_kind: str, half: str
) -> tuple[np.ndarray, np.ndarray]:
    """Scanpy's ``t-test_overestim_var``: ``n_reference`` replaced by ``n_target``."""
    return welch_between(target, reference, overestimate_variance=True, threads=cells.threads)


@DE_METHODS.register(
    "wilcoxon", description="Mann-Whitney U test (tie-corrected normal approximation)"
)
def wilcoxon(
    cells: CellAccess, target: GroupStats, reference: GroupStats, reference_kind: str, half: str
) -> tuple[np.ndarray, np.ndarray]:
    """Mann-Whitney U test on the cells (reads them; slower than the t-tests)."""
    return wilcoxon_all(cells.dataset, cells.layout, reference_kind, half, cells.threads)
