"""Registered differential expression methods.

Each method is ``f(context, target, reference, reference_kind, half)`` returning
per-condition statistics and two-sided p-values, shape ``(n_conditions, n_genes)``;
``target`` and ``reference`` are the moments of each condition's target cells
and of its reference cells. Register another method with
``DE_METHODS.register(name, description=...)`` to make it available to
``Context.de``, the ``de`` command and DE-based spaces and weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from scperteval.diffexp import welch_between
from scperteval.registry import Registry
from scperteval.stats import GroupStats

if TYPE_CHECKING:
    from scperteval.context import Context

__all__ = ["DE_METHODS"]

DE_METHODS = Registry("DE method")


@DE_METHODS.register("t-test", description="Welch's t-test from group moments")
def welch(
    context: Context, target: GroupStats, reference: GroupStats, reference_kind: str, half: str
) -> tuple[np.ndarray, np.ndarray]:
    """Welch's t-test of every condition against its reference."""
    return welch_between(target, reference)


@DE_METHODS.register(
    "t-test_overestim_var",
    description="scanpy's t-test with the target's cell count in the reference term",
)
def welch_overestimated_variance(
    context: Context, target: GroupStats, reference: GroupStats, reference_kind: str, half: str
) -> tuple[np.ndarray, np.ndarray]:
    """Scanpy's ``t-test_overestim_var``: ``n_reference`` replaced by ``n_target``."""
    return welch_between(target, reference, overestimate_variance=True)


@DE_METHODS.register(
    "wilcoxon", description="Mann-Whitney U test (tie-corrected normal approximation)"
)
def wilcoxon(
    context: Context, target: GroupStats, reference: GroupStats, reference_kind: str, half: str
) -> tuple[np.ndarray, np.ndarray]:
    """Mann-Whitney U test on the cells (reads them; slower than the t-tests)."""
    from scperteval._wilcoxon import wilcoxon_all

    return wilcoxon_all(context, reference_kind, half)
