"""Rank-test differential expression of every condition of a dataset, reading its cells."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from scperteval.data.dataset import Dataset
from scperteval.data.layout import GroupLayout
from scperteval.stats.rank_test import mann_whitney

#: Genes densified at a time: bounds memory to cells x block x 8 bytes.
GENE_BLOCK_CELLS = 20_000_000


def wilcoxon_all(
    dataset: Dataset, layout: GroupLayout, reference: str, half: str
) -> tuple[np.ndarray, np.ndarray]:
    """Mann-Whitney z statistics and p-values of every condition vs its reference.

    Parameters
    ----------
    dataset
        The dataset whose rows are read.
    layout
        The statistic group of each cell (conditions, halves, controls).
    reference
        ``rest`` or ``control``.
    half
        Target cells: ``all``, ``truth`` or ``duplicate``.

    Returns
    -------
    tuple of numpy.ndarray
        Statistics and p-values, shape ``(n_conditions, n_genes)``.

    """
    n_genes = dataset.n_genes
    statistic = np.zeros((layout.n_conditions, n_genes))
    pvalue = np.ones((layout.n_conditions, n_genes))
    group_covariate = np.full(layout.n_groups, -1, dtype=np.int64)
    group_covariate[: 2 * layout.n_conditions] = np.repeat(layout.condition_covariate, 2)
    cell_covariate = np.where(layout.codes >= 0, group_covariate[np.maximum(layout.codes, 0)], -1)
    for k in range(layout.n_conditions):
        covariate = int(layout.condition_covariate[k])
        target_positions = layout.positions(k, half)
        if reference == "control":
            reference_positions = layout.control_positions(covariate)
        else:
            own = (layout.codes == 2 * k) | (layout.codes == 2 * k + 1)
            reference_positions = np.flatnonzero((cell_covariate == covariate) & ~own)
        target = dataset.rows(target_positions)
        ref = dataset.rows(reference_positions)
        n_cells = target.shape[0] + ref.shape[0]
        block = max(1, GENE_BLOCK_CELLS // max(n_cells, 1))
        for start in range(0, n_genes, block):
            columns = slice(start, min(start + block, n_genes))
            statistic[k, columns], pvalue[k, columns] = mann_whitney(
                _dense(target[:, columns]), _dense(ref[:, columns])
            )
    return statistic, pvalue


def _dense(block: object) -> np.ndarray:
    if sp.issparse(block):
        return np.asarray(block.toarray(), dtype=np.float64)  # type: ignore[attr-defined]
    return np.asarray(block, dtype=np.float64)
