"""Reading expression matrices: in memory, from an ``.h5ad`` file, or a dask array.

The helpers behind :class:`~scperteval.data.dataset.Dataset`: opening the input
(:func:`open_data`, files through :func:`~scperteval.data.h5ad.open_h5ad`), cutting row
ranges and row selections out of whichever matrix type holds the data
(:func:`read_matrix_rows`, :func:`csr_row_view`), and keeping only the matrix of
an AnnData when it is shipped to another process (:func:`matrix_only`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from scperteval.data.h5ad import StoredAnnData, is_annotated_data, open_h5ad
from scperteval.data.ondisk import DiskCSR, read_rows
from scperteval.errors import DatasetError

__all__ = [
    "as_rows",
    "csr_row_view",
    "is_dask",
    "is_h5py_dataset",
    "matrix_only",
    "open_data",
    "read_matrix_rows",
]


def open_data(data: Any, backed: bool | str) -> Any:
    """The annotated data of a dataset: as given, or the ``.h5ad`` file opened.

    Parameters
    ----------
    data
        An AnnData or :class:`~scperteval.data.h5ad.StoredAnnData` (returned as
        is) or the path to an ``.h5ad`` file.
    backed
        ``True``: leave the matrices on disk; ``False``: read the file;
        ``"auto"``: on disk when the file is over a third of the available memory.

    Returns
    -------
    StoredAnnData or anndata.AnnData
        For a file, what :func:`~scperteval.data.h5ad.open_h5ad` gives.

    Raises
    ------
    DatasetError
        If the input is not an AnnData or a readable ``.h5ad`` file.

    """
    if is_annotated_data(data):
        return data
    if not isinstance(data, (str, os.PathLike)):
        raise DatasetError(
            f"expected an AnnData or a path to an .h5ad file, got {type(data).__name__}"
            + (
                "; a bare matrix has no cell labels: wrap it as anndata.AnnData(X, obs=...)"
                if hasattr(data, "shape")
                else ""
            )
        )
    path = Path(data)
    if not path.exists():
        raise DatasetError(f"{path}: file not found")
    if path.is_dir():
        zarr = path.suffix.lower() == ".zarr"
        hint = "; read the store with anndata.read_zarr and save it with write_h5ad" if zarr else ""
        raise DatasetError(f"{path}: is a folder, not an .h5ad file{hint}")
    if backed not in (True, False, "auto"):
        raise DatasetError(f"backed must be True, False or 'auto', got {backed!r}")
    try:
        return open_h5ad(path, backed)
    except Exception as exc:  # noqa: BLE001 - any reader failure means unreadable input
        # HDF5's messages run over several lines; the first names the problem.
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        kind = type(exc).__name__
        raise DatasetError(f"{path}: cannot read as .h5ad ({kind}: {reason})") from None


def matrix_only(adata: Any, layer: str | None) -> StoredAnnData:
    """A container of ``adata``'s expression matrix (``X`` or ``layer``) and names only.

    Parameters
    ----------
    adata
        The full AnnData (or :class:`~scperteval.data.h5ad.StoredAnnData`).
    layer
        The layer holding the expression, or ``None`` for ``X``.

    Returns
    -------
    StoredAnnData
        No annotations beyond cell and gene names, no other layers; it pickles
        without anndata, so a worker receiving it need not import anndata.

    """
    obs = pd.DataFrame(index=adata.obs_names)
    var = pd.DataFrame(index=adata.var_names)
    if layer is None:
        return StoredAnnData(obs, var, X=adata.X)
    return StoredAnnData(obs, var, layers={layer: adata.layers[layer]})


def csr_row_view(matrix: sp.csr_matrix, start: int, stop: int) -> sp.csr_matrix:
    """Rows ``start:stop`` of a CSR matrix as a view of its arrays (no copy of the data)."""
    begin, end = int(matrix.indptr[start]), int(matrix.indptr[stop])
    # The arrays are attached after construction: scipy's constructor copies a
    # slice smaller than half of the array it views (to free the large one), which
    # would copy every chunk of a matrix held in memory.
    view = sp.csr_matrix((stop - start, matrix.shape[1]), dtype=matrix.dtype)
    view.indptr = matrix.indptr[start : stop + 1] - matrix.indptr.dtype.type(begin)
    view.indices = matrix.indices[begin:end]
    view.data = matrix.data[begin:end]
    return view


def as_rows(matrix: Any) -> Any:
    """``matrix`` as CSR when sparse, else as a NumPy array; half precision as float32.

    Half precision has no compiled kernels; float32 holds every such value exactly.
    """
    if getattr(matrix, "dtype", None) == np.float16:
        matrix = matrix.astype(np.float32)
    if sp.issparse(matrix):
        return matrix if matrix.format == "csr" else sp.csr_matrix(matrix)
    return np.asarray(matrix)


def read_matrix_rows(matrix: Any, rows: np.ndarray, max_span: int) -> Any:
    """The given rows (ascending) of any supported matrix, in memory.

    Parameters
    ----------
    matrix
        A SciPy sparse matrix, NumPy array, dask array, or a matrix on disk
        (:class:`~scperteval.data.ondisk.DiskCSR`, :class:`h5py.Dataset`).
    rows
        Sorted row indices.
    max_span
        Largest number of rows one read from disk may cover.

    Returns
    -------
    scipy.sparse.csr_matrix or numpy.ndarray
        The rows, in order.

    """
    if rows.size == 0:
        return sp.csr_matrix((0, matrix.shape[1]))
    if isinstance(matrix, DiskCSR) or is_h5py_dataset(matrix):
        return as_rows(read_rows(matrix, rows, max_span))
    contiguous = rows[-1] - rows[0] + 1 == rows.size
    block = matrix[int(rows[0]) : int(rows[-1]) + 1] if contiguous else matrix[rows]
    if hasattr(block, "to_memory"):
        block = block.to_memory()
    if is_dask(block):
        # Chunks are the unit of parallel work here: a nested scheduler would
        # oversubscribe the worker (or send the block through a cluster client).
        block = block.compute(scheduler="synchronous")
    return as_rows(block)


def is_dask(matrix: Any) -> bool:
    """Whether ``matrix`` is a dask array (without importing dask)."""
    # Only a dask array can come from an imported dask.array: no import needed to check.
    module = sys.modules.get("dask.array")
    return module is not None and isinstance(matrix, module.Array)


def is_h5py_dataset(matrix: Any) -> bool:
    """Whether ``matrix`` is a dataset in an open HDF5 file."""
    import h5py

    return isinstance(matrix, h5py.Dataset)
