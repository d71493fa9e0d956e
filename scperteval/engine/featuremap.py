"""Feature spaces as maps from the full gene space to the evaluated features."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp

from scperteval.kernels.threads import Threads

__all__ = ["FeatureMap"]


def _project(rows: Any, components: np.ndarray) -> np.ndarray:
    """``rows @ components`` row by row, the same bits for every storage of the rows.

    Each row's nonzero values are added in column order (see
    :func:`~scperteval.kernels.sparse_rows.project_dense_rows`): dense, CSR, CSC,
    stored zeros, unsorted columns, float32 or float64 give the same result.
    """
    from scperteval.kernels.sparse_rows import add_csr_rows, project_csr_rows, project_dense_rows

    projected = np.empty((rows.shape[0], components.shape[1]))
    if sp.issparse(rows):
        csr = rows if rows.format == "csr" else rows.tocsr()
        every_row = np.arange(csr.shape[0], dtype=np.int64)
        if project_csr_rows(csr.indptr, csr.indices, csr.data, every_row, components, projected):
            return projected
        # Unsorted columns, or one stored twice: written densely first (repeats summed).
        dense = np.zeros(csr.shape)
        add_csr_rows(csr.indptr, csr.indices, csr.data, dense)
        rows = dense
    project_dense_rows(np.asarray(rows), components, projected)
    return projected


@dataclass(frozen=True, eq=False)
class FeatureMap:
    """Where a protocol looks: a gene selection or a linear projection (PCA).

    Attributes
    ----------
    label
        Readable name of the space (e.g. ``top_k(k=50)``).
    names
        Names of the resulting features (genes, or ``PC1``...).
    genes
        Column indices of the selected genes, or ``None`` for a projection.
    components
        ``(n_genes, n_components)`` loading matrix of a projection, else ``None``.
    offset
        Vector subtracted before projecting a point (the PCA mean); deltas are
        projected without it.
    threads
        The run's threads, which hold a projection's products to one BLAS thread
        (a projection's own when omitted).

    """

    label: str
    names: np.ndarray
    genes: np.ndarray | None = None
    components: np.ndarray | None = None
    offset: np.ndarray | None = None
    threads: Threads | None = None

    @cached_property
    def _threads(self) -> Threads:
        return self.threads or Threads()

    @cached_property
    def feature_names(self) -> tuple[str, ...]:
        """The feature names as strings, built once per space (metric contexts share it)."""
        values = self.names.tolist()
        # Fixed-width text gives strings directly, and gene names held as objects are
        # strings already (the dataset reads them so): converting each is 3x slower.
        if self.names.dtype.kind == "U" or set(map(type, values)) == {str}:
            return tuple(values)
        return tuple(map(str, values))

    @property
    def size(self) -> int:
        """Number of features."""
        return int(self.names.shape[0])

    def vector(self, values: np.ndarray, is_delta: bool = False) -> np.ndarray:
        """Map one full-length vector (a centroid, or a delta when ``is_delta``)."""
        if self.genes is not None:
            return np.asarray(values[self.genes], dtype=np.float64)
        assert self.components is not None
        shifted = values if is_delta or self.offset is None else values - self.offset
        with self._threads.single_threaded_blas():
            return np.asarray(shifted @ self.components, dtype=np.float64)

    def matrix(self, rows: Any, is_delta: bool = False) -> np.ndarray:
        """Map cells x genes rows (sparse or dense) to a dense cells x features array."""
        if self.genes is not None:
            block = rows[:, self.genes]
            dense = block.toarray() if sp.issparse(block) else np.asarray(block)
            # Row-major whatever the rows' layout (selecting columns of a dense
            # array may give column-major): products and reductions of the result
            # then round the same way for every storage.
            return np.ascontiguousarray(dense, dtype=np.float64)
        assert self.components is not None
        return self._less_offset(_project(rows, self._contiguous_components), is_delta)

    def _less_offset(self, projected: np.ndarray, is_delta: bool = False) -> np.ndarray:
        """Projected points less the projected offset, in place (deltas as they are)."""
        if not is_delta and self.offset is not None:
            with self._threads.single_threaded_blas():
                projected -= self.offset @ self.components
        return projected

    @cached_property
    def _gene_positions(self) -> np.ndarray | None:
        """Each gene's column in this space (-1 if not in it); ``None`` if one is twice."""
        assert self.genes is not None
        genes = np.asarray(self.genes, dtype=np.int64)
        if genes.size == 0 or np.unique(genes).size != genes.size:
            return None
        positions = np.full(int(genes.max()) + 1, -1, dtype=np.int64)
        positions[genes] = np.arange(genes.size)
        return positions

    @cached_property
    def _contiguous_components(self) -> np.ndarray:
        assert self.components is not None
        return np.ascontiguousarray(self.components, dtype=np.float64)

    def matrix_of_rows(self, whole: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
        """``matrix(whole[rows])``, reading the rows of a CSR matrix in place.

        The same values bit for bit, without the copy of the rows or, for a
        projection, the float64 copy of their values that scipy's product makes.

        Parameters
        ----------
        whole
            Cells x genes CSR matrix.
        rows
            Its rows to map, in order.

        Returns
        -------
        numpy.ndarray
            Cells x features, float64.

        """
        from scperteval.kernels.sparse_rows import gather_csr_columns, project_csr_rows

        rows = np.asarray(rows, dtype=np.int64)
        arrays = (whole.indptr, whole.indices, whole.data)
        if self.genes is not None:
            positions = self._gene_positions
            if positions is not None:
                out = np.zeros((rows.size, self.genes.size))
                if gather_csr_columns(*arrays, rows, positions, out):
                    return out
            # A gene selected twice, or a column stored twice in a row (which scipy
            # sums in the matrix's own dtype): scipy's selection.
            return self.matrix(whole[rows])
        components = self._contiguous_components
        projected = np.empty((rows.size, components.shape[1]))
        if not project_csr_rows(*arrays, rows, components, projected):
            return self.matrix(whole[rows])
        return self._less_offset(projected)

    def positions_of(self, gene_indices: np.ndarray) -> tuple[int, ...]:
        """Positions in this space of the given full-space gene indices (selections only)."""
        if self.genes is None:
            return ()
        # A few target genes against a selection: a comparison per target costs far
        # less than an index of the whole selection, built for every perturbation.
        found = (np.flatnonzero(self.genes == int(g)) for g in np.ravel(gene_indices))
        return tuple(int(hits[-1]) for hits in found if hits.size)
