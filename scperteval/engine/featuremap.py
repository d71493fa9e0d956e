"""Feature spaces as maps from the full gene space to the evaluated features."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp

from scperteval.metrics.population import single_threaded_blas

__all__ = ["FeatureMap"]


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

    """

    label: str
    names: np.ndarray
    genes: np.ndarray | None = None
    components: np.ndarray | None = None
    offset: np.ndarray | None = None

    @property
    def is_selection(self) -> bool:
        """Whether the space selects genes (rather than projecting them)."""
        return self.genes is not None

    @cached_property
    def feature_names(self) -> tuple[str, ...]:
        """The feature names as strings, built once per space (metric contexts share it)."""
        if self.names.dtype.kind == "U":
            # Fixed-width text: ``tolist`` makes the strings directly, 6x faster.
            return tuple(self.names.tolist())
        return tuple(map(str, self.names))

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
        with single_threaded_blas():
            return np.asarray(shifted @ self.components, dtype=np.float64)

    def matrix(self, rows: Any, is_delta: bool = False) -> np.ndarray:
        """Map cells x genes rows (sparse or dense) to a dense cells x features array."""
        if self.genes is not None:
            block = rows[:, self.genes]
            dense = block.toarray() if sp.issparse(block) else np.asarray(block)
            return np.asarray(dense, dtype=np.float64)
        assert self.components is not None
        # One BLAS thread: a product split over threads may round differently with
        # the machine's thread count, and values must not depend on where they ran.
        with single_threaded_blas():
            projected = np.asarray(rows @ self.components, dtype=np.float64)
            if not is_delta and self.offset is not None:
                projected -= self.offset @ self.components
        return projected

    def positions_of(self, gene_indices: np.ndarray) -> tuple[int, ...]:
        """Positions in this space of the given full-space gene indices (selections only)."""
        if self.genes is None:
            return ()
        # A few target genes against a selection: a comparison per target costs far
        # less than an index of the whole selection, built for every perturbation.
        found = (np.flatnonzero(self.genes == int(g)) for g in np.ravel(gene_indices))
        return tuple(int(hits[-1]) for hits in found if hits.size)
