"""What is compared with the truth: controls, baselines and the truth itself.

Every source is a registered function ``f(engine, condition_index)`` returning
a :class:`SourceData`: a centroid over all genes and, for sources made of cells,
their positions in the dataset and their moments (for differential expression).
``engine`` offers what :class:`SourceEngine` lists, as the run's
:class:`~scperteval.engine.engine.Engine` does.
Definitions follow the science notes (truth halves and controls):

- leave-one-out sources never contain the evaluated perturbation's cells;
- under a split (:meth:`~scperteval.engine.engine.Engine.use_split`), the sources
  that pool other perturbations pool the training perturbations of the fold that
  holds the evaluated one out (:meth:`SourceEngine.training_conditions`);
- cell samples are seeded from the run seed and the covariate group's name, and
  shared by every perturbation of the group: a perturbation's sample is the
  shared sample without its own cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from scperteval.context import Context
from scperteval.data.halves import derive_seed
from scperteval.engine.folds import FoldPlan
from scperteval.metrics import DegenerateInput
from scperteval.registry import Registry
from scperteval.stats.groups import GroupStats

__all__ = ["SOURCES", "SourceData", "SourceEngine"]

SOURCES = Registry("source")


class SourceEngine(Protocol):
    """The run's derived data that the sources are built from."""

    context: Context
    truth_half: str
    #: The split's folds on the conditions, or ``None`` (no split).
    folds: FoldPlan | None

    @property
    def seed(self) -> int:
        """The run's seed."""
        ...  # pragma: no cover

    def positions(self, condition: int, half: str = "all") -> np.ndarray:
        """Positions of a condition's cells (all, truth half or duplicate)."""
        ...  # pragma: no cover

    def dataset_mean(self, condition: int) -> np.ndarray:
        """Mean of the centroids of the condition's pooled perturbations."""
        ...  # pragma: no cover

    def de_adjusted_pvalues(self, half: str) -> np.ndarray:
        """Adjusted p-values of a half's DE against its reference cells."""
        ...

    def training_cell_mean(self, condition: int) -> np.ndarray:
        """Cell-weighted mean of the cells of the condition's pooled perturbations."""
        ...  # pragma: no cover

    def training_conditions(self, condition: int) -> np.ndarray:
        """The perturbations pooled for a condition (all others, or its fold's training ones)."""
        ...  # pragma: no cover

    def control_mean(self, condition: int) -> np.ndarray:
        """Mean of the condition's covariate group's control cells."""
        ...  # pragma: no cover

    def covariate_index(self, condition: int) -> int:
        """Index of the condition's covariate group."""
        ...  # pragma: no cover

    def perturbed_sample(self, covariate: int) -> tuple[np.ndarray, GroupStats]:
        """The group's shared sample of perturbed cells and its statistics."""
        ...  # pragma: no cover

    def sample_split(self, condition: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the shared sample outside and inside the condition."""
        ...  # pragma: no cover

    def sample_without(self, condition: int) -> GroupStats:
        """Statistics of the shared sample without the condition's cells."""
        ...  # pragma: no cover

    def moments_of(self, positions: np.ndarray) -> GroupStats:
        """One-group statistics of the cells at ``positions``."""
        ...  # pragma: no cover

    def sample_moments(self, covariate: int, index: np.ndarray) -> GroupStats:
        """One-group statistics of the rows ``index`` of the group's perturbed sample."""
        ...  # pragma: no cover

    def control_sample(self, covariate: int) -> tuple[np.ndarray, GroupStats]:
        """The group's seeded sample of control cells and its statistics."""
        ...  # pragma: no cover


@dataclass(frozen=True, eq=False)
class SourceData:
    """A source's data for one perturbation.

    Attributes
    ----------
    centroid
        Mean expression over all genes, shape ``(n_genes,)``.
    positions
        Positions of the source's cells in the dataset, or ``None``.
    rows
        Explicit cells x genes rows (for data not in the dataset, e.g. model
        predictions), or ``None``.
    moments
        One-group statistics of the cells (for DE), or ``None``.
    sample
        ``(covariate index, indices)`` when the cells are the rows at ``indices`` of
        the covariate group's perturbed sample (:meth:`SourceEngine.perturbed_sample`), so
        that views can be cut from the sample's cached views; else ``None``.
    control
        The source's own control cells of the covariate group (a model's predicted
        control, scored with ``control="predicted"``): its deltas against the control,
        its DE and its energy distance to the control are then taken against them.
        ``None`` (every other source) uses the measured control cells.
    half
        ``all``, ``truth`` or ``duplicate`` when the source is that share of the
        perturbation's own cells, whose DE against the rest is then a row of the
        run's DE table of that half; else ``None``.

    """

    centroid: np.ndarray
    positions: np.ndarray | None = None
    rows: Any = None
    moments: GroupStats | None = None
    sample: tuple[int, np.ndarray] | None = None
    control: SourceData | None = None
    half: str | None = None


def _half_source(engine: SourceEngine, condition: int, half: str) -> SourceData:
    context = engine.context
    return SourceData(
        centroid=context.centroids(half)[condition],
        positions=engine.positions(condition, half),
        moments=context.condition_stats(half).group(condition),
        half=half,
    )


@SOURCES.register(
    "truth", description="ground truth: the truth half (all cells with --truth all)", cells=True
)
def truth(engine: SourceEngine, condition: int) -> SourceData:
    """The perturbation's truth half, or all its cells when scoring uncalibrated."""
    return _half_source(engine, condition, engine.truth_half)


@SOURCES.register(
    "technical_duplicate", description="positive control: the other half of the cells", cells=True
)
def technical_duplicate(engine: SourceEngine, condition: int) -> SourceData:
    """The technical duplicate: the perturbation's cells outside the truth half."""
    if engine.truth_half == "all":
        raise DegenerateInput("no technical duplicate when the truth is all cells")
    return _half_source(engine, condition, "duplicate")


@SOURCES.register(
    "interpolated_duplicate",
    description="positive control: duplicate centroid shrunk to the dataset mean by 1 - padj",
    cells=False,
)
def interpolated_duplicate(engine: SourceEngine, condition: int) -> SourceData:
    """``alpha * centroid(duplicate) + (1 - alpha) * dataset mean``, ``alpha = 1 - padj``.

    ``padj`` is the duplicate's DE against the other perturbed cells (under a
    split, the fold's training cells) with the engine's DE method; a non-finite
    ``alpha`` counts as 0.
    """
    if engine.truth_half == "all":
        raise DegenerateInput("no technical duplicate when the truth is all cells")
    context = engine.context
    padj = engine.de_adjusted_pvalues("duplicate")[condition]
    alpha = np.where(np.isfinite(padj), 1.0 - padj, 0.0)
    duplicate = context.centroids("duplicate")[condition]
    return SourceData(centroid=alpha * duplicate + (1.0 - alpha) * engine.dataset_mean(condition))


@SOURCES.register(
    "dataset_mean",
    description="negative control: mean of the other perturbations' centroids",
    cells=False,
)
def dataset_mean(engine: SourceEngine, condition: int) -> SourceData:
    """Mean of the centroids of the group's other perturbations (leave-one-out).

    Under a split: of the group's training perturbations of the condition's fold.
    """
    return SourceData(centroid=engine.dataset_mean(condition))


@SOURCES.register(
    "global_mean", description="mean of all other perturbed cells of the group", cells=False
)
def global_mean(engine: SourceEngine, condition: int) -> SourceData:
    """Cell-weighted mean of the group's other perturbed cells (leave-one-out).

    Under a split: of the cells of the group's training perturbations of the fold.
    """
    return SourceData(centroid=engine.training_cell_mean(condition))


@SOURCES.register(
    "control_mean", description="negative control: mean of the control cells", cells=False
)
def control_mean(engine: SourceEngine, condition: int) -> SourceData:
    """Mean expression of the covariate group's control cells."""
    return SourceData(centroid=engine.control_mean(condition))


def _cells(
    moments: GroupStats, positions: np.ndarray, sample: tuple[int, np.ndarray] | None = None
) -> SourceData:
    """A source made of cells, its centroid the mean of their moments."""
    return SourceData(centroid=moments.mean[0], positions=positions, moments=moments, sample=sample)


def _other_perturbed(engine: SourceEngine, condition: int) -> tuple[int, np.ndarray, np.ndarray]:
    """The condition's group, its perturbed sample, and the indices of other cells in it."""
    covariate = engine.covariate_index(condition)
    sample, _ = engine.perturbed_sample(covariate)
    others, _ = engine.sample_split(condition)
    if others.size < 2:
        raise DegenerateInput("fewer than 2 other perturbed cells to sample from")
    return covariate, sample, others


@SOURCES.register(
    "all_perturbed_sample",
    description="negative control: seeded sample of other perturbed cells (capped)",
    cells=True,
)
def all_perturbed_sample(engine: SourceEngine, condition: int) -> SourceData:
    """The group's shared sample of perturbed cells without this perturbation's cells."""
    covariate, sample, others = _other_perturbed(engine, condition)
    return _cells(engine.sample_without(condition), sample[others], (covariate, others))


@SOURCES.register(
    "matched_perturbed_sample",
    description="negative control: other perturbed cells, as many as the duplicate",
    cells=True,
)
def matched_perturbed_sample(engine: SourceEngine, condition: int) -> SourceData:
    """A seeded subsample of :func:`all_perturbed_sample` the size of the duplicate.

    For estimators whose bias depends on sample size (Sinkhorn), comparing the
    truth with a positive and a negative control of equal size keeps the two
    comparisons on the same footing; it also keeps optimal transport problems small.
    """
    covariate, sample, others = _other_perturbed(engine, condition)
    pool = sample[others]
    size = engine.positions(condition, "duplicate").size
    target = engine.context.layout.conditions[condition]
    if pool.size > size:
        seed = derive_seed(engine.seed, "matched", target.covariate, target.perturbation)
        pool = np.sort(np.random.default_rng(seed).choice(pool, size, replace=False))
    index = np.searchsorted(sample, pool)
    return _cells(engine.sample_moments(covariate, index), pool, (covariate, index))


@SOURCES.register(
    "control_cells",
    description="negative control: seeded sample of control cells (capped)",
    cells=True,
)
def control_cells(engine: SourceEngine, condition: int) -> SourceData:
    """A seeded sample (capped) of the covariate group's control cells."""
    positions, moments = engine.control_sample(engine.covariate_index(condition))
    return _cells(moments, positions)


@SOURCES.register(
    "additive",
    description="baseline for combinations: control mean plus each single's effect",
    cells=False,
)
def additive(engine: SourceEngine, condition: int) -> SourceData:
    """``mu_c + sum_s (mu_s - mu_c)`` over the singles ``s`` of a combination ``A+B``.

    Under a split, every single must be a training perturbation of the
    combination's fold (a held-out single's cells are not known to a model).
    """
    context = engine.context
    layout = context.layout
    target = layout.conditions[condition]
    if not target.is_combination:
        raise DegenerateInput(f"{target.perturbation!r} is not a combination")
    control = engine.control_mean(condition)
    centroid = control.copy()
    centroids = context.centroids("all")
    for single in target.components:
        try:
            index = layout.index_of(target.covariate, single)
        except KeyError:
            raise DegenerateInput(f"single perturbation {single!r} is not in the data") from None
        if engine.folds is not None and index not in engine.training_conditions(condition):
            raise DegenerateInput(f"single perturbation {single!r} is held out in this fold")
        centroid += centroids[index] - control
    return SourceData(centroid=centroid)
