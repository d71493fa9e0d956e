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

The control cells are the measured ones on both sides. Tables and distances are
computed once per (source, perturbation) and shared by every protocol of the run.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from scperteval.engine.featuremap import FeatureMap
from scperteval.engine.sources import SourceData
from scperteval.metrics import DegenerateInput
from scperteval.metrics.cell_eval import ControlDE, control_log2_fold_change
from scperteval.stats.diffexp import adjust_pvalues
from scperteval.stats.reference_rank_test import ReferenceRankTest

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine

__all__ = ["CONTROL_REPRESENTATIONS", "control_de_table", "control_view"]

#: Representations whose views compare a source with the control cells.
CONTROL_REPRESENTATIONS = ("control_de", "control_edistance")


def _dense(block: Any) -> np.ndarray:
    if sp.issparse(block):
        return np.asarray(block.toarray(), dtype=np.float64)
    return np.asarray(block, dtype=np.float64)


def _source_cells(engine: Engine, source: SourceData) -> Any:
    if source.rows is not None:
        return source.rows
    if source.positions is not None:
        return engine.context.dataset.rows(source.positions)
    raise DegenerateInput("a comparison with the control cells needs a source made of cells")


def _control_cells(engine: Engine, condition: int) -> np.ndarray:
    covariate = engine.covariate_index(condition)

    def build() -> np.ndarray:
        positions = engine.context.layout.control_positions(covariate)
        if positions.size < 1:
            raise DegenerateInput("no control cells in this covariate group")
        return _dense(engine.context.dataset.rows(positions))

    return engine.memo(("control_cells_dense", covariate), build)


def _reference_test(engine: Engine, condition: int) -> ReferenceRankTest:
    covariate = engine.covariate_index(condition)
    return engine.memo(
        ("control_rank_test", covariate),
        lambda: ReferenceRankTest(_control_cells(engine, condition)),
    )


def control_de_table(engine: Engine, condition: int, cells: Any) -> tuple[np.ndarray, np.ndarray]:
    """Log2 fold changes and BH-adjusted Wilcoxon p-values of cells vs the control, all genes.

    The p-values are those of :func:`~scperteval.stats.rank_test.mann_whitney` on the
    cells and the control cells, from the control sorted once per covariate group
    (:class:`~scperteval.stats.reference_rank_test.ReferenceRankTest`).

    Parameters
    ----------
    engine
        The run's engine (gives the condition's control cells).
    condition
        Condition index: its covariate group's control cells are the reference.
    cells
        Cells x genes (dense or sparse) of the compared source.

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
    pvalue = _reference_test(engine, condition).test(cells)[1]
    covariate = engine.covariate_index(condition)
    mean_control = engine.memo(
        ("control_cells_mean", covariate),
        lambda: _control_cells(engine, condition).mean(axis=0),
    )
    fold_change = control_log2_fold_change(mean_target, mean_control)
    return fold_change, np.asarray(adjust_pvalues(pvalue[None, :])[0])


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


def _energy_to_control(engine: Engine, condition: int, cells: Any, space: FeatureMap) -> float:
    points = space.matrix(cells)
    if points.shape[0] < 1:
        raise DegenerateInput("no cells to compare with the control")
    covariate = engine.covariate_index(condition)
    control = engine.memo(
        ("control_cloud", covariate, tuple(map(str, space.names))),
        lambda: _ControlCloud(space.matrix(_control_cells(engine, condition))),
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
        computed once per condition. ``None`` computes it anew.

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
            return control_de_table(engine, condition, _source_cells(engine, source))

        fold_change, fdr = (
            table()
            if cache_key is None
            else engine.memo(("control_de", cache_key, condition), table)
        )
        return ControlDE(fold_change[genes], fdr[genes])
    if representation == "control_edistance":

        def distance() -> float:
            return _energy_to_control(engine, condition, _source_cells(engine, source), space)

        if cache_key is None:
            return distance()
        key = ("control_edistance", cache_key, condition, tuple(map(str, space.names)))
        return engine.memo(key, distance)
    raise ValueError(f"not a control representation: {representation!r}")
