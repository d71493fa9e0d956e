"""Reading and validating a perturbation dataset.

A :class:`Dataset` wraps an AnnData (in memory, read from an ``.h5ad`` file
without anndata where it can, or opened backed) together with the column names
that give it meaning: which column labels the perturbation, which label marks
control cells, and optionally which column holds a covariate (cell line, cell
type) within which every statistic is computed. It validates the input once,
with one-line errors that name the file, the column and the offending values, and
streams the expression matrix in row chunks so that files larger than memory work.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from scperteval.data.labels import (
    check_reading_options,
    control_label_hint,
    listing,
    looks_like_control,
    unmatched_listing,
)
from scperteval.data.matrix_io import (
    csr_row_view,
    is_dask,
    matrix_only,
    open_data,
    read_matrix_rows,
)
from scperteval.data.ondisk import on_disk
from scperteval.errors import DatasetError
from scperteval.kernels.threads import Threads

__all__ = ["Dataset", "Condition", "COMBINATION_SEPARATOR", "DEFAULT_CHUNK_CELLS"]

COMBINATION_SEPARATOR = "+"
DEFAULT_CHUNK_CELLS = 50_000
#: Largest value seen in log1p(normalize_total(1e4)) data is log(1e4 + 1) ~ 9.2;
#: integer data above this is almost certainly raw counts.
RAW_COUNT_MAX = 20.0
ALL_COVARIATES = "all"


@dataclass(frozen=True)
class Condition:
    """One perturbation within one covariate group."""

    covariate: str
    perturbation: str

    @property
    def components(self) -> tuple[str, ...]:
        """Single perturbations of a combination ``A+B`` (the label itself otherwise)."""
        return tuple(part for part in self.perturbation.split(COMBINATION_SEPARATOR) if part)

    @property
    def is_combination(self) -> bool:
        """Whether the label names two or more perturbations joined by ``+``."""
        return len(self.components) > 1


class Dataset:
    """A validated perturbation dataset.

    Parameters
    ----------
    data
        An :class:`anndata.AnnData`, a
        :class:`~scperteval.data.h5ad.StoredAnnData`, or a path to an ``.h5ad`` file.
    perturbation_key
        Column of ``obs`` with the perturbation label of every cell.
    control_label
        Label of control cells in that column.
    covariate_key
        Optional column of ``obs`` (cell line, cell type); statistics are
        computed within each of its groups, each of which needs control cells.
    layer
        Read expression from ``layers[layer]`` instead of ``X``.
    min_cells
        Perturbations (per covariate group) with fewer cells are left out.
    normalize
        Apply ``normalize_total`` to 1e4 counts then ``log1p`` (for raw counts).
    subset
        Keep only cells whose ``obs`` values match, e.g. ``{"dataset": "norman19"}``
        (a value or a list of accepted values per column).
    backed
        ``True`` opens the file read-only and leaves its matrices on disk (only
        ``obs`` and ``var`` are loaded; rows are read when needed, see
        :mod:`scperteval.data.ondisk`), ``False`` loads it, ``"auto"`` opens it backed
        when the file is larger than a third of the available memory.
    chunk_cells
        Number of rows read at a time when streaming the matrix;
        ``DEFAULT_CHUNK_CELLS`` by default, in memory (rows read without copying)
        or backed alike.

    Attributes
    ----------
    adata
        The data read: the :class:`anndata.AnnData` given, or for a file what
        :func:`~scperteval.data.h5ad.open_h5ad` gives: a
        :class:`~scperteval.data.h5ad.StoredAnnData`, a lightweight read-only
        container with the same attributes (``obs``, ``var``, ``obs_names``,
        ``var_names``, ``X``, ``layers``, ``n_obs``, ``n_vars``, ``shape``),
        read without importing anndata (its ``to_anndata()`` gives a full
        AnnData), or an AnnData for a file that needs anndata to be read. A backed
        dataset's ``adata`` holds ``obs`` and ``var`` in memory and its matrices
        on disk.

    Raises
    ------
    DatasetError
        With a one-line message naming the source, column and values.

    """

    def __init__(
        self,
        data: Any,
        perturbation_key: str = "perturbation",
        control_label: str = "control",
        covariate_key: str | None = None,
        layer: str | None = None,
        min_cells: int = 4,
        normalize: bool = False,
        subset: Mapping[str, Any] | None = None,
        backed: bool | str = "auto",
        chunk_cells: int | None = None,
    ) -> None:
        self.source = str(data) if isinstance(data, (str, os.PathLike)) else "AnnData"
        self.path = Path(data) if isinstance(data, (str, os.PathLike)) else None
        check_reading_options(
            perturbation_key, covariate_key, min_cells, subset, backed, chunk_cells
        )
        self.adata = open_data(data, backed)
        self._disk_matrix: Any = None
        self.perturbation_key = perturbation_key
        self.control_label = str(control_label)
        self.covariate_key = covariate_key
        self.layer = layer
        self.min_cells = int(min_cells)
        self.normalize = bool(normalize)
        self.chunk_cells = int(chunk_cells) if chunk_cells else 0
        if self.min_cells < 2:
            raise DatasetError(f"min_cells must be at least 2, got {min_cells}")
        self._check_shape_and_columns()
        self.subset = {str(k): v for k, v in (subset or {}).items()}
        self.cell_index = self._select_cells(self.subset)
        obs = self.adata.obs.iloc[self.cell_index]
        unlabelled = int(obs[perturbation_key].isna().sum())
        if unlabelled:
            raise self._fail(
                f"{unlabelled} cell(s) have no label (NaN or None) in column "
                f"{perturbation_key!r}; label them or remove them (e.g. with subset=...)"
            )
        self.perturbation_labels = obs[perturbation_key].astype(str).to_numpy()
        if covariate_key is None:
            self.covariate_labels = np.full(self.cell_index.shape[0], ALL_COVARIATES, dtype=object)
        else:
            self.covariate_labels = obs[covariate_key].astype(str).to_numpy()
        self.var_names = pd.Index(self.adata.var_names.astype(str))
        self._check_labels()
        self.conditions, self.dropped = self._select_conditions()
        self._check_values()

    # ------------------------------------------------------------------ shape
    @property
    def n_cells(self) -> int:
        """Number of cells kept (after ``subset``)."""
        return int(self.cell_index.shape[0])

    @property
    def n_genes(self) -> int:
        """Number of genes (features)."""
        return int(self.var_names.shape[0])

    @property
    def covariates(self) -> list[str]:
        """Covariate groups, sorted (``["all"]`` without a covariate column)."""
        return sorted(set(self.covariate_labels.tolist()))

    @property
    def is_backed(self) -> bool:
        """Whether the matrix is read from disk chunk by chunk."""
        return bool(self.adata.isbacked)

    def options(self) -> dict[str, Any]:
        """The reading options, as recorded in ``run.json``."""
        return {
            "perturbation_key": self.perturbation_key,
            "control_label": self.control_label,
            "covariate_key": self.covariate_key,
            "layer": self.layer,
            "min_cells": self.min_cells,
            "normalize": self.normalize,
            "subset": self.subset,
            "backed": self.is_backed,
            "chunk_cells": self.chunk_cells or None,
        }

    def perturbations(self, covariate: str | None = None) -> list[str]:
        """Perturbations evaluated (optionally within one covariate group)."""
        return [
            c.perturbation for c in self.conditions if covariate is None or c.covariate == covariate
        ]

    def combinations(self) -> list[Condition]:
        """Conditions whose label is a combination ``A+B``."""
        return [c for c in self.conditions if c.is_combination]

    def describe(self) -> str:
        """One-line summary of the dataset."""
        return (
            f"{self.source}: {self.n_cells} cells x {self.n_genes} genes, "
            f"{len(self.conditions)} perturbations in {len(self.covariates)} covariate group(s)"
            + (f", {len(self.dropped)} left out (< {self.min_cells} cells)" if self.dropped else "")
        )

    # --------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        # Workers need the expression matrix only: obs, obsm, uns and other layers
        # stay behind, and a file read from disk travels as its name and is reopened.
        state = self.__dict__.copy()
        if self.is_backed:
            state["adata"] = None
            state["_disk_matrix"] = None
            state["_backed_file"] = str(self.path or self.adata.filename)
        else:
            state["adata"] = matrix_only(self.adata, self.layer)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        backed_file = state.pop("_backed_file", None)
        self.__dict__.update(state)
        if backed_file is not None:
            self.adata = open_data(backed_file, backed=True)

    # ---------------------------------------------------------------- reading
    def matrix(self) -> Any:
        """The expression matrix object (``X`` or the layer).

        For a backed dataset, a :class:`~scperteval.data.ondisk.DiskCSR` or an
        :class:`h5py.Dataset` that reads row ranges from the file.
        """
        if self._disk_matrix is None:
            stored = self.adata.layers[self.layer] if self.layer is not None else self.adata.X
            if self.is_backed:
                where = f"{self.source}: " + (f"layer {self.layer!r}" if self.layer else "X")
                self._disk_matrix = on_disk(stored, where)
            elif getattr(stored, "dtype", None) == np.float16:
                # Half precision has no compiled kernels; float32 holds every such value exactly.
                self._disk_matrix = stored.astype(np.float32)
            else:
                return stored
        return self._disk_matrix

    def chunk_slices(self, chunk_cells: int | None = None) -> list[slice]:
        """Row ranges of the kept cells that :meth:`iter_chunks` reads, in order.

        ``chunk_cells`` (or the dataset's) cells each; without a size, the row
        chunks of a dask array and ``DEFAULT_CHUNK_CELLS`` otherwise. In memory or
        backed, the chunks are the same rows, so that statistics folded chunk by
        chunk are the same bits however the matrix is held.
        """
        size = int(chunk_cells or self.chunk_cells)
        matrix = self.matrix()
        if size <= 0 and is_dask(matrix):
            # Follow the array's own blocks so that each chunk reads whole blocks once.
            block_starts = np.cumsum((0, *matrix.chunks[0]))
            bounds = np.unique(np.searchsorted(self.cell_index, block_starts))
            return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        if size <= 0:
            size = DEFAULT_CHUNK_CELLS
        return [
            slice(start, min(start + size, self.n_cells)) for start in range(0, self.n_cells, size)
        ]

    def read_chunk(self, positions: slice) -> Any:
        """The kept cells of one of :meth:`chunk_slices` (CSR or dense, normalised if asked)."""
        start, stop = positions.start, positions.stop
        matrix = self.matrix()
        if self._stored_as_kept(matrix):
            # In-memory rows are views, not copies: the whole dense matrix, or CSR row ranges.
            if not sp.issparse(matrix) and start == 0 and stop >= self.n_cells:
                return np.asarray(matrix)
            if sp.issparse(matrix) and matrix.format == "csr":
                return csr_row_view(matrix, start, stop)
        block = read_matrix_rows(matrix, self.cell_index[start:stop], max(stop - start, 1))
        return normalize_log1p(block) if self.normalize else block

    def resident_csr(self) -> sp.csr_matrix | None:
        """The kept cells as the CSR matrix held in memory, not a copy; ``None`` otherwise.

        Only when that matrix's rows are the kept cells in order and its values are
        used as stored (no subset dropping cells, no normalisation, not backed and
        not a dask array): row ``i`` is then the cell at position ``i``. Read only.
        """
        matrix = self.matrix()
        if self._stored_as_kept(matrix) and sp.issparse(matrix) and matrix.format == "csr":
            return matrix
        return None

    def _stored_as_kept(self, matrix: Any) -> bool:
        whole = self.cell_index.shape[0] == self.adata.n_obs
        return not self.is_backed and whole and not self.normalize and not is_dask(matrix)

    def iter_chunks(self, chunk_cells: int | None = None) -> Iterator[tuple[slice, Any]]:
        """Yield ``(positions, block)`` over the kept cells in order.

        ``positions`` is a slice into the kept cells (``0 .. n_cells``, see
        :meth:`chunk_slices`); ``block`` is a sparse (CSR) or dense float array of
        those cells (:meth:`read_chunk`), normalised when ``normalize`` was requested.
        A dask-array matrix is read one chunk at a time, never as a whole.
        """
        for positions in self.chunk_slices(chunk_cells):
            yield positions, self.read_chunk(positions)

    def rows(self, positions: np.ndarray) -> Any:
        """Expression of the kept cells at ``positions`` (in that order).

        A backed matrix is read in contiguous slices of nearby rows, each of at
        most ``chunk_cells`` rows, so that only the rows asked for (and short gaps
        between them) are read.
        """
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size > 1 and np.any(np.diff(positions) <= 0):
            # Files are read in ascending order; the caller's order is restored after.
            unique, inverse = np.unique(positions, return_inverse=True)
            return self.rows(unique)[inverse]
        span = self.chunk_cells or DEFAULT_CHUNK_CELLS
        block = read_matrix_rows(self.matrix(), self.cell_index[positions], span)
        return normalize_log1p(block) if self.normalize else block

    # ------------------------------------------------------------- validation
    def _fail(self, message: str) -> DatasetError:
        return DatasetError(f"{self.source}: {message}")

    def _check_shape_and_columns(self) -> None:
        if self.adata.n_obs == 0 or self.adata.n_vars == 0:
            raise self._fail(
                f"empty dataset ({self.adata.n_obs} cells x {self.adata.n_vars} genes)"
            )
        self._require_column("perturbation", self.perturbation_key)
        self._require_column("covariate", self.covariate_key)
        layers = list(map(str, self.adata.layers.keys()))
        if self.layer is not None and self.layer not in layers:
            raise self._fail(
                f"layer {self.layer!r} not found; available layers: {listing(layers) or '(none)'}"
            )
        if self.layer is None and self.adata.X is None:
            raise self._fail("the data has no X matrix; choose a layer")
        names = pd.Index(self.adata.var_names.astype(str))
        if names.has_duplicates:
            duplicated = names[names.duplicated()].unique().tolist()
            raise self._fail(
                f"duplicate gene names in var_names: {listing(duplicated)} "
                "(make them unique, e.g. adata.var_names_make_unique())"
            )

    def _require_column(self, role: str, key: str | None) -> None:
        if key is not None and key not in self.adata.obs.columns:
            hint = self._label_column_hint() if role == "perturbation" else ""
            raise self._fail(
                f"{role} column {key!r} not found in obs; available columns: "
                f"{listing(list(map(str, self.adata.obs.columns)))}{hint}"
            )

    def _select_cells(self, subset: Mapping[str, Any]) -> np.ndarray:
        keep = np.ones(self.adata.n_obs, dtype=bool)
        for column, accepted in subset.items():
            self._require_column("subset", column)
            values = self.adata.obs[column].astype(str)
            present = sorted(values.unique())
            one = isinstance(accepted, (str, int, float))
            wanted = [str(v) for v in ([accepted] if one else accepted)]
            missing = sorted(set(wanted) - set(present))
            if missing:
                raise self._fail(
                    f"subset value(s) {unmatched_listing(missing, present)} "
                    f"not found in column {column!r}; available: {listing(present)}"
                )
            keep &= values.isin(wanted).to_numpy()
        return np.flatnonzero(keep)

    def _label_column_hint(self) -> str:
        """`` (column 'x' holds the control label 'y')`` for columns that look like labels."""
        for column in self.adata.obs.columns:
            values = self.adata.obs[column]
            if pd.api.types.is_numeric_dtype(values):
                continue
            distinct = set(map(str, pd.unique(values.astype(str))))
            if self.control_label in distinct:
                return f" (column {str(column)!r} holds the control label {self.control_label!r})"
            controls = sorted(label for label in distinct if looks_like_control(label))
            if controls and len(distinct) > 2:
                return (
                    f" (column {str(column)!r} holds labels that look like controls: "
                    f"{listing(controls, limit=3)})"
                )
        return ""

    def _check_labels(self) -> None:
        key = self.perturbation_key
        labels = self.perturbation_labels
        if self.control_label not in set(labels.tolist()):
            raise self._fail(
                f"control label {self.control_label!r} not found in column {key!r}; "
                + control_label_hint(sorted(set(labels.tolist())))
            )
        for covariate in self.covariates:
            in_group = self.covariate_labels == covariate
            n_controls = int(np.sum(labels[in_group] == self.control_label))
            if n_controls == 1:
                where = "" if self.covariate_key is None else f" in covariate group {covariate!r}"
                raise self._fail(
                    f"only one control cell{where}; the control mean and the control "
                    "samples need at least 2"
                )
            if n_controls == 0:  # only with covariate groups: the control label is present
                raise self._fail(
                    f"control label {self.control_label!r} absent from covariate group "
                    f"{covariate!r} of column {self.covariate_key!r}; every group needs "
                    "control cells"
                )

    def _select_conditions(self) -> tuple[list[Condition], list[tuple[Condition, int]]]:
        frame = pd.DataFrame(
            {"covariate": self.covariate_labels, "perturbation": self.perturbation_labels}
        )
        counts = frame.value_counts(sort=False)
        kept: list[Condition] = []
        dropped: list[tuple[Condition, int]] = []
        for (covariate, perturbation), count in sorted(counts.items()):
            if perturbation == self.control_label:
                continue
            condition = Condition(str(covariate), str(perturbation))
            if count >= self.min_cells:
                kept.append(condition)
            else:
                dropped.append((condition, int(count)))
        if not kept:
            detail = ", ".join(f"{c.perturbation} ({n})" for c, n in dropped[:10])
            raise self._fail(
                f"no perturbation in column {self.perturbation_key!r} has at least "
                f"min_cells={self.min_cells} cells; counts: {detail or '(no perturbed cells)'}"
            )
        return kept, dropped

    def _check_values(self) -> None:
        maximum = -np.inf
        minimum = np.inf
        all_integer = True
        stored = 0
        layer = f"layer {self.layer!r}" if self.layer else "X"
        normalize, self.normalize = self.normalize, False
        try:
            for _, block in self.iter_chunks():
                values = block.data if sp.issparse(block) else np.asarray(block).ravel()
                if values.size == 0:
                    continue
                n_nonfinite, low, high, integral = _scan(values)
                if n_nonfinite:
                    bad = values[~np.isfinite(values)]
                    raise self._fail(
                        f"{layer} contains {n_nonfinite} non-finite value(s) "
                        f"(e.g. {listing(sorted(set(map(str, bad[:5].tolist()))))}); "
                        "remove or impute them"
                    )
                minimum = min(minimum, low)
                maximum = max(maximum, high)
                all_integer = all_integer and integral
                stored += values.size
        finally:
            self.normalize = normalize
        if stored < self.n_cells * self.n_genes:
            # Sparse storage leaves zeros implicit: they are values too.
            minimum, maximum = min(minimum, 0.0), max(maximum, 0.0)
        if minimum == maximum:
            raise self._fail(
                f"{layer} has no variation (every value is {minimum:g}); nothing can be "
                "compared or calibrated"
            )
        if self.normalize and not all_integer:
            raise self._fail(
                f"{layer} holds non-integer values (up to {maximum:g}), not raw counts; "
                "it looks normalised already: drop normalize=True (CLI: --normalize)"
            )
        if not all_integer and maximum > RAW_COUNT_MAX:
            raise self._fail(
                f"{layer} holds values up to {maximum:g}, beyond log-normalised expression "
                "(log1p of counts per 10,000 stays below about 10); give log-normalised data"
            )
        if minimum < 0:
            raise self._fail(
                f"{layer} contains negative values (minimum {minimum:g}); expected "
                "log-normalised expression (normalize_total + log1p), not scaled or centred data"
            )
        if all_integer and maximum > RAW_COUNT_MAX and not self.normalize:
            raise self._fail(
                f"{layer} looks like raw counts (integer values up to {maximum:g}); pass "
                "normalize=True (CLI: --normalize) to apply normalize_total(1e4) and log1p"
            )


def normalize_log1p(block: Any, target_sum: float = 1e4) -> Any:
    """Scale each row to ``target_sum`` then apply ``log1p`` (rows with no counts stay 0).

    Parameters
    ----------
    block
        Cells x genes, sparse or dense.
    target_sum
        Total each cell is scaled to.

    Returns
    -------
    scipy.sparse.csr_matrix or numpy.ndarray
        Float64 log-normalised values, same sparsity as the input.

    """
    matrix = sp.csr_matrix(block, dtype=np.float64, copy=True)
    totals = _row_totals(matrix)
    scale = np.divide(target_sum, totals, out=np.zeros_like(totals), where=totals > 0)
    if not sp.issparse(block):
        return np.log1p(np.asarray(block, dtype=np.float64) * scale[:, None])
    matrix.data *= np.repeat(scale, np.diff(matrix.indptr))
    np.log1p(matrix.data, out=matrix.data)
    return matrix


def _row_totals(matrix: sp.csr_matrix) -> np.ndarray:
    """Each row's sum over its nonzero values in column order.

    The same bits for a dense row and any sparse storage of it (stored zeros,
    unsorted columns): the sums are those of the canonical CSR of the numbers.
    """
    canonical = matrix.copy()
    canonical.eliminate_zeros()
    canonical.sum_duplicates()  # also sorts each row's columns
    return np.asarray(canonical.sum(axis=1), dtype=np.float64).ravel()


def _scan(values: np.ndarray, threads: Threads | None = None) -> tuple[int, float, float, bool]:
    from scperteval.kernels.moments import scan_values

    if not values.flags.c_contiguous:
        values = np.ascontiguousarray(values)
    threads = threads or Threads()
    bounds = threads.even_bounds(values.size, values.size // 65536)
    parts = threads.run_ranges(lambda start, stop: scan_values(values[start:stop]), bounds)
    if not parts:
        return 0, math.inf, -math.inf, True
    n, low, high, whole = zip(*parts, strict=True)
    return sum(map(int, n)), min(map(float, low)), max(map(float, high)), all(map(bool, whole))
