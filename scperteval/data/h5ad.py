"""The one way into an ``.h5ad`` file: :func:`open_h5ad`.

``import anndata`` takes most of a second, because anndata imports zarr and
dask on start-up; h5py alone takes a few hundredths. An evaluation needs only a
file's cell and gene annotations (``obs``, ``var``) and one expression matrix,
so :func:`open_h5ad` reads those with h5py (decoders in
:mod:`scperteval.data.h5ad_elements`) into a :class:`StoredAnnData`, in memory
or with the matrices left on disk. What it does not decode is read by anndata,
so the result never differs from anndata's. Whether a file is read into memory
or left on disk, :func:`reads_into_memory` decides from its size.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from scperteval.data.h5ad_elements import (
    UnsupportedEncoding,
    matrix_shape,
    read_dataframe,
    read_matrix,
)
from scperteval.data.stored import StoredAnnData, StoredLayers, anndata_read_elem

__all__ = [
    "StoredAnnData",
    "StoredLayers",
    "UnsupportedEncoding",
    "is_anndata",
    "is_annotated_data",
    "open_h5ad",
]

# The top-level elements anndata writes; any other (such as the "raw.X" of files
# from before anndata 0.7) needs anndata's backward-compatible reading.
_ELEMENTS = frozenset({"X", "layers", "obs", "var", "obsm", "varm", "obsp", "varp", "uns", "raw"})


def is_anndata(value: Any) -> bool:
    """Whether ``value`` is an :class:`anndata.AnnData`, without importing anndata.

    Parameters
    ----------
    value
        Any object.

    Returns
    -------
    bool
        ``False`` whenever anndata was never imported: no AnnData can exist then.

    """
    module = sys.modules.get("anndata")
    cls = getattr(module, "AnnData", None)
    return cls is not None and isinstance(value, cls)


def is_annotated_data(value: Any) -> bool:
    """Whether ``value`` is an AnnData or a :class:`StoredAnnData` (anndata not imported).

    Parameters
    ----------
    value
        Any object, such as what a dataset or a prediction is given.

    Returns
    -------
    bool
        ``True`` for the two forms of annotated data a dataset or prediction is read from.

    """
    return isinstance(value, StoredAnnData) or is_anndata(value)


def available_memory() -> float:
    """Memory available to this process now, in bytes."""
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except ImportError:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def reads_into_memory(file_bytes: int, backed: bool | str) -> bool:
    """Whether a file of ``file_bytes`` is read into memory under the option ``backed``.

    Parameters
    ----------
    file_bytes
        The file's size.
    backed
        ``True``: left on disk; ``False``: read; ``"auto"``: left on disk when it
        is over a third of the available memory.

    Returns
    -------
    bool
        Whether the file is read.

    """
    if backed == "auto":
        return file_bytes <= available_memory() / 3
    return not backed


def open_h5ad(path: str | os.PathLike[str], backed: bool | str = False) -> Any:
    """Open an ``.h5ad`` file: annotations in memory, matrices in memory or on disk.

    Reading policy: h5py decodes every element stored in an encoding listed in
    :data:`~scperteval.data.h5ad_elements.VERSIONS` (anndata 0.8 and later), and
    anndata reads whatever else the chosen mode needs. Read into memory, that is
    the whole file: unless the file's layout, ``obs``, ``var``, ``X`` and the
    layers' metadata are all decoded here, ``anndata.read_h5ad`` reads the file
    and its AnnData is returned. Left on disk, only ``obs`` and ``var`` are read:
    by anndata's ``read_elem`` when not decoded here; the matrices are never read
    whole, and :func:`~scperteval.data.ondisk.on_disk` reads their rows (CSR or
    dense) with h5py.

    Parameters
    ----------
    path
        The file.
    backed
        ``False``: read the file into memory (each layer when first asked for);
        ``True``: leave every matrix on disk; ``"auto"``: on disk when the file is
        over a third of the available memory.

    Returns
    -------
    StoredAnnData or anndata.AnnData
        A :class:`StoredAnnData`, in memory (``isbacked`` false) or whose ``X`` and
        layers are the file's unopened matrices (``isbacked`` true, the file open
        read-only while they are referenced); an AnnData when anndata read the file
        into memory.

    Raises
    ------
    OSError
        If the file is not an HDF5 file or cannot be read (or what anndata raises
        for a file neither reader can read).

    """
    if not reads_into_memory(Path(path).stat().st_size, backed):
        return _open_backed(Path(path))
    try:
        return _read_into_memory(Path(path))
    except UnsupportedEncoding:
        import anndata

        return anndata.read_h5ad(path)


def _read_into_memory(path: Path) -> StoredAnnData:
    """``obs``, ``var`` and ``X`` read with h5py, layers on access; the file closed on return.

    Raises
    ------
    UnsupportedEncoding
        If anything needed is stored in a way not decoded here.

    """
    import h5py

    _check_anndata_settings()
    with h5py.File(path, "r") as handle:
        try:
            if _tag(handle) != ("anndata", "0.1.0") or not set(handle) <= _ELEMENTS:
                raise UnsupportedEncoding(f"{path}: not an anndata 0.8+ file")
            if "obs" not in handle or "var" not in handle:
                raise UnsupportedEncoding(f"{path}: no obs or var")
            obs = read_dataframe(handle["obs"])
            var = read_dataframe(handle["var"])
            shape = (len(obs), len(var))
            names = _layer_names(handle, shape)
            X = None
            if "X" in handle:
                if matrix_shape(handle["X"]) != shape:
                    raise UnsupportedEncoding(f"{path}: X does not match obs and var")
                X = read_matrix(handle["X"])
        except (KeyError, TypeError, ValueError) as exc:
            # Malformed in a way anndata may read or may explain better: let it decide.
            raise UnsupportedEncoding(f"{path}: {type(exc).__name__}: {exc}") from exc
    layers = StoredLayers(path, names, shape)
    return StoredAnnData(obs, var, X, layers, source=path)


def _open_backed(path: Path) -> StoredAnnData:
    """The annotations in memory and every matrix left on disk, the file kept open."""
    import h5py

    # No chunk cache: the matrix is read either in long row ranges, which HDF5 copies
    # straight from the file, or row by row for a perturbation's scattered cells,
    # where a cache that can hold a chunk makes every row read its whole chunk (a
    # million values in files written with large chunks): 8 times slower per row.
    handle = h5py.File(path, "r", rdcc_nbytes=0)
    try:
        obs, var = read_dataframe(handle["obs"]), read_dataframe(handle["var"])
    except (UnsupportedEncoding, KeyError, TypeError, ValueError):
        # Older files, other encodings, or malformed tables: anndata reads or explains
        # them, and its AnnData gives them the form it gives any table it holds.
        import anndata

        read_elem = anndata_read_elem()
        annotated = anndata.AnnData(obs=read_elem(handle["obs"]), var=read_elem(handle["var"]))
        obs, var = annotated.obs, annotated.var
    layers = {str(k): v for k, v in handle["layers"].items()} if "layers" in handle else {}
    return StoredAnnData(obs, var, handle.get("X"), layers, path, isbacked=True)


def _layer_names(handle: Any, shape: tuple[int, int]) -> list[str]:
    """Names of the file's layers, after checking (metadata only) that each is decoded."""
    if "layers" not in handle:
        return []
    group = handle["layers"]
    if _tag(group) != ("dict", "0.1.0"):
        raise UnsupportedEncoding(f"{group.name}: not a dict of matrices")
    names = [str(name) for name in group]
    for name in names:
        if matrix_shape(group[name]) != shape:
            raise UnsupportedEncoding(f"{group[name].name}: shape differs from obs and var")
    return names


def _tag(node: Any) -> tuple[Any, Any]:
    """The encoding type and version of an element, as stored."""
    return node.attrs.get("encoding-type"), node.attrs.get("encoding-version")


def _check_anndata_settings() -> None:
    """Refuse when anndata is set to read sparse matrices as arrays, not matrices."""
    module = sys.modules.get("anndata")
    settings = getattr(module, "settings", None)
    if settings is not None:
        as_arrays = bool(getattr(settings, "use_sparse_array_on_read", False))
    else:
        flag = os.environ.get("ANNDATA_USE_SPARSE_ARRAY_ON_READ", "")
        as_arrays = flag.strip().lower() not in ("", "0", "false")
    if as_arrays:
        raise UnsupportedEncoding("anndata is set to read sparse arrays (sparray)")
