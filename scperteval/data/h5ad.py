"""Reading ``.h5ad`` files without importing anndata.

``import anndata`` takes most of a second, because anndata imports zarr and
dask on start-up; h5py alone takes a few hundredths. An evaluation needs only a
file's cell and gene annotations (``obs``, ``var``) and one expression matrix,
so :func:`read_h5ad` reads those with h5py (decoders in
:mod:`scperteval.data.h5ad_elements`) into a :class:`StoredAnnData`, a small
read-only container with the AnnData attributes this package uses. Files in an
encoding it does not decode are read by ``anndata.read_h5ad`` instead, so the
result never differs from anndata's.
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
from scperteval.data.prefetch import discard_prefetch, take_prefetched
from scperteval.data.stored import StoredAnnData, StoredLayers

__all__ = [
    "StoredAnnData",
    "StoredLayers",
    "UnsupportedEncoding",
    "is_anndata",
    "is_annotated_data",
    "read_h5ad",
    "read_stored",
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
        Any object.

    Returns
    -------
    bool
        ``True`` for the two forms a dataset or prediction is read from in memory.

    """
    return isinstance(value, StoredAnnData) or is_anndata(value)


def read_h5ad(path: str | os.PathLike[str]) -> Any:
    """Read an ``.h5ad`` file, with h5py when it can and anndata otherwise.

    Parameters
    ----------
    path
        The file.

    Returns
    -------
    StoredAnnData or anndata.AnnData
        A :class:`StoredAnnData` (layers read on access), or what
        ``anndata.read_h5ad`` returns for a file stored in an encoding that
        :func:`read_stored` does not decode.

    """
    try:
        return read_stored(path)
    except UnsupportedEncoding:
        import anndata

        return anndata.read_h5ad(path)


def read_stored(path: str | os.PathLike[str]) -> StoredAnnData:
    """Read ``obs``, ``var`` and ``X`` of an ``.h5ad`` file with h5py; layers on access.

    The file is closed on return; each layer is read by reopening it.

    Parameters
    ----------
    path
        The file.

    Returns
    -------
    StoredAnnData
        With the same annotations and matrices ``anndata.read_h5ad`` would give.

    Raises
    ------
    UnsupportedEncoding
        If anything needed is stored in a way not decoded here (then read the file
        with anndata).
    OSError
        If the file is not an HDF5 file or cannot be read.

    """
    import h5py

    _check_anndata_settings()
    path = Path(path)
    with h5py.File(path, "r") as handle:
        try:
            kind = (handle.attrs.get("encoding-type"), handle.attrs.get("encoding-version"))
            if kind != ("anndata", "0.1.0") or not set(handle) <= _ELEMENTS:
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
                X = read_matrix(handle["X"], take_prefetched(path))
        except (KeyError, TypeError, ValueError) as exc:
            # Malformed in a way anndata may read or may explain better: let it decide.
            raise UnsupportedEncoding(f"{path}: {type(exc).__name__}: {exc}") from exc
        finally:
            # Arrays read ahead but not taken (the file failed a check) are let go.
            discard_prefetch(path)
    layers = StoredLayers(path, names, shape)
    return StoredAnnData(obs, var, X, layers, source=path)


def _layer_names(handle: Any, shape: tuple[int, int]) -> list[str]:
    """Names of the file's layers, after checking (metadata only) that each is decoded."""
    if "layers" not in handle:
        return []
    group = handle["layers"]
    if (group.attrs.get("encoding-type"), group.attrs.get("encoding-version")) != (
        "dict",
        "0.1.0",
    ):
        raise UnsupportedEncoding(f"{group.name}: not a dict of matrices")
    names = [str(name) for name in group]
    for name in names:
        if matrix_shape(group[name]) != shape:
            raise UnsupportedEncoding(f"{group[name].name}: shape differs from obs and var")
    return names


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
