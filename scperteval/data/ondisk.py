"""Reading rows of expression matrices left on disk.

A file opened backed (:func:`~scperteval.data.h5ad.open_h5ad` with ``backed=True``)
holds its cell and gene annotations in memory and leaves every matrix (``X`` and
each layer) on disk; :func:`on_disk` makes such a matrix readable by row ranges
and :func:`read_rows` reads chosen rows of it. Only rows that are asked for are
read, so a dataset larger than memory can be summarised chunk by chunk and sampled.

``anndata.read_h5ad(backed="r")`` is not used for this: it keeps ``X`` on disk
but loads every layer, ``obsm`` and ``obsp`` into memory, and its backed sparse
matrices check the installed package version on every slice, which makes
reading thousands of scattered rows slow.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from scperteval.errors import DatasetError

__all__ = ["DiskCSR", "on_disk", "read_rows"]

#: Rows closer than this are read in one slice with the rows between them: one
#: read of a few extra rows costs less than a separate read per row.
GAP_ROWS = 8


class DiskCSR:
    """A CSR matrix stored in an HDF5 group (anndata's ``csr_matrix`` encoding), read by rows.

    The row pointers are read once (8 bytes per row); values and column
    indices are read only for the rows requested.

    Parameters
    ----------
    group
        The :class:`h5py.Group` with ``data``, ``indices`` and ``indptr``.

    """

    def __init__(self, group: Any) -> None:
        self.group = group
        self.data = group["data"]
        self.indices = group["indices"]
        self.indptr = np.asarray(group["indptr"][:], dtype=np.int64)
        self.shape = tuple(int(v) for v in group.attrs["shape"])
        self.dtype = self.data.dtype
        #: Number of slices read so far (each reads a contiguous range of rows).
        self.n_reads = 0
        #: Number of rows read so far (the rows asked for and those in small gaps).
        self.rows_read = 0

    def __getitem__(self, rows: slice) -> sp.csr_matrix:
        """Rows ``start:stop`` (step 1) as an in-memory CSR matrix."""
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError("DiskCSR reads contiguous row ranges only; use read_rows for others")
        start, stop, _ = rows.indices(self.shape[0])
        stop = max(start, stop)
        begin, end = int(self.indptr[start]), int(self.indptr[stop])
        self.n_reads += 1
        self.rows_read += stop - start
        return sp.csr_matrix(
            (self.data[begin:end], self.indices[begin:end], self.indptr[start : stop + 1] - begin),
            shape=(stop - start, self.shape[1]),
        )

    def __repr__(self) -> str:
        return f"DiskCSR({self.group.file.filename}:{self.group.name}, shape={self.shape})"


def on_disk(node: Any, where: str) -> Any:
    """A matrix stored in a file, readable by row ranges without loading the rest.

    Parameters
    ----------
    node
        An :class:`h5py.Dataset` (dense) or a group in anndata's ``csr_matrix``
        encoding, or an anndata backed sparse dataset of such a group; a matrix
        already in memory (a layer of an AnnData opened backed) is returned as is.
    where
        The file and element, for error messages.

    Returns
    -------
    DiskCSR or h5py.Dataset or numpy.ndarray or scipy.sparse matrix
        Sliceable by row ranges (``matrix[start:stop]``).

    Raises
    ------
    DatasetError
        For a matrix stored by column (CSC) or in an unknown encoding.

    """
    import h5py

    if sp.issparse(node) or isinstance(node, np.ndarray):
        return node
    node = getattr(node, "group", node)  # anndata's backed sparse dataset
    if isinstance(node, h5py.Dataset):
        return node
    encoding = str(node.attrs.get("encoding-type", "")) if isinstance(node, h5py.Group) else ""
    if encoding == "csr_matrix":
        return DiskCSR(node)
    if encoding == "csc_matrix":
        raise DatasetError(
            f"{where} is stored by column (CSC): every chunk of cells would read the whole "
            "matrix; store it as CSR (e.g. adata.X = scipy.sparse.csr_matrix(adata.X)) or "
            "load it into memory (backed=False, CLI: --in-memory)"
        )
    raise DatasetError(f"{where}: cannot read a matrix stored as {encoding or type(node).__name__}")


def read_rows(matrix: Any, rows: np.ndarray, max_span: int) -> Any:
    """Rows of an on-disk matrix, read in contiguous slices of at most ``max_span`` rows.

    Parameters
    ----------
    matrix
        From :func:`on_disk`.
    rows
        Row indices, ascending and unique.
    max_span
        Largest number of rows one slice may cover (bounds the memory of a read).

    Returns
    -------
    scipy.sparse.csr_matrix or numpy.ndarray
        The rows, in the order of ``rows``.

    """
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size > 1 and np.any(np.diff(rows) <= 0):
        raise ValueError("rows must be ascending and unique")
    blocks = []
    for run in _runs(rows, max(int(max_span), 1)):
        first, last = int(run[0]), int(run[-1])
        block = matrix[first : last + 1]
        blocks.append(block if run.size == last - first + 1 else block[run - first])
    if not blocks:
        return sp.csr_matrix((0, matrix.shape[1]), dtype=matrix.dtype)
    if sp.issparse(blocks[0]):
        return sp.vstack(blocks, format="csr") if len(blocks) > 1 else blocks[0]
    return np.concatenate(blocks) if len(blocks) > 1 else blocks[0]


def _runs(rows: np.ndarray, max_span: int) -> list[np.ndarray]:
    """Split ascending rows where a gap exceeds ``GAP_ROWS`` or a run would exceed ``max_span``."""
    breaks = np.flatnonzero(np.diff(rows) > GAP_ROWS + 1) + 1
    runs: list[np.ndarray] = []
    for run in np.split(rows, breaks):
        # A run of close rows longer than max_span is cut by position within it.
        while run.size and run[-1] - run[0] >= max_span:
            cut = int(np.searchsorted(run, run[0] + max_span))
            runs.append(run[:cut])
            run = run[cut:]
        if run.size:
            runs.append(run)
    return runs
