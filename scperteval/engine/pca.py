"""Principal axes of a sample of cells, exact and in bounded memory.

The leading ``k`` right singular vectors of the centred sample ``D`` (cells x
genes) are the leading eigenvectors of the Gram matrix ``D^T D`` (genes x genes).
For the usual sample (10,000 cells, a few thousand genes) forming that matrix by
blocks of cells and finding its top ``k`` eigenpairs only
(:func:`~scperteval.engine.eigen.leading_eigenpairs`) is several times faster
than a full SVD of ``D`` and never holds ``D`` densely: memory is the Gram matrix
plus one block. When there are more genes than cells the cells' Gram
matrix ``D D^T`` is used instead, and the axes are ``D^T u / s``.

Squaring ``D`` squares its condition number, which matters only for the smallest
singular values; the leading axes, separated from the rest, agree with the SVD's
to about 1e-13 (tested against :func:`numpy.linalg.svd`). Rank-deficient samples
(fewer independent directions than ``k``) and small ones go to the SVD, whose
arbitrary vectors for zero singular values the Gram route cannot reproduce.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from scperteval.engine.eigen import leading_eigenpairs
from scperteval.kernels.threads import Threads, dealt_back_and_forth

__all__ = ["SampleRows", "principal_axes"]

#: Below this many genes (or cells), a dense SVD is as fast as the Gram route.
SMALL_SIDE = 1000
#: Memory bound for one dense block of the centred sample.
BLOCK_BYTES = 16 * 2**20
#: Width of the Gram matrix's column tiles (fixed, so sums never depend on threads).
GRAM_TILE = 256
#: Gram matrices of at least this many bytes are mapped in small pages (see
#: :func:`_lower_half_matrix`).
SMALL_PAGES_BYTES = 4 * 2**20
# Eigenvalues below this fraction of the largest count as zero (rank deficiency).
_RANK_RTOL = 1e-10


@dataclass(frozen=True)
class SampleRows:
    """A sample of cells read a block of rows at a time, never held whole.

    Attributes
    ----------
    shape
        ``(n_cells, n_genes)`` of the sample.
    read
        ``read(start, stop)``: rows ``start`` to ``stop`` of the sample, sparse or
        dense.

    """

    shape: tuple[int, int]
    read: Callable[[int, int], Any]

    def __getitem__(self, rows: slice) -> Any:
        start, stop, _ = rows.indices(self.shape[0])
        return self.read(start, stop)


def _column_means(sample: Any) -> np.ndarray:
    n_cells, n_genes = sample.shape
    if isinstance(sample, SampleRows):
        rows = _dense_block_rows(n_genes)
    elif sp.issparse(sample):
        sample = sample.tocsr()
        rows = max(1, BLOCK_BYTES // (8 * max(1, sample.nnz // max(1, n_cells))))
    else:
        return np.asarray(sample, dtype=np.float64).mean(axis=0)
    # Summed in float64 (scipy accumulates in the matrix's own dtype otherwise), one
    # block of rows at a time rather than the whole sample.
    totals = np.zeros(n_genes)
    for start in range(0, n_cells, rows):
        block = sample[start : start + rows]
        if sp.issparse(block):
            block = block.tocsr()
            totals += np.bincount(block.indices, weights=block.data, minlength=n_genes)
        else:
            totals += np.asarray(block, dtype=np.float64).sum(axis=0)
    return totals / n_cells


def _dense_block_rows(n_genes: int) -> int:
    return max(1, BLOCK_BYTES // (8 * n_genes))


def _whole(sample: Any) -> Any:
    return sample[0 : sample.shape[0]] if isinstance(sample, SampleRows) else sample


def _dense_rows(
    sample: Any,
    start: int,
    stop: int,
    offset: np.ndarray,
    threads: Threads,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Rows ``start:stop`` of the sample, dense in float64, minus ``offset``.

    CSR rows are written into ``out`` (its first rows) when it is given, so that a
    loop over blocks reuses one buffer, and split over the kernel threads.
    """
    block = sample[start:stop]
    # Densified in float64 at once: no dense copy in the data's own dtype first,
    # and for CSR rows no float64 copy of the sparse block either.
    if sp.issparse(block) and block.format == "csr":
        from scperteval.kernels.sparse_rows import add_csr_rows

        n_rows = block.shape[0]
        dense = np.empty(block.shape) if out is None else out[:n_rows]
        indptr, indices, data = block.indptr, block.indices, block.data

        def fill(first: int, last: int) -> None:
            rows = dense[first:last]
            rows.fill(0.0)
            add_csr_rows(indptr[first : last + 1], indices, data, rows)
            rows -= offset

        threads.run_ranges(fill, threads.even_bounds(n_rows, threads.count))
        return dense
    if sp.issparse(block):
        dense = block.astype(np.float64).toarray()
    else:
        dense = np.array(block, dtype=np.float64)
    dense -= offset
    return dense


def _signed(components: np.ndarray) -> np.ndarray:
    """Each axis with its largest loading positive, so that fits are comparable."""
    columns = np.arange(components.shape[1])
    signs = np.sign(components[np.argmax(np.abs(components), axis=0), columns])
    return components * np.where(signs == 0, 1.0, signs)


def _svd_axes(sample: Any, offset: np.ndarray, k: int, threads: Threads) -> np.ndarray:
    dense = _dense_rows(_whole(sample), 0, sample.shape[0], offset, threads)
    _, _, vt = np.linalg.svd(dense, full_matrices=False)
    return np.ascontiguousarray(vt[:k].T)


def _add_outer_products(
    gram: np.ndarray, factor: np.ndarray, transposed: bool, threads: Threads
) -> None:
    """``gram += factor @ factor.T`` (``factor.T @ factor`` if ``transposed``), lower half.

    The lower half is cut into column tiles of a fixed width, each one matrix
    product on one BLAS thread, the tiles spread over the kernel threads. A BLAS
    call on several threads may split its sums differently with the thread count;
    a fixed tiling sums every entry the same way on any machine, worker or
    scheduler, so the axes are bit-identical everywhere.
    """
    left = factor.T if transposed else factor
    size = gram.shape[0]
    starts = list(range(0, size, GRAM_TILE))

    n_ranges = max(1, min(threads.count, len(starts)))
    # Earlier tiles hold more of the lower half: dealt back and forth, the work is even.
    dealt = dealt_back_and_forth(len(starts), n_ranges)

    def tiles(first: int, stop: int) -> None:
        for which in range(first, stop):
            for start in (starts[tile] for tile in dealt[which]):
                end = min(start + GRAM_TILE, size)
                # Computed transposed so that the product has the Fortran layout of
                # the Gram matrix: adding it then reads both in memory order.
                gram[start:, start:end] += (left[start:end] @ left[start:].T).T

    threads.run_ranges(tiles, threads.even_bounds(n_ranges, n_ranges))


def _lower_half_matrix(size: int) -> np.ndarray:
    """A zero ``size x size`` float64 matrix, Fortran order, for a Gram matrix.

    The Gram matrix is filled, reduced and read in its lower half only. numpy
    asks the kernel for 2 MiB pages for large arrays, and every such page of a
    column-major matrix holds part of the lower half: all of it would become
    resident. An anonymous mapping of its own gets 4 KiB pages, of which those
    wholly above the diagonal are never touched, which spares about 40% of the
    matrix (190 MiB for 5,000 genes, 115 MiB resident). Small matrices come from numpy.
    """
    nbytes = size * size * 8
    if nbytes < SMALL_PAGES_BYTES:
        return np.zeros((size, size), order="F")
    # Unmapped when the array, its only owner, is freed.
    buffer = mmap.mmap(-1, nbytes)
    return np.frombuffer(buffer, dtype=np.float64).reshape((size, size), order="F")


def _top_eigenvectors(
    gram: np.ndarray, k: int, threads: Threads
) -> tuple[np.ndarray, np.ndarray] | None:
    """Top ``k`` eigenpairs, largest first; ``None`` if the top ``k`` include zeros."""
    values, vectors = leading_eigenpairs(gram, k, threads)
    if values[-1] <= _RANK_RTOL * max(values[0], 0.0) or values[0] <= 0:
        return None
    return values, vectors


def _gene_gram_axes(sample: Any, offset: np.ndarray, k: int, threads: Threads) -> np.ndarray | None:
    n_cells, n_genes = sample.shape
    gram = _lower_half_matrix(n_genes)
    rows = _dense_block_rows(n_genes)
    buffer = np.empty((min(rows, n_cells), n_genes))
    with threads.claim_cores_when_parallel():
        for start in range(0, n_cells, rows):
            block = _dense_rows(sample, start, min(start + rows, n_cells), offset, threads, buffer)
            _add_outer_products(gram, block.T, False, threads)
    top = _top_eigenvectors(gram, k, threads)
    return None if top is None else np.ascontiguousarray(top[1])


def _cell_gram_axes(sample: Any, offset: np.ndarray, k: int, threads: Threads) -> np.ndarray | None:
    sample = _whole(sample)
    n_cells, n_genes = sample.shape
    columns = max(1, BLOCK_BYTES // (8 * n_cells))
    by_columns = sample.tocsc() if sp.issparse(sample) else sample
    gram = _lower_half_matrix(n_cells)
    with threads.claim_cores_when_parallel():
        for start in range(0, n_genes, columns):
            block = _dense_columns(by_columns, start, min(start + columns, n_genes), offset)
            _add_outer_products(gram, block.T, True, threads)
    top = _top_eigenvectors(gram, k, threads)
    if top is None:
        return None
    values, left = top
    axes = np.empty((n_genes, k))
    scale = 1.0 / np.sqrt(values)
    for start in range(0, n_genes, columns):
        stop = min(start + columns, n_genes)
        block = _dense_columns(by_columns, start, stop, offset)
        axes[start:stop] = (block.T @ left) * scale
    return axes


def _dense_columns(sample: Any, start: int, stop: int, offset: np.ndarray) -> np.ndarray:
    block = sample[:, start:stop]
    dense = block.toarray() if sp.issparse(block) else np.array(block)
    dense = np.asarray(dense, dtype=np.float64)
    dense -= offset[start:stop]
    return dense


def principal_axes(
    sample: Any, k: int, threads: Threads | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` principal axes of a sample and its mean.

    Parameters
    ----------
    sample
        Cells x genes, dense or scipy sparse (any float dtype; computed in float64),
        or :class:`SampleRows` to read it by blocks (the Gram route then never
        holds the whole sample).
    k
        Number of axes wanted; fewer are returned when the sample has fewer cells or
        genes.
    threads
        The run's kernel threads, whose core claim the Gram matrix holds (its own
        for the call when omitted).

    Returns
    -------
    components : numpy.ndarray
        Genes x components, orthonormal columns ordered by decreasing variance, each
        with its largest loading positive.
    offset : numpy.ndarray
        The sample's mean per gene (the centre of the projection).

    """
    threads = threads or Threads()
    with threads.single_threaded_blas():
        return _principal_axes(sample, k, threads)


def _principal_axes(sample: Any, k: int, threads: Threads) -> tuple[np.ndarray, np.ndarray]:
    n_cells, n_genes = sample.shape
    offset = _column_means(sample)
    n_components = min(int(k), n_cells, n_genes)
    axes: np.ndarray | None = None
    if min(n_cells, n_genes) > SMALL_SIDE and n_components < min(n_cells, n_genes):
        if n_genes <= n_cells:
            axes = _gene_gram_axes(sample, offset, n_components, threads)
        else:
            axes = _cell_gram_axes(sample, offset, n_components, threads)
    if axes is None:
        axes = _svd_axes(sample, offset, n_components, threads)
    return _signed(axes), offset
