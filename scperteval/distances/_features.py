"""Cells grouped for a distance: the feature space and the groups of each covariate.

The feature space is one of: an embedding of ``obsm`` (``obsm_key``), a layer or ``X``
(``layer``; ``None`` is ``X``), or a space fitted here (``space``), named and
parsed as the engine's spaces that need only cells
(:func:`~scperteval.engine.spaces.parse_cells_space`): ``"pca(k=50)"`` (the exact
principal axes of all selected cells of the covariate group, centred, not scaled),
``"hvg(k=2000)"`` (the genes of largest variance over those cells) or ``"full"``
(every gene). Cells are read one group at a time; only the selected
features of a group are held densely, never a cells x cells matrix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from scperteval.data.dataset import normalize_log1p
from scperteval.data.labels import unmatched_listing
from scperteval.engine.spaces import parse_cells_space, principal_axes, top_indices
from scperteval.errors import DatasetError, SpecError
from scperteval.registry import did_you_mean

__all__ = ["ALL", "GroupedCells", "group_cells"]

#: The covariate label used when no covariate column is given.
ALL = "all"


@dataclass
class GroupedCells:
    """The cells of one covariate group, by group label, in one feature space.

    Attributes
    ----------
    covariate
        The covariate value (:data:`ALL` without a covariate column).
    groups
        Group labels, in order of first appearance in ``obs`` (as ``pandas.unique``).
    cells
        ``cells[label]``: float64 array, cells x features.
    space
        Readable name of the feature space.

    """

    covariate: str
    groups: list[str]
    cells: dict[str, np.ndarray]
    space: str

    def sizes(self) -> dict[str, int]:
        """Number of cells of each group."""
        return {label: int(self.cells[label].shape[0]) for label in self.groups}


def _require(key: str, present: Any, message: str) -> None:
    """Raise ``message`` (with the closest name of ``present``) unless ``key`` is in it."""
    if key not in present:
        raise DatasetError(message + did_you_mean(key, [str(name) for name in present]))


def _column(adata: Any, key: str, what: str) -> pd.Series:
    _require(key, adata.obs.columns, f"{what} column {key!r} is not in obs")
    column = adata.obs[key]
    unlabelled = int(column.isna().sum())
    if unlabelled:
        # astype(str) would make them a group 'nan' of cells that have no label.
        raise DatasetError(
            f"{unlabelled} cell(s) have no label (NaN or None) in {what} column {key!r}; "
            "label them or leave them out (subset)"
        )
    return column.astype(str)


def _selected(adata: Any, subset: Mapping[str, Any] | None) -> np.ndarray:
    keep = np.ones(adata.n_obs, dtype=bool)
    for column, accepted in (subset or {}).items():
        values = _column(adata, str(column), "subset")
        if isinstance(accepted, (str, bytes)) or not isinstance(accepted, Sequence):
            accepted = [accepted]
        keep &= values.isin([str(v) for v in accepted]).to_numpy()
    if not keep.any():
        raise DatasetError(f"no cell matches the subset {dict(subset or {})!r}")
    return np.flatnonzero(keep)


def _matrix(adata: Any, layer: str | None) -> Any:
    if layer is None:
        if adata.X is None:
            raise DatasetError("the data has no X matrix; choose a layer or an obsm embedding")
        return adata.X
    _require(layer, list(adata.layers.keys()), f"layer {layer!r} is not in the AnnData")
    return adata.layers[layer]


def _embedding(adata: Any, obsm_key: str) -> np.ndarray:
    _require(obsm_key, list(adata.obsm.keys()), f"embedding {obsm_key!r} is not in obsm")
    values = adata.obsm[obsm_key]
    values = values.to_numpy() if isinstance(values, pd.DataFrame) else values
    if sp.issparse(values):
        values = values.toarray()
    return np.asarray(values)


def _dense_float(block: Any) -> np.ndarray:
    dense = block.toarray() if sp.issparse(block) else np.asarray(block)
    return np.ascontiguousarray(dense, dtype=np.float64)


def _check_finite(values: np.ndarray, where: str) -> None:
    if not np.isfinite(values).all():
        raise DatasetError(f"{where} holds NaN or infinite values")


def _rows(matrix: Any, rows: np.ndarray, normalize: bool = False) -> Any:
    block = matrix[rows]
    return normalize_log1p(block) if normalize else block


def _fit(matrix: Any, rows: np.ndarray, name: str, options: dict[str, Any], normalize: bool) -> Any:
    """A function from the rows of ``matrix`` to the space fitted on ``rows``."""
    sample = _rows(matrix, rows, normalize)
    stored = sample.data if sp.issparse(sample) else np.asarray(sample)
    # A fitted space of non-finite values fails inside LAPACK without saying why.
    _check_finite(stored, "the matrix the space is fitted on")
    if name == "pca":
        components, offset = principal_axes(sample, int(options["k"]))
        return lambda block: (_dense_float(block) - offset) @ components
    if name == "hvg":
        block = sample.tocsc() if sp.issparse(sample) else sample
        mean = np.asarray(block.mean(axis=0), dtype=np.float64).ravel()
        if sp.issparse(block):
            squares = np.asarray(block.multiply(block).mean(axis=0), dtype=np.float64).ravel()
        else:
            squares = np.mean(np.asarray(block, dtype=np.float64) ** 2, axis=0)
        genes = top_indices(squares - mean**2, int(options["k"]))
        return lambda block: _dense_float(block[:, genes])
    return _dense_float


def group_cells(
    adata: Any,
    groupby: str,
    *,
    groups: Sequence[str] | None = None,
    obsm_key: str | None = None,
    layer: str | None = None,
    space: str | None = None,
    covariate_key: str | None = None,
    subset: Mapping[str, Any] | None = None,
    normalize: bool = False,
) -> list[GroupedCells]:
    """The cells of every group, per covariate value, in the chosen feature space.

    Parameters
    ----------
    adata
        An :class:`anndata.AnnData` (in memory or backed).
    groupby
        ``obs`` column of the group labels (perturbations).
    groups
        Groups to keep (all by default); each must exist.
    obsm_key, layer, space
        The feature space, at most one of ``obsm_key`` and ``space`` (``layer`` is the
        matrix a fitted ``space`` reads). With none of them, ``obsm["X_pca"]`` when it
        exists, else ``"pca(k=50)"`` fitted on ``X``. ``layer`` alone gives the raw
        layer values (as ``space="full"``).
    covariate_key
        ``obs`` column (cell line, cell type): groups are compared within each of
        its values, and a fitted space is fitted within each value.
    subset
        Keep only cells whose ``obs`` values match (a value or list per column).
    normalize
        Read the matrix as raw counts: ``normalize_total(1e4)`` then ``log1p`` per
        cell, as :class:`~scperteval.data.dataset.Dataset` does; the default space is
        then ``"pca(k=50)"`` of the normalised values, and an embedding is refused.

    Returns
    -------
    list of GroupedCells
        One per covariate value, sorted by value.

    Raises
    ------
    SpecError
        For conflicting or unknown feature-space options.
    DatasetError
        For a missing column, group, layer or embedding, or non-finite values.

    """
    if obsm_key is not None and (space is not None or layer is not None):
        raise SpecError("give obsm_key or layer/space, not both")
    if obsm_key is not None and normalize:
        raise SpecError("normalize applies to X or a layer, not to an obsm embedding")
    if obsm_key is None and layer is None and space is None:
        if "X_pca" in adata.obsm and not normalize:
            obsm_key = "X_pca"
        else:
            space = "pca(k=50)"
    if obsm_key is None and space is None:
        space = "full"
    fitted = parse_cells_space(space) if space is not None else None
    if adata.n_obs == 0 or (obsm_key is None and adata.n_vars == 0):
        raise DatasetError(f"the data has no cells or no genes ({adata.n_obs} x {adata.n_vars})")
    labels = _column(adata, groupby, "groupby")
    rows = _selected(adata, subset)
    if covariate_key is not None:
        covariates = _column(adata, covariate_key, "covariate").to_numpy()[rows]
    else:
        covariates = np.full(rows.shape[0], ALL, dtype=object)
    selected_labels = labels.to_numpy()[rows]
    if groups is not None:
        wanted = [str(g) for g in groups]
        if not wanted:
            raise SpecError("groups is empty; name at least one group, or None for all")
        present = set(selected_labels.tolist())
        missing = [g for g in wanted if g not in present]
        if missing:
            shown = unmatched_listing(missing, sorted(map(str, present)))
            raise DatasetError(f"group(s) {shown} have no cell in column {groupby!r}")
        keep = np.isin(selected_labels, wanted)
        rows, covariates, selected_labels = rows[keep], covariates[keep], selected_labels[keep]
    if obsm_key is not None:
        matrix: Any = _embedding(adata, obsm_key)
        if matrix.ndim != 2 or matrix.shape[0] != adata.n_obs:
            raise DatasetError(f"obsm[{obsm_key!r}] is not a cells x features array")
        label = f"obsm[{obsm_key!r}]"
    else:
        matrix = _matrix(adata, layer)
        label = f"{space}" + (f" of layer {layer!r}" if layer is not None else "")
    result = []
    for covariate in sorted(set(covariates.tolist())):
        in_covariate = covariates == covariate
        cov_rows = rows[in_covariate]
        cov_labels = selected_labels[in_covariate]
        transform = _dense_float if fitted is None else _fit(matrix, cov_rows, *fitted, normalize)
        order = [str(g) for g in pd.unique(cov_labels)]
        if groups is not None:
            order = [g for g in (str(x) for x in groups) if g in set(order)]
        cells = {}
        for group in order:
            values = transform(_rows(matrix, cov_rows[cov_labels == group], normalize))
            _check_finite(values, f"{label} of group {group!r}")
            cells[group] = values
        result.append(GroupedCells(str(covariate), order, cells, label))
    return result
