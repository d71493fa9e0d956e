"""A read-only container for what an evaluation reads of an ``.h5ad`` file.

:class:`StoredAnnData` holds the cell and gene annotations and the expression
matrices read by :func:`scperteval.data.h5ad.open_h5ad`, under the attribute
names of :class:`anndata.AnnData`, so that code written for an AnnData reads it
unchanged; :class:`StoredLayers` reads each layer from the file only when it is
asked for, so that a file with many layers costs the memory of the one used.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from scperteval._memo import Memo
from scperteval.data.h5ad_elements import UnsupportedEncoding, read_matrix
from scperteval.errors import DatasetError

__all__ = ["StoredAnnData", "StoredLayers", "anndata_read_elem"]


class StoredLayers(Mapping[str, Any]):
    """The layers of an ``.h5ad`` file, each read from the file when first asked for.

    Listing the names (``keys()``, ``in``, ``len``) reads nothing; a layer is read
    on first access (the file is opened for that read only) and kept after.

    Parameters
    ----------
    path
        The file.
    names
        The names of its layers, each already checked to be readable.
    shape
        The shape every layer has (cells x genes).

    """

    def __init__(self, path: Path, names: list[str], shape: tuple[int, int]) -> None:
        self._path = Path(path)
        self._names = tuple(names)
        self._shape = shape
        # Worker threads asking for a layer at once read it once.
        self._read = Memo()

    @property
    def loaded(self) -> tuple[str, ...]:
        """Names of the layers read from the file so far."""
        return tuple(name for name in self._names if name in self._read)

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        return self._read.get(name, lambda: self._read_layer(name))

    def _read_layer(self, name: str) -> Any:
        import h5py

        where = f"{self._path}: layer {name!r}"
        with h5py.File(self._path, "r") as handle:
            try:
                matrix = read_matrix(handle["layers"][name])
            except (KeyError, UnsupportedEncoding) as exc:
                # Checked when the file was opened: it changed since.
                raise DatasetError(f"{where} cannot be read any more ({exc})") from None
        if matrix.shape != self._shape:
            raise DatasetError(f"{where} has shape {matrix.shape}, not {self._shape}")
        return matrix

    def __contains__(self, name: object) -> bool:
        # Mapping's default would read the layer to answer.
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"StoredLayers({list(self._names)}, loaded={list(self.loaded)})"


@dataclass(frozen=True, eq=False, repr=False)
class StoredAnnData:
    """Annotations and expression matrices of an ``.h5ad`` file, without anndata.

    What :func:`~scperteval.data.h5ad.open_h5ad` returns when h5py reads the file:
    a read-only container with the attributes of :class:`anndata.AnnData` this
    package reads: ``obs``, ``var``, ``obs_names``, ``var_names``, ``X``,
    ``layers``, ``n_obs``, ``n_vars``, ``shape``, ``isbacked`` and ``filename``.
    :meth:`to_anndata` gives a real AnnData.

    Parameters
    ----------
    obs, var
        Cell and gene annotations.
    X
        The expression matrix (cells x genes), or ``None``.
    layers
        Further matrices by name: a dict or :class:`StoredLayers`.
    source
        The file read, whose other elements :meth:`to_anndata` reads; ``None``
        for a container built in memory.
    isbacked
        Whether ``X`` and the layers are the file's matrices left on disk (HDF5
        datasets and groups, read by rows through
        :func:`~scperteval.data.ondisk.on_disk`) rather than in memory.

    """

    obs: pd.DataFrame
    var: pd.DataFrame
    X: Any = None
    layers: Mapping[str, Any] = field(default_factory=dict)
    source: Path | None = None
    isbacked: bool = False

    def __post_init__(self) -> None:
        shape = (len(self.obs), len(self.var))
        if not self.isbacked and self.X is not None and tuple(self.X.shape) != shape:
            raise ValueError(f"X has shape {self.X.shape}, obs and var {shape}")
        if self.isbacked and self.source is None:
            raise ValueError("a backed container needs the file it was read from")

    @property
    def filename(self) -> Path | None:
        """The file of a backed container (``None`` in memory, as for an AnnData)."""
        return self.source if self.isbacked else None

    @property
    def obs_names(self) -> pd.Index:
        """Cell names (the index of ``obs``)."""
        return self.obs.index

    @property
    def var_names(self) -> pd.Index:
        """Gene names (the index of ``var``)."""
        return self.var.index

    @property
    def n_obs(self) -> int:
        """Number of cells."""
        return len(self.obs)

    @property
    def n_vars(self) -> int:
        """Number of genes."""
        return len(self.var)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_obs, n_vars)``."""
        return self.n_obs, self.n_vars

    def to_anndata(self) -> Any:
        """A full :class:`anndata.AnnData` (imports anndata).

        ``X``, ``obs``, ``var`` and every layer come from this container (the
        matrices are shared, not copied); for a container read from a file, the
        file's other elements (``obsm``, ``varm``, ``obsp``, ``varp``, ``uns``,
        ``raw``) are read by anndata. A backed container gives the file opened by
        anndata in its backed mode.

        Returns
        -------
        anndata.AnnData
            As ``anndata.read_h5ad`` gives it.

        """
        import anndata

        if self.isbacked:
            return anndata.read_h5ad(self.source, backed="r")
        extra: dict[str, Any] = {}
        if self.source is not None:
            import h5py

            read_elem = anndata_read_elem()
            with h5py.File(self.source, "r") as handle:
                for key in ("obsm", "varm", "obsp", "varp", "uns"):
                    if key in handle:
                        extra[key] = read_elem(handle[key])
                if "raw" in handle:
                    raw = handle["raw"]
                    extra["raw"] = {k: read_elem(raw[k]) for k in ("X", "var", "varm") if k in raw}
        layers = {name: self.layers[name] for name in self.layers}
        return anndata.AnnData(X=self.X, obs=self.obs, var=self.var, layers=layers, **extra)

    def __repr__(self) -> str:
        return (
            f"StoredAnnData with n_obs x n_vars = {self.n_obs} x {self.n_vars}"
            f"{' backed at ' + str(self.source) if self.isbacked else ''}; "
            f"obs: {list(map(str, self.obs.columns))}; layers: {list(self.layers)}"
        )


def anndata_read_elem() -> Any:
    """The ``read_elem`` of anndata (its module moved in anndata 0.11).

    Returns
    -------
    callable
        ``read_elem(element)``: an element of an open file as anndata reads it.

    """
    try:
        from anndata.io import read_elem
    except ImportError:  # anndata < 0.11
        from anndata.experimental import read_elem
    return read_elem
