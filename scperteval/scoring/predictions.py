"""Model predictions: loading, alignment to the truth's genes and conditions.

A prediction is an AnnData whose ``obs`` has the truth's perturbation column
(and covariate column when the truth has one). It holds predicted cells (any
number per perturbation) or one pseudobulk row per perturbation; population
protocols are skipped for pseudobulk predictions. Genes are aligned to the
truth by name: missing genes are an error, extra genes are dropped with a
warning. Deltas are always taken against the truth's real control, so a
predicted control row, if present, is ignored.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from scperteval.data.dataset import Dataset, _listing
from scperteval.engine.sources import SourceData
from scperteval.errors import DatasetError
from scperteval.metrics import DegenerateInput
from scperteval.stats.groups import GroupStats

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine

__all__ = ["Prediction", "load_predictions"]


@dataclass(eq=False)
class Prediction:
    """One model's predictions aligned to a dataset.

    Attributes
    ----------
    name
        Model name.
    matrix
        Predicted rows x the truth's genes (CSR or dense float).
    rows
        Per condition index of the truth's layout, the row numbers predicting it
        (absent conditions are missing).
    pseudobulk
        Whether the prediction holds one row per perturbation.
    missing
        Conditions of the truth the model does not predict, as ``(covariate,
        perturbation)``.

    """

    name: str
    matrix: Any
    rows: dict[int, np.ndarray]
    pseudobulk: bool
    missing: list[tuple[str, str]] = field(default_factory=list)
    _sources: dict[int, SourceData] = field(default_factory=dict, repr=False)

    @property
    def coverage(self) -> float:
        """Fraction of the truth's conditions predicted."""
        total = len(self.rows) + len(self.missing)
        return len(self.rows) / total if total else float("nan")

    def source(self, engine: Engine, condition: int) -> SourceData:
        """The prediction for one condition as a :class:`SourceData`."""
        if condition not in self.rows:
            raise DegenerateInput(f"model {self.name!r} does not predict this perturbation")
        cached = self._sources.get(condition)
        if cached is not None:
            return cached
        rows = self.matrix[self.rows[condition]]
        moments = GroupStats.from_chunk(rows, np.zeros(rows.shape[0], dtype=np.int64), 1)
        if self.pseudobulk:
            # One row per perturbation: a centroid, no cells for population protocols.
            source = SourceData(centroid=moments.mean[0])
        else:
            source = SourceData(centroid=moments.mean[0], rows=rows, moments=moments)
        self._sources[condition] = source
        return source


def _read(value: Any, name: str) -> Any:
    import anndata

    if isinstance(value, anndata.AnnData):
        return value
    path = Path(value)
    if not path.exists():
        raise DatasetError(f"prediction {name!r}: file {path} not found")
    try:
        return anndata.read_h5ad(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure means unreadable input
        raise DatasetError(f"prediction {name!r}: cannot read {path} ({exc})") from None


def prediction_inputs(spec: Any) -> dict[str, Any]:
    """Normalise ``{name: AnnData|path}``, ``["name=path", ...]`` or a folder of ``.h5ad``."""
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, (str, os.PathLike)) and Path(spec).is_dir():
        files = sorted(Path(spec).glob("*.h5ad"))
        if not files:
            raise DatasetError(f"no .h5ad files in prediction folder {spec}")
        return {f.stem: f for f in files}
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    result: dict[str, Any] = {}
    for item in items:
        text = str(item)
        if Path(text).is_dir():
            result.update(prediction_inputs(text))
            continue
        name, sep, path = text.partition("=")
        if not sep:
            name, path = Path(text).stem, text
        if name in result:
            raise DatasetError(f"model name {name!r} given twice")
        result[name] = path
    return result


def load_predictions(
    spec: Any, dataset: Dataset, layout: Any, allow_missing: bool = False
) -> list[Prediction]:
    """Load and align every model's predictions.

    Parameters
    ----------
    spec
        A dict ``{name: AnnData or path}``, a list of ``"NAME=PATH"`` (or paths),
        or a folder of ``.h5ad`` files (model name = file stem).
    dataset
        The truth.
    layout
        The truth's group layout (its conditions define what must be predicted).
    allow_missing
        Record missing perturbations as NaN instead of raising.

    Returns
    -------
    list of Prediction
        In the order given.

    """
    return [
        _align(name, _read(value, name), dataset, layout, allow_missing)
        for name, value in prediction_inputs(spec).items()
    ]


def _align(name: str, adata: Any, dataset: Dataset, layout: Any, allow_missing: bool) -> Prediction:
    where = f"prediction {name!r}"
    key = dataset.perturbation_key
    if key not in adata.obs.columns:
        raise DatasetError(
            f"{where}: perturbation column {key!r} not found in obs; available: "
            f"{_listing(list(map(str, adata.obs.columns)))}"
        )
    genes = adata.var_names.astype(str)
    missing_genes = dataset.var_names.difference(genes)
    if len(missing_genes):
        raise DatasetError(
            f"{where}: {len(missing_genes)} gene(s) of the truth missing: "
            f"{_listing(missing_genes.tolist())}"
        )
    extra = genes.difference(dataset.var_names)
    if len(extra):
        warnings.warn(
            f"{where}: {len(extra)} gene(s) not in the truth are ignored: "
            f"{_listing(extra.tolist())}",
            stacklevel=3,
        )
    if genes.has_duplicates:
        raise DatasetError(f"{where}: duplicate gene names")
    columns = genes.get_indexer(dataset.var_names)
    matrix = adata.X
    if matrix is None:
        raise DatasetError(f"{where}: no expression matrix X")
    matrix = (
        sp.csr_matrix(matrix)[:, columns] if sp.issparse(matrix) else np.asarray(matrix)[:, columns]
    )
    values = np.asarray(matrix.data if sp.issparse(matrix) else matrix)
    if values.size and not np.isfinite(values).all():
        raise DatasetError(f"{where}: non-finite predicted values")
    labels = adata.obs[key].astype(str).to_numpy()
    if dataset.covariate_key is not None:
        if dataset.covariate_key not in adata.obs.columns:
            raise DatasetError(
                f"{where}: covariate column {dataset.covariate_key!r} not found in obs"
            )
        covariates = adata.obs[dataset.covariate_key].astype(str).to_numpy()
    else:
        covariates = np.full(labels.shape[0], "all", dtype=object)
    index: dict[tuple[str, str], list[int]] = {}
    for row, pair in enumerate(zip(covariates.tolist(), labels.tolist(), strict=True)):
        index.setdefault(pair, []).append(row)
    rows: dict[int, np.ndarray] = {}
    missing: list[tuple[str, str]] = []
    for k, condition in enumerate(layout.conditions):
        found = index.get((condition.covariate, condition.perturbation))
        if found:
            rows[k] = np.asarray(found, dtype=np.int64)
        else:
            missing.append((condition.covariate, condition.perturbation))
    if missing and not allow_missing:
        shown = ", ".join(p if c == "all" else f"{p} ({c})" for c, p in missing[:10])
        raise DatasetError(
            f"{where}: {len(missing)} perturbation(s) not predicted: {shown}"
            + (" ..." if len(missing) > 10 else "")
            + "; pass allow_missing=True (CLI: --allow-missing) to score the rest"
        )
    pseudobulk = bool(rows) and all(r.size == 1 for r in rows.values())
    return Prediction(name=name, matrix=matrix, rows=rows, pseudobulk=pseudobulk, missing=missing)
