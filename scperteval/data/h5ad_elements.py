"""Decoding the elements of an ``.h5ad`` file with h5py alone.

anndata (0.8 and later) tags every element it writes with two attributes,
``encoding-type`` and ``encoding-version``. The functions here decode the
encodings that carry cell and gene annotations (``dataframe`` and its column
encodings) and expression matrices (dense ``array``, ``csr_matrix``,
``csc_matrix``), and build the very objects ``anndata.read_h5ad`` builds from
them: the same column order, index name, pandas dtypes, and the stored dtypes of
sparse values and indices.

Anything else (an untagged element from an old file, an encoding or version not
listed in :data:`VERSIONS`, stored arrays of an unexpected kind or length)
raises :class:`UnsupportedEncoding`; the caller then reads the file with anndata,
so that nothing is ever returned that anndata would have read differently.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

__all__ = [
    "VERSIONS",
    "UnsupportedEncoding",
    "encoding",
    "matrix_shape",
    "read_dataframe",
    "read_matrix",
]

#: The encodings decoded here, each with the one version whose layout is known.
VERSIONS = MappingProxyType(
    {
        "dataframe": "0.2.0",
        "array": "0.2.0",
        "string-array": "0.2.0",
        "categorical": "0.2.0",
        "nullable-integer": "0.1.0",
        "nullable-boolean": "0.1.0",
        "nullable-string-array": "0.1.0",
        "csr_matrix": "0.1.0",
        "csc_matrix": "0.1.0",
    }
)

# Value kinds anndata reads from an "array" as plain numbers: bool, integers,
# floats, complex. Others (bytes, records, objects) go through anndata.
_NUMERIC = "biufc"


class UnsupportedEncoding(Exception):
    """An element stored in a way this reader does not decode: read it with anndata."""


def encoding(node: Any) -> str:
    """The ``encoding-type`` of an element, checked against :data:`VERSIONS`.

    Parameters
    ----------
    node
        An :class:`h5py.Group` or :class:`h5py.Dataset`.

    Returns
    -------
    str
        The encoding type.

    Raises
    ------
    UnsupportedEncoding
        If the element is untagged, or its type or version is not decoded here.

    """
    kind = _text(node.attrs.get("encoding-type"))
    version = _text(node.attrs.get("encoding-version"))
    if kind is None or VERSIONS.get(kind) != version:
        raise UnsupportedEncoding(f"{node.name}: encoding {kind!r}, version {version!r}")
    return kind


def read_dataframe(group: Any) -> pd.DataFrame:
    """An ``obs`` or ``var`` table stored in the ``dataframe`` encoding.

    Parameters
    ----------
    group
        The :class:`h5py.Group` of the table.

    Returns
    -------
    pandas.DataFrame
        Columns in the stored order, the index named as stored (unnamed when
        stored as ``_index``).

    Raises
    ------
    UnsupportedEncoding
        For a table, index or column this module does not decode.

    """
    import h5py

    if not isinstance(group, h5py.Group) or encoding(group) != "dataframe":
        raise UnsupportedEncoding(f"{group.name}: not a dataframe")
    index_key = _text(group.attrs.get("_index"))
    order = group.attrs.get("column-order")
    if index_key is None or not isinstance(order, np.ndarray) or order.ndim != 1:
        raise UnsupportedEncoding(f"{group.name}: no index name or column order")
    columns = list(order)
    if not all(isinstance(name, str) for name in columns):
        raise UnsupportedEncoding(f"{group.name}: column names are not all text")
    # anndata turns any other index into strings (with a warning): leave that to it.
    index_node = _child(group, index_key)
    if encoding(index_node) != "string-array":
        raise UnsupportedEncoding(f"{index_node.name}: an index that is not of strings")
    index = _read_array(index_node, "string-array")
    values = {name: _read_column(_child(group, name), len(index)) for name in columns}
    frame = pd.DataFrame(values, index=index, columns=columns or None)
    if index_key != "_index":
        frame.index.name = index_key
    if not len(frame.columns):
        # An AnnData holds a table without columns with a text (not range) column index.
        frame.columns = frame.columns.astype(str)
    return frame


def matrix_shape(node: Any) -> tuple[int, int]:
    """The shape of a stored matrix, after checking that :func:`read_matrix` decodes it.

    Only metadata is read (attributes, dtypes, lengths), no values.

    Parameters
    ----------
    node
        A dense :class:`h5py.Dataset` or a sparse matrix :class:`h5py.Group`.

    Returns
    -------
    tuple of int
        ``(rows, columns)``.

    Raises
    ------
    UnsupportedEncoding
        For a matrix this module does not decode.

    """
    import h5py

    kind = encoding(node)
    if kind == "array" and isinstance(node, h5py.Dataset):
        if node.ndim != 2 or node.dtype.kind not in _NUMERIC:
            raise UnsupportedEncoding(f"{node.name}: {node.ndim}-D array of {node.dtype}")
        return int(node.shape[0]), int(node.shape[1])
    if kind not in ("csr_matrix", "csc_matrix") or not isinstance(node, h5py.Group):
        raise UnsupportedEncoding(f"{node.name}: not a matrix ({kind})")
    shape = np.asarray(node.attrs.get("shape", ()))
    if shape.shape != (2,) or shape.dtype.kind not in "iu":
        raise UnsupportedEncoding(f"{node.name}: no shape")
    data, indices, indptr = (_child(node, key) for key in ("data", "indices", "indptr"))
    compressed = int(shape[0] if kind == "csr_matrix" else shape[1])
    if (
        not all(isinstance(part, h5py.Dataset) and part.ndim == 1 for part in (data, indices))
        or not isinstance(indptr, h5py.Dataset)
        or data.dtype.kind not in _NUMERIC
        # anndata keeps the stored index dtypes, which scipy would unify or narrow.
        or indices.dtype.kind not in "iu"
        or indices.dtype != indptr.dtype
        or indices.shape != data.shape
        or indptr.shape != (compressed + 1,)
    ):
        raise UnsupportedEncoding(f"{node.name}: malformed {kind}")
    return int(shape[0]), int(shape[1])


def read_matrix(node: Any) -> Any:
    """A stored matrix in memory, with the dtypes anndata gives it.

    Parameters
    ----------
    node
        A matrix as :func:`matrix_shape` takes it: a dense :class:`h5py.Dataset` or a
        sparse matrix :class:`h5py.Group`.

    Returns
    -------
    numpy.ndarray or scipy.sparse.csr_matrix or scipy.sparse.csc_matrix
        Sparse values and indices keep their stored dtypes (no narrowing of
        64-bit indices, which numba kernels would compile for anew).

    Raises
    ------
    UnsupportedEncoding
        For a matrix this module does not decode.

    """
    shape = matrix_shape(node)
    kind = encoding(node)
    if kind == "array":
        return node[()]
    data, indices, indptr = (node[key][()] for key in ("data", "indices", "indptr"))
    cls = sp.csr_matrix if kind == "csr_matrix" else sp.csc_matrix
    # The constructor would copy the index arrays into the narrowest dtype that
    # fits; an empty matrix of the right dtype, filled in place, keeps them as stored.
    matrix = cls(shape, dtype=data.dtype)
    matrix.data, matrix.indices, matrix.indptr = data, indices, indptr
    return matrix


def _read_column(node: Any, length: int) -> Any:
    """One column of a table: a NumPy array, a Categorical or a pandas masked array."""
    kind = encoding(node)
    if kind in ("array", "string-array"):
        values = _read_array(node, kind)
    elif kind == "categorical":
        codes = _read_array(_child(node, "codes"), "array")
        categories_node = _child(node, "categories")
        stored_as = encoding(categories_node)
        if stored_as not in ("array", "string-array"):
            raise UnsupportedEncoding(f"{categories_node.name}: categories as {stored_as}")
        categories = _read_array(categories_node, stored_as)
        ordered = node.attrs.get("ordered")
        if codes.dtype.kind not in "iu" or ordered is None:
            raise UnsupportedEncoding(f"{node.name}: malformed categorical")
        values = pd.Categorical.from_codes(codes, categories=categories, ordered=bool(ordered))
    else:
        values = _read_nullable(node, kind)
    if len(values) != length:
        raise UnsupportedEncoding(f"{node.name}: {len(values)} values for {length} rows")
    return values


def _read_nullable(node: Any, kind: str) -> Any:
    """A pandas masked array from its ``values`` and ``mask`` (True where missing)."""
    mask = _read_array(_child(node, "mask"), "array")
    expected = "string-array" if kind == "nullable-string-array" else "array"
    values = _read_array(_child(node, "values"), expected)
    wanted = {"nullable-integer": "iu", "nullable-boolean": "b"}.get(kind, "O")
    if mask.dtype.kind != "b" or values.dtype.kind not in wanted or mask.shape != values.shape:
        raise UnsupportedEncoding(f"{node.name}: malformed {kind}")
    if kind == "nullable-integer":
        return pd.arrays.IntegerArray(values, mask)
    if kind == "nullable-boolean":
        return pd.arrays.BooleanArray(values, mask)
    strings = pd.array(values, dtype=pd.StringDtype())
    strings[mask] = pd.NA  # stored as "" where missing
    return strings


def _read_array(node: Any, kind: str) -> np.ndarray:
    """The values of an ``array`` (numbers) or ``string-array`` (to Python ``str``)."""
    import h5py

    if not isinstance(node, h5py.Dataset) or encoding(node) != kind or node.ndim != 1:
        raise UnsupportedEncoding(f"{node.name}: expected a 1-D {kind}")
    if kind == "string-array":
        if h5py.check_string_dtype(node.dtype) is None:
            raise UnsupportedEncoding(f"{node.name}: string-array of {node.dtype}")
        return np.asarray(node.asstr()[()], dtype=object)
    if node.dtype.kind not in _NUMERIC:
        raise UnsupportedEncoding(f"{node.name}: array of {node.dtype}")
    return np.asarray(node[()])


def _child(group: Any, key: str) -> Any:
    """``group[key]``, or :class:`UnsupportedEncoding` when absent."""
    if key not in group:
        raise UnsupportedEncoding(f"{group.name}: no element {key!r}")
    return group[key]


def _text(value: Any) -> str | None:
    """An attribute holding one string (h5py gives ``str`` or ``bytes``), else ``None``."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value) if isinstance(value, str) else None
