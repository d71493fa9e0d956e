"""Principal axes of a sample of cells, exact, in bounded memory and thread-count independent.

The leading ``k`` right singular vectors of the centred sample ``D`` (cells x
genes) are the leading eigenvectors of the Gram matrix ``D^T D`` (genes x genes),
formed by blocks of cells (memory: the Gram matrix plus one block); with more
genes than cells the cells' Gram matrix ``D D^T`` is used and the axes are
``D^T u / s``. Squaring ``D`` matters only for the smallest singular values: the
leading axes agree with the SVD's to about 1e-13. Rank-deficient and small
samples go to the SVD, whose arbitrary vectors for zero singular values the Gram
route cannot reproduce.

LAPACK's symmetric solvers reduce the whole matrix to tridiagonal form with a
matrix-vector product over the trailing matrix per column, bound by memory
bandwidth (16 s for 5,000 genes on one core) even for the top ``k`` pairs only.
The default solver (``eigensolver="banded"``) goes in three backward-stable steps:

1. **Full to band** (bandwidth ``w``) by blocked Householder reflections: each
   panel of ``w`` columns is factored with QR and the trailing matrix updated by
   a symmetric product and a symmetric rank-``2w`` update, in place on its lower
   triangle (:mod:`scperteval.kernels.blas`).
2. **The top ``k`` eigenvalues of the band matrix** by LAPACK's banded solver
   (plane rotations to tridiagonal form, then bisection;
   :func:`scperteval.kernels.lapack.band_eigenvalues`).
3. **Eigenvectors by inverse iteration** on the band matrix (banded LU, shifted by
   each eigenvalue), each orthogonalised against those already found, then carried
   back through the panel reflections. A result whose residual or orthogonality is
   off falls back to LAPACK's banded solver with vectors.

BLAS runs on one thread and the Gram matrix is summed in fixed tiles, so the axes
are the same bits on any machine. ``eigensolver="eigh"`` uses
:func:`scipy.linalg.eigh` instead (the reference the banded solver is tested against).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from scperteval.kernels.blas import symmetric_product, symmetric_rank_2k_update
from scperteval.kernels.lapack import band_eigenvalues, band_lu, band_lu_solve, blocked_qr
from scperteval.kernels.threads import Threads, dealt_back_and_forth

__all__ = ["EIGENSOLVERS", "SampleRows", "principal_axes"]

Eigensolver = Literal["banded", "eigh"]
#: The eigensolvers of the Gram matrix: band reduction (the default) or LAPACK's ``syevr``.
EIGENSOLVERS: tuple[Eigensolver, ...] = ("banded", "eigh")

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


def _column_means(sample: Any, threads: Threads) -> np.ndarray:
    """Mean per gene, summed the same way for every storage of the same numbers.

    Blocks of a fixed number of rows are written densely in float64 (as the Gram
    route reads them) and each block's column sums, taken row by row, are added
    in order: dense, CSR, CSC, stored zeros or unsorted rows give the same bits.
    """
    n_cells, n_genes = sample.shape
    totals = np.zeros(n_genes)
    for block in _dense_blocks(sample, np.zeros(n_genes), threads):
        totals += block.sum(axis=0)
    return totals / max(n_cells, 1)


def _dense_blocks(sample: Any, offset: np.ndarray, threads: Threads) -> Iterator[np.ndarray]:
    """The rows minus ``offset``, dense in float64, by blocks of a fixed size in one buffer."""
    n_cells, n_genes = sample.shape
    rows = max(1, BLOCK_BYTES // (8 * n_genes))
    buffer = np.empty((min(rows, n_cells), n_genes))
    for start in range(0, n_cells, rows):
        yield _dense_rows(sample, start, min(start + rows, n_cells), offset, threads, buffer)


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
        dense = np.array(block, dtype=np.float64, order="C")
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
    gram: np.ndarray, k: int, eigensolver: Eigensolver, threads: Threads
) -> tuple[np.ndarray, np.ndarray] | None:
    """Top ``k`` eigenpairs, largest first; ``None`` if the top ``k`` include zeros."""
    values, vectors = leading_eigenpairs(gram, k, eigensolver, threads)
    if values[-1] <= _RANK_RTOL * max(values[0], 0.0) or values[0] <= 0:
        return None
    return values, vectors


def _gene_gram_axes(
    sample: Any, offset: np.ndarray, k: int, eigensolver: Eigensolver, threads: Threads
) -> np.ndarray | None:
    gram = _lower_half_matrix(sample.shape[1])
    with threads.claim_cores_when_parallel():
        for block in _dense_blocks(sample, offset, threads):
            _add_outer_products(gram, block.T, False, threads)
    top = _top_eigenvectors(gram, k, eigensolver, threads)
    return None if top is None else np.ascontiguousarray(top[1])


def _cell_gram_axes(
    sample: Any, offset: np.ndarray, k: int, eigensolver: Eigensolver, threads: Threads
) -> np.ndarray | None:
    sample = _whole(sample)
    n_cells, n_genes = sample.shape
    columns = max(1, BLOCK_BYTES // (8 * n_cells))
    by_columns = sample.tocsc() if sp.issparse(sample) else sample
    gram = _lower_half_matrix(n_cells)
    with threads.claim_cores_when_parallel():
        for start in range(0, n_genes, columns):
            block = _dense_columns(by_columns, start, min(start + columns, n_genes), offset)
            _add_outer_products(gram, block.T, True, threads)
    top = _top_eigenvectors(gram, k, eigensolver, threads)
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
    sample: Any, k: int, *, eigensolver: Eigensolver = "banded", threads: Threads | None = None
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
    eigensolver
        How the Gram matrix's top eigenpairs are found: ``"banded"`` (band
        reduction and inverse iteration, the default) or ``"eigh"``
        (:func:`scipy.linalg.eigh`, several times slower for thousands of genes).
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

    Raises
    ------
    ValueError
        For an unknown ``eigensolver``.

    """
    if eigensolver not in EIGENSOLVERS:
        raise ValueError(f"eigensolver must be one of {EIGENSOLVERS}, got {eigensolver!r}")
    threads = threads or Threads()
    n_cells, n_genes = sample.shape
    with threads.single_threaded_blas():
        offset = _column_means(sample, threads)
        n_components = min(int(k), n_cells, n_genes)
        axes: np.ndarray | None = None
        if min(n_cells, n_genes) > SMALL_SIDE and n_components < min(n_cells, n_genes):
            gram_axes = _gene_gram_axes if n_genes <= n_cells else _cell_gram_axes
            axes = gram_axes(sample, offset, n_components, eigensolver, threads)
        if axes is None:
            axes = _svd_axes(sample, offset, n_components, threads)
        return _signed(axes), offset


#: Bandwidth of the intermediate band matrix: wider panels read the trailing
#: matrix fewer times, narrower bands make steps 2 and 3 cheaper. For 5,000 genes
#: 48 and 64 take about as long (64: the reduction 0.5 s faster, the band
#: eigenvalues 0.25 s and inverse iteration 0.25 s slower); 32 and 40 make the
#: reduction 0.8 s slower.
BAND_WIDTH = 48
#: Below this order LAPACK's direct solver is as fast.
DIRECT_ORDER = 600
#: Inverse iteration: iterations at most, and iterations after the growth test passes.
_MAX_ITERATIONS = 8
_EXTRA_ITERATIONS = 2
#: Residual and orthogonality accepted, in units of ``eps * ||A||`` and ``eps * n``.
_RESIDUAL_FACTOR = 100.0
_ORTHOGONALITY_FACTOR = 100.0
_EPS = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class _Panel:
    """One block reflection ``I - V T V^T`` acting on rows ``start:``.

    ``V`` is stored below the band of the reduced matrix (columns ``column`` to
    ``column + width``), unit diagonal implied, as LAPACK stores QR factors.
    """

    start: int
    column: int
    width: int
    triangular: np.ndarray


def leading_eigenpairs(
    matrix: np.ndarray,
    k: int,
    eigensolver: Eigensolver = "banded",
    threads: Threads | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest eigenvalues of a symmetric matrix and their eigenvectors.

    Parameters
    ----------
    matrix
        Square float64 array in Fortran order whose lower triangle holds the
        symmetric matrix (the upper triangle is ignored). It may be overwritten.
    k
        Number of eigenpairs, ``1 <= k <= n``.
    eigensolver
        ``"banded"`` (the three steps above; LAPACK's direct solver for orders up
        to :data:`DIRECT_ORDER`) or ``"eigh"`` (:func:`scipy.linalg.eigh`).
    threads
        The run's threads, which hold BLAS to one thread (its own when omitted).

    Returns
    -------
    values : numpy.ndarray
        The ``k`` largest eigenvalues, largest first.
    vectors : numpy.ndarray
        ``n x k`` orthonormal eigenvectors, column ``i`` for ``values[i]``.

    Examples
    --------
    >>> import numpy as np
    >>> values, vectors = leading_eigenpairs(np.asfortranarray(np.diag([1.0, 3.0, 2.0])), 2)
    >>> values
    array([3., 2.])
    >>> np.abs(vectors[:, 0])
    array([0., 1., 0.])

    """
    order = matrix.shape[0]
    if matrix.ndim != 2 or matrix.shape[1] != order:
        raise ValueError(f"expected a square matrix, got shape {matrix.shape}")
    if not 1 <= k <= order:
        raise ValueError(f"k must be between 1 and {order}, got {k}")
    if matrix.dtype != np.float64 or not matrix.flags.f_contiguous:
        raise ValueError("the matrix must be a float64 array in Fortran order")
    width = BAND_WIDTH
    with (threads or Threads()).single_threaded_blas():
        if eigensolver == "eigh" or order <= max(DIRECT_ORDER, 2 * width + 2):
            values, vectors = sla.eigh(
                matrix, lower=True, subset_by_index=[order - k, order - 1], check_finite=False
            )
            return _largest_first(values, vectors)
        panels = _reduce_to_band(matrix, width)
        band = _lower_band(matrix, width)
        # LAPACK's banded solver, called so that the other workers run meanwhile.
        values = band_eigenvalues(band, order - k, order - 1)[::-1]
        vectors = _inverse_iteration(band, values)
        if vectors is None:
            values, vectors = _banded_solver(band, k)
        _apply_panels(matrix, panels, vectors)
        return values, vectors


def _reduce_to_band(matrix: np.ndarray, width: int) -> list[_Panel]:
    order = matrix.shape[0]
    panels = []
    column = 0
    while order - column - width >= 2:
        start = column + width
        rows = order - start
        n_reflectors = min(width, rows)
        factored, triangular, info = blocked_qr(matrix[start:, column:start], n_reflectors)
        if info != 0:
            raise np.linalg.LinAlgError(f"QR of a panel failed (info={info})")
        matrix[start:, column:start] = factored
        triangular = np.triu(triangular[:n_reflectors, :n_reflectors])
        reflectors = _unit_lower(factored[:, :n_reflectors])
        _update_trailing(matrix[start:, start:], reflectors, triangular)
        panels.append(_Panel(start, column, n_reflectors, triangular))
        column = start
    return panels


def _unit_lower(factored: np.ndarray) -> np.ndarray:
    reflectors = np.tril(factored, -1)
    np.fill_diagonal(reflectors, 1.0)
    return reflectors


def _update_trailing(trailing: np.ndarray, reflectors: np.ndarray, triangular: np.ndarray) -> None:
    """``S <- Q^T S Q`` with ``Q = I - V T V^T``, on the lower triangle of ``S``.

    With ``X = S V T`` and ``W = X - V (T^T V^T X) / 2``, ``Q^T S Q = S - V W^T -
    W V^T`` (``T^T V^T X`` is symmetric): one symmetric product and one symmetric
    rank-2k update of ``S`` where it lies.
    """
    reflectors = np.asfortranarray(reflectors)
    product = symmetric_product(trailing, reflectors, np.empty(reflectors.shape, order="F"))
    product = product @ triangular
    correction = product - 0.5 * (reflectors @ (triangular.T @ (reflectors.T @ product)))
    symmetric_rank_2k_update(trailing, reflectors, np.asfortranarray(correction), -1.0)


def _lower_band(matrix: np.ndarray, width: int) -> np.ndarray:
    """LAPACK's lower band storage: ``band[d, j] = A[j + d, j]``."""
    order = matrix.shape[0]
    band = np.zeros((width + 1, order))
    for offset in range(width + 1):
        band[offset, : order - offset] = np.diagonal(matrix, -offset)
    return band


def _general_band(band: np.ndarray) -> np.ndarray:
    """The symmetric band matrix in the storage of LAPACK's banded LU (``gbtrf``)."""
    width, order = band.shape[0] - 1, band.shape[1]
    general = np.zeros((3 * width + 1, order))
    general[2 * width :] = band
    for offset in range(1, width + 1):
        general[2 * width - offset, offset:] = band[offset, : order - offset]
    return general


def _band_times(band: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``A @ vectors`` for the symmetric band matrix ``A`` in lower band storage."""
    order = band.shape[1]
    result = band[0][:, None] * vectors
    for offset in range(1, band.shape[0]):
        diagonal = band[offset, : order - offset][:, None]
        result[offset:] += diagonal * vectors[: order - offset]
        result[: order - offset] += diagonal * vectors[offset:]
    return result


def _inverse_iteration(band: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """Eigenvectors of the band matrix for ``values``; ``None`` if they are not accurate."""
    width, order = band.shape[0] - 1, band.shape[1]
    general = np.asfortranarray(_general_band(band))
    norm = float(np.abs(band).sum(axis=0).max() + np.abs(band[1:]).sum(axis=0).max())
    if norm == 0.0:
        return None
    # A random start has a component along every eigenvector; the seed is fixed.
    starts = np.random.default_rng(0x5EED).standard_normal((order, values.size))
    vectors = np.empty((order, values.size))
    enough_growth = 1.0 / (10.0 * np.sqrt(order) * _EPS * norm)
    previous_shift = np.inf
    for index, value in enumerate(values):
        # Equal eigenvalues get shifts a little apart (vectors found one by one).
        shift = min(float(value), previous_shift - 10.0 * _EPS * max(abs(value), norm * _EPS))
        factors = None
        for _ in range(4):
            shifted = general.copy(order="F")
            shifted[2 * width] -= shift
            # LAPACK through ctypes: other workers' Python runs meanwhile.
            lu, pivots, info = band_lu(shifted, width, width)
            if info == 0:
                factors = (lu, pivots)
                break
            shift -= 10.0 * _EPS * norm  # an exact zero pivot: move off the eigenvalue
        if factors is None:
            return None
        previous_shift = shift
        found = vectors[:, :index]
        vector = starts[:, index] / np.linalg.norm(starts[:, index])
        extra = -1
        for _ in range(_MAX_ITERATIONS):
            solved, info = band_lu_solve(factors[0], width, width, factors[1], vector)
            if info != 0 or not np.all(np.isfinite(solved)):
                return None
            # Twice: one pass leaves ``eps * growth`` of the earlier vectors.
            solved -= found @ (found.T @ solved)
            solved -= found @ (found.T @ solved)
            growth = float(np.linalg.norm(solved))
            if growth == 0.0:
                return None
            vector = solved / growth
            if growth >= enough_growth or extra >= 0:
                extra += 1
                if extra >= _EXTRA_ITERATIONS:
                    break
        else:
            return None
        vectors[:, index] = vector
    residual = _band_times(band, vectors) - vectors * values
    if np.abs(residual).max() > _RESIDUAL_FACTOR * _EPS * norm:
        return None
    gram = vectors.T @ vectors
    np.fill_diagonal(gram, np.diagonal(gram) - 1.0)
    if np.abs(gram).max() > _ORTHOGONALITY_FACTOR * _EPS * order:
        return None
    return vectors


def _banded_solver(band: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = band.shape[1]
    values, vectors = sla.eig_banded(
        band, lower=True, select="i", select_range=(order - k, order - 1), check_finite=False
    )
    return _largest_first(values, vectors)


def _largest_first(values: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LAPACK's ascending eigenpairs in descending order."""
    return values[::-1], np.ascontiguousarray(vectors[:, ::-1])


def _apply_panels(matrix: np.ndarray, panels: list[_Panel], vectors: np.ndarray) -> None:
    """``vectors <- Q vectors`` for the product ``Q`` of the panels' reflections."""
    for panel in reversed(panels):
        stored = matrix[panel.start :, panel.column : panel.column + panel.width]
        reflectors = _unit_lower(stored)
        rows = vectors[panel.start :]
        rows -= reflectors @ (panel.triangular @ (reflectors.T @ rows))
