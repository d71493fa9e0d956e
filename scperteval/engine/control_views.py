"""Views against the control cells: cell-eval's DE tables and energy distances.

Two representations compare each side with the control cells of its covariate group
rather than with the truth:

- ``control_de``: a :class:`~scperteval.metrics.cell_eval.ControlDE` per source and
  perturbation: Wilcoxon rank-sum test of the source's cells against the control cells
  (tie-corrected normal approximation), Benjamini-Hochberg over all genes, and the log2
  ratio of the geometric means; then cut to the protocol's genes.
- ``control_edistance``: the energy distance (V-statistic: mean Euclidean distances,
  each cloud's own pairs with the zero diagonal) between the source's cells and the
  control cells, in the protocol's space.

The control cells are the measured ones on both sides, except for a source that
carries its own control (:attr:`~scperteval.engine.sources.SourceData.control`: a
model scored with ``control="predicted"``), which is compared with that control, as
cell-eval does with the control cells of a prediction file. Tables and distances are
computed once per (source, perturbation) and shared by every protocol of the run.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import scipy.sparse as sp

from scperteval.engine.featuremap import FeatureMap
from scperteval.engine.sources import SourceData
from scperteval.metrics import DegenerateInput
from scperteval.metrics.cell_eval import ControlDE, control_log2_fold_change
from scperteval.stats.multiple_testing import benjamini_hochberg
from scperteval.stats.rank_test import ReferenceRankTest

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine

__all__ = ["CONTROL_REPRESENTATIONS", "candidate_reference", "control_de_table", "control_view"]

T = TypeVar("T")

#: Representations whose views compare a source with the control cells.
CONTROL_REPRESENTATIONS = ("control_de", "control_edistance")


def _dense(block: Any) -> np.ndarray:
    return np.asarray(block.toarray() if sp.issparse(block) else block, dtype=np.float64)


def _source_cells(engine: Engine, source: SourceData) -> Any:
    if source.rows is not None:
        return source.rows
    if source.positions is not None:
        return engine.context.dataset.rows(source.positions)
    raise DegenerateInput("a comparison with the control cells needs a source made of cells")


def candidate_reference(
    centering: str, source: SourceData, reference: np.ndarray | None
) -> np.ndarray | None:
    """The reference subtracted from a candidate: its own control mean where it has one.

    Parameters
    ----------
    centering
        The protocol's centering.
    source
        The candidate's data.
    reference
        The reference subtracted from the truth.

    Returns
    -------
    numpy.ndarray or None
        ``source.control``'s centroid for ``control`` centering of a source with its
        own control (deltas against the predicted control), else ``reference``.

    """
    if centering == "control" and source.control is not None:
        return source.control.centroid
    return reference


class _Control:
    """Which control cells a source is compared with, and the key of what is kept of them."""

    def __init__(
        self, engine: Engine, condition: int, own: SourceData | None, cache_key: Hashable | None
    ) -> None:
        self.engine = engine
        self.covariate = engine.covariate_index(condition)
        self.own = own
        # The measured control is shared by the run; a source's own control by its
        # protocols (under its cache key), or by nothing without one.
        if self.own is None:
            self.key: Hashable | None = ("measured", self.covariate)
        else:
            self.key = None if cache_key is None else ("own", cache_key, self.covariate)

    def memo(self, name: str, build: Callable[[], T]) -> T:
        return self.engine.memo(None if self.key is None else (name, self.key), build)

    def cells(self) -> np.ndarray:
        def build() -> np.ndarray:
            if self.own is not None:
                if self.own.rows is None or self.own.rows.shape[0] < 1:
                    raise DegenerateInput("the source's own control has no cells")
                return _dense(self.own.rows)
            positions = self.engine.context.layout.control_positions(self.covariate)
            if positions.size < 1:
                raise DegenerateInput("no control cells in this covariate group")
            return _dense(self.engine.context.dataset.rows(positions))

        return self.memo("control_cells_dense", build)

    def rank_test(self) -> ReferenceRankTest:
        return self.memo(
            "control_rank_test",
            lambda: ReferenceRankTest(self.cells(), threads=self.engine.threads),
        )

    def mean(self) -> np.ndarray:
        return self.memo("control_cells_mean", lambda: self.cells().mean(axis=0))


def control_de_table(
    engine: Engine,
    condition: int,
    cells: Any,
    control: SourceData | None = None,
    control_key: Hashable | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Log2 fold changes and BH-adjusted Wilcoxon p-values of cells vs the control, all genes.

    The p-values are Mann-Whitney U tests of the cells against the control cells,
    sorted once per covariate group
    (:class:`~scperteval.stats.rank_test.ReferenceRankTest`).

    Parameters
    ----------
    engine
        The run's engine (gives the condition's control cells).
    condition
        Condition index: its covariate group's control cells are the reference.
    cells
        Cells x genes (dense or sparse) of the compared source.
    control
        The source's own control cells (``rows``), compared with in place of the
        measured control cells of the covariate group; ``None``: the measured ones.
    control_key
        Identifies ``control`` for the run, so that its sorted cells are kept;
        ``None`` sorts them anew.

    Returns
    -------
    tuple of numpy.ndarray
        ``(log2_fold_change, fdr)`` over all genes.

    Raises
    ------
    DegenerateInput
        If there are no cells.

    """
    n_cells = cells.shape[0]
    if n_cells < 1:
        raise DegenerateInput("no cells to compare with the control")
    # float64 before summing: scipy sums float32 data in float32 whatever its dtype.
    cells = cells.astype(np.float64) if sp.issparse(cells) else np.asarray(cells, np.float64)
    mean_target = np.asarray(cells.sum(axis=0)).ravel() / n_cells
    reference = _Control(engine, condition, control, control_key)
    pvalue = reference.rank_test().test(cells)[1]
    fold_change = control_log2_fold_change(mean_target, reference.mean())
    return fold_change, np.asarray(benjamini_hochberg(pvalue[None, :])[0])


#: Squared distances within this fraction of the squared norms are rounding: 0.
ROUNDING = 1e-12


class _ControlCloud:
    """The control cells in one space, centred on their mean, with their norms."""

    def __init__(self, points: np.ndarray) -> None:
        self.centre = points.mean(axis=0)
        self.points = points - self.centre
        self.norms = np.einsum("ij,ij->i", self.points, self.points)
        self.within_mean = _mean_distance(self.points, self.norms, self.points, self.norms)


def _mean_distance(x: np.ndarray, x_norms: np.ndarray, y: np.ndarray, y_norms: np.ndarray) -> float:
    """Mean Euclidean distance over all pairs of rows (the diagonal included), by one product.

    Both clouds are centred on the same point (the control mean) so that the
    product's cancellation stays small. A squared distance below rounding level
    (:data:`ROUNDING` times the two squared norms) is set to 0, so that equal rows
    (the diagonal, a constant prediction) are exactly 0 apart, as their
    differences are; the square root would otherwise lift rounding to ``1e-8``.
    """
    scale = x_norms[:, None] + y_norms[None, :]
    squared = scale - 2.0 * (x @ y.T)
    squared[squared <= ROUNDING * scale] = 0.0
    return float(np.sqrt(squared, out=squared).mean())


def _energy_to_control(reference: _Control, cells: Any, space: FeatureMap) -> float:
    points = space.matrix(cells)
    if points.shape[0] < 1:
        raise DegenerateInput("no cells to compare with the control")
    control = reference.memo(
        f"control_cloud {space.feature_names}",
        lambda: _ControlCloud(space.matrix(reference.cells())),
    )
    points -= control.centre
    norms = np.einsum("ij,ij->i", points, points)
    within = _mean_distance(points, norms, points, norms)
    between = _mean_distance(points, norms, control.points, control.norms)
    return 2.0 * between - within - control.within_mean


def control_view(
    engine: Engine,
    representation: str,
    condition: int,
    source: SourceData,
    space: FeatureMap,
    cache_key: Hashable | None = None,
) -> object:
    """The ``control_de`` or ``control_edistance`` view of a source for one condition.

    Parameters
    ----------
    engine
        The run's engine.
    representation
        One of :data:`CONTROL_REPRESENTATIONS`.
    condition
        Condition index.
    source
        The source's data (it must have cells).
    space
        The protocol's feature space; DE needs a gene selection.
    cache_key
        Identifies a source whose cells are fixed for the run (a registered source's
        name, or a model with its getter): its full-gene table or distance is then
        computed once per condition. ``None`` computes it anew. A source with its own
        control (:attr:`~scperteval.engine.sources.SourceData.control`) is compared
        with it.

    Returns
    -------
    ControlDE or float
        The DE table on the space's genes, or the energy distance.

    Raises
    ------
    DegenerateInput
        If the source has no cells, or DE is asked on a projection.

    """
    if representation == "control_de":
        if space.genes is None:
            raise DegenerateInput("DE against the control needs a gene space, not a projection")
        genes = space.genes

        def table() -> tuple[np.ndarray, np.ndarray]:
            cells = _source_cells(engine, source)
            return control_de_table(engine, condition, cells, source.control, cache_key)

        key: Hashable | None = None if cache_key is None else ("control_de", cache_key, condition)
        fold_change, fdr = engine.memo(key, table)
        return ControlDE(fold_change[genes], fdr[genes])
    if representation == "control_edistance":

        def distance() -> float:
            reference = _Control(engine, condition, source.control, cache_key)
            return _energy_to_control(reference, _source_cells(engine, source), space)

        key = ("control_edistance", cache_key, condition, space.feature_names)
        return engine.memo(None if cache_key is None else key, distance)
    raise ValueError(f"not a control representation: {representation!r}")
