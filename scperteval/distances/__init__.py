"""Distances between groups of cells, and tests of whether two groups differ.

The ``distances`` layer answers how far each perturbation is from the controls
(:func:`onesided`) or from each other (:func:`pairwise`), in an embedding, a layer
or a space fitted here, within each covariate value, and whether a perturbation
differs from its reference at all (:func:`permutation_test`). The distances carry
pertpy's metric names (:data:`DISTANCES`); where pertpy's value differs from what
its name says, the distance computes what the name says and an option reproduces
pertpy's value (``docs/distances.md``). It owns the distance definitions, their
per-group summaries and the permutation machinery. It may import the engine (for
its PCA), metrics (the population pair sums and Sinkhorn solver), stats, data,
kernels and the foundation modules; reporting, scoring, workflows and the command
line build on it.
"""

from __future__ import annotations

# The distance modules register their distances when imported.
from scperteval.distances import _kernel, _means, _mmd, _models, _perfeature  # noqa: F401
from scperteval.distances._api import distance_input, onesided, pairwise
from scperteval.distances._base import DISTANCES, Distance, Group, resolve_distance
from scperteval.distances._bootstrap import bootstrap, bootstrap_draws
from scperteval.distances._features import GroupedCells, group_cells
from scperteval.distances._figures import distance_figure
from scperteval.distances._permutation import permutation_test, permutations
from scperteval.stats.multiple_testing import CORRECTIONS, adjust

__all__ = [
    "bootstrap",
    "bootstrap_draws",
    "CORRECTIONS",
    "adjust",
    "permutation_test",
    "permutations",
    "DISTANCES",
    "Distance",
    "distance_figure",
    "distance_input",
    "Group",
    "GroupedCells",
    "group_cells",
    "onesided",
    "pairwise",
    "resolve_distance",
]
