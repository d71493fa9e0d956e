"""A read-only container for what an evaluation reads of an ``.h5ad`` file.

:class:`StoredAnnData` holds the cell and gene annotations and the expression
matrices read by :func:`scperteval.data.h5ad.open_h5ad`, under the attribute
names of :class:`anndata.AnnData`, so that code written for an AnnData reads it
unchanged; :class:`StoredLayers` reads each layer from the file only when it is
asked for, so that a file with many layers costs the memory of the one used.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

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
        self._read: dict[str, Any] = {}
        # Worker threads asking for a layer at once read it once.
        self._lock = threading.Lock()

    @property
    def loaded(self) -> tuple[str, ...]:
        """Names of the layers read from the file so far."""
        return tuple(self._read)

    def __getitem__(self, name: str) -> Any:
        if name in self._read:
            return self._read[name]
        if name not in self._names:
            raise KeyError(name)
        with self._lock:
            if name not in self._read:
                self._read[name] = self._read_layer(name)
        return self._read[name]

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

    def __getstate__(self) -> dict[str, Any]:
        # A lock belongs to one process; the copy makes its own.
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __contains__(self, name: object) -> bool:
        # Mapping's default would read the layer to answer.
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"StoredLayers({list(self._names)}, loaded={list(self._read)})"


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
        The expression matrix, or ``None``.
    layers
        Further matrices by name: a dict or :class:`StoredLayers`.
    source
        The file read, whose other elements :meth:`to_anndata` reads; ``None``
        for a container built in memory.
    backed
        Whether ``X`` and the layers are the file's matrices left on disk (HDF5
        datasets and groups, read by rows through
        :func:`~scperteval.data.ondisk.on_disk`) rather than in memory.

    """

    def __init__(
        self,
        obs: pd.DataFrame,
        var: pd.DataFrame,
        X: Any = None,
        layers: Mapping[str, Any] | None = None,
        source: Path | None = None,
        backed: bool = False,
    ) -> None:
        if not backed and X is not None and tuple(X.shape) != (len(obs), len(var)):
            raise ValueError(f"X has shape {X.shape}, obs and var {(len(obs), len(var))}")
        if backed and source is None:
            raise ValueError("a backed container needs the file it was read from")
        self._obs = obs
        self._var = var
        self._X = X
        self._layers: Mapping[str, Any] = {} if layers is None else layers
        self._source = source
        self._backed = backed

    @property
    def isbacked(self) -> bool:
        """Whether the matrices are left on disk (as anndata's backed mode)."""
        return self._backed

    @property
    def filename(self) -> Path | None:
        """The file of a backed container (``None`` in memory, as for an AnnData)."""
        return self._source if self._backed else None

    @property
    def obs(self) -> pd.DataFrame:
        """Cell annotations, one row per cell."""
        return self._obs

    @property
    def var(self) -> pd.DataFrame:
        """Gene annotations, one row per gene."""
        return self._var

    @property
    def X(self) -> Any:
        """The expression matrix (cells x genes), or ``None``."""
        return self._X

    @property
    def layers(self) -> Mapping[str, Any]:
        """Further expression matrices by name."""
        return self._layers

    @property
    def obs_names(self) -> pd.Index:
        """Cell names (the index of ``obs``)."""
        return self._obs.index

    @property
    def var_names(self) -> pd.Index:
        """Gene names (the index of ``var``)."""
        return self._var.index

    @property
    def n_obs(self) -> int:
        """Number of cells."""
        return len(self._obs)

    @property
    def n_vars(self) -> int:
        """Number of genes."""
        return len(self._var)

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

        if self._backed:
            return anndata.read_h5ad(self._source, backed="r")
        extra: dict[str, Any] = {}
        if self._source is not None:
            import h5py

            read_elem = anndata_read_elem()
            with h5py.File(self._source, "r") as handle:
                for key in ("obsm", "varm", "obsp", "varp", "uns"):
                    if key in handle:
                        extra[key] = read_elem(handle[key])
                if "raw" in handle:
                    raw = handle["raw"]
                    extra["raw"] = {k: read_elem(raw[k]) for k in ("X", "var", "varm") if k in raw}
        layers = {name: self._layers[name] for name in self._layers}
        return anndata.AnnData(X=self._X, obs=self._obs, var=self._var, layers=layers, **extra)

    def __repr__(self) -> str:
        return (
            f"StoredAnnData with n_obs x n_vars = {self.n_obs} x {self.n_vars}"
            f"{' backed at ' + str(self._source) if self._backed else ''}; "
            f"obs: {list(map(str, self._obs.columns))}; layers: {list(self._layers)}"
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
