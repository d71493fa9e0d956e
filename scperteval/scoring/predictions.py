"""Model predictions: reading, alignment to the truth's genes and conditions, scale checks.

A prediction holds predicted cells (any number per perturbation) or one
pseudobulk row per perturbation, in any form of
:mod:`scperteval.scoring.prediction_readers`; population protocols are skipped
for pseudobulk predictions. Genes are aligned to the truth by exact name:
missing genes are an error (with a hint when they match only up to case),
duplicate names are an error, extra genes are dropped with a warning. Deltas
are always taken against the truth's measured control, so predicted control
rows are ignored (said once). A model declared to predict *changes* from the
control (``deltas``) has the measured control mean of its covariate group added
back. Values must be on the truth's scale (log-normalised): count or ``expm1``
scales and negative values are refused before any work starts.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from scperteval.data.dataset import RAW_COUNT_MAX, Dataset
from scperteval.data.labels import listing
from scperteval.engine.sources import SourceData
from scperteval.errors import DatasetError, ScpertevalWarning, SpecError
from scperteval.metrics import DegenerateInput
from scperteval.scoring.prediction_readers import (
    PREDICTION_SUFFIXES,
    PredictionTable,
    read_prediction,
)
from scperteval.stats.groups import GroupStats

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine

__all__ = ["Prediction", "load_predictions", "prediction_inputs"]

#: A prediction whose mean total expression per row is this many times the control
#: cells' (or less than its inverse) is probably on another scale: it is scored with a
#: warning, or refused as undeclared changes from the control when it has negative values.
TOTAL_RATIO_WARNING = 3.0


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
    delta
        Whether the rows are changes from the control mean, which is added back.
    description
        What was read, for the run record.
    notes
        What was ignored or adjusted while aligning (predicted controls, extra
        genes or perturbations), each said once.

    """

    name: str
    matrix: Any
    rows: dict[int, np.ndarray]
    pseudobulk: bool
    missing: list[tuple[str, str]] = field(default_factory=list)
    delta: bool = False
    description: str = ""
    notes: list[str] = field(default_factory=list)
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
        if self.delta:
            dense = rows.toarray() if sp.issparse(rows) else np.asarray(rows, dtype=np.float64)
            rows = dense + engine.control_mean(condition)
        moments = GroupStats.from_chunk(rows, np.zeros(rows.shape[0], dtype=np.int64), 1)
        if self.pseudobulk:
            # One row per perturbation: a centroid, no cells for population protocols.
            source = SourceData(centroid=moments.mean[0])
        else:
            source = SourceData(centroid=moments.mean[0], rows=rows, moments=moments)
        self._sources[condition] = source
        return source

    def record(self) -> dict[str, Any]:
        """What ``run.json`` keeps about the model."""
        return {
            "read": self.description,
            "coverage": self.coverage,
            "missing": [f"{c}/{p}" for c, p in self.missing],
            "pseudobulk": self.pseudobulk,
            "delta": self.delta,
            "notes": list(self.notes),
        }


def prediction_inputs(spec: Any) -> dict[str, Any]:
    """Normalise the ways of naming several models' predictions to ``{name: value}``.

    Parameters
    ----------
    spec
        ``{name: prediction}`` (any form of
        :func:`~scperteval.scoring.prediction_readers.read_prediction`), a list of
        ``"NAME=PATH"`` or paths (the name is then the file's stem), or a folder
        whose prediction files (``.h5ad``, ``.csv``, ``.tsv``, ``.parquet``, ``.npz``)
        are the models.

    Returns
    -------
    dict
        Model name to prediction or path, in the order given.

    Raises
    ------
    DatasetError
        For a name given twice, an empty name or a folder without prediction files.

    """
    if isinstance(spec, Mapping):
        result = dict(spec)
    elif isinstance(spec, (str, os.PathLike)) and Path(spec).is_dir():
        files = sorted(f for f in Path(spec).iterdir() if f.suffix.lower() in PREDICTION_SUFFIXES)
        if not files:
            raise DatasetError(
                f"no prediction files ({', '.join(PREDICTION_SUFFIXES)}) in folder {spec}"
            )
        result = {}
        for file in files:
            if file.stem in result:
                raise DatasetError(f"model name {file.stem!r} given twice (in folder {spec})")
            result[file.stem] = file
    elif isinstance(spec, (str, os.PathLike)) or not isinstance(spec, Collection):
        result = _named_items([spec])
    else:
        result = _named_items(list(spec))
    for name in result:
        if not isinstance(name, str) or not name.strip():
            raise DatasetError(f"model names must be non-empty strings, got {name!r}")
    return result


def _named_items(items: list[Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            # An in-memory object needs a name: only a mapping gives one.
            raise DatasetError(
                f"an in-memory prediction ({type(item).__name__}) needs a name: "
                "pass {'name': prediction}"
            )
        text = str(item)
        if Path(text).is_dir():
            for name, value in prediction_inputs(text).items():
                if name in result:
                    raise DatasetError(f"model name {name!r} given twice")
                result[name] = value
            continue
        name, sep, path = text.partition("=")
        # NAME=PATH names a model; an '=' inside a folder name is part of the path.
        if not sep or os.sep in name or "/" in name or Path(text).exists():
            name, path = Path(text).stem, text
        if name in result:
            raise DatasetError(f"model name {name!r} given twice")
        result[name] = path
    return result


def load_predictions(
    spec: Any,
    dataset: Dataset,
    layout: Any,
    allow_missing: bool = False,
    deltas: Collection[str] = (),
) -> list[Prediction]:
    """Read, align and check every model's predictions.

    Parameters
    ----------
    spec
        The models (see :func:`prediction_inputs`).
    dataset
        The truth.
    layout
        The truth's group layout (its conditions define what must be predicted).
    allow_missing
        Record missing perturbations as NaN instead of raising.
    deltas
        Names of the models that predict changes from the control mean.

    Returns
    -------
    list of Prediction
        In the order given.

    Raises
    ------
    DatasetError
        If a prediction cannot be read, misses genes or perturbations, or is not on
        the truth's scale.
    SpecError
        If ``deltas`` names a model that is not given.

    """
    inputs = prediction_inputs(spec)
    unknown = sorted(set(deltas) - set(inputs))
    if unknown:
        raise SpecError(
            f"--delta names no given model: {listing(unknown)}; models: {listing(list(inputs))}"
        )
    models = []
    controls: dict[str, tuple[np.ndarray, float]] | None = None
    for name, value in inputs.items():
        table = read_prediction(value, name, dataset)
        model = _align(name, table, dataset, layout, allow_missing, delta=name in deltas)
        controls = controls if controls is not None else _control_totals(dataset, layout)
        covariates = (
            np.full(len(table.labels), layout.covariates[0], dtype=object)
            if table.covariates is None
            else np.asarray(table.covariates, dtype=object)
        )
        _check_totals(model, covariates, controls, model.notes)
        for note in model.notes:
            warnings.warn(note, ScpertevalWarning, stacklevel=2)
        models.append(model)
    return models


def _align(
    name: str,
    table: PredictionTable,
    dataset: Dataset,
    layout: Any,
    allow_missing: bool,
    delta: bool = False,
) -> Prediction:
    where = f"prediction {name!r}"
    notes: list[str] = []
    columns = _gene_columns(where, table.genes, dataset, notes)
    matrix = table.matrix
    matrix = (
        sp.csr_matrix(matrix)[:, columns] if sp.issparse(matrix) else np.asarray(matrix)[:, columns]
    )
    _check_scale(where, matrix)
    labels = np.asarray(table.labels, dtype=object)
    covariates = (
        np.full(labels.shape[0], "all", dtype=object)
        if table.covariates is None
        else np.asarray(table.covariates, dtype=object)
    )
    index: dict[tuple[str, str], list[int]] = {}
    for row, pair in enumerate(zip(covariates.tolist(), labels.tolist(), strict=True)):
        index.setdefault(pair, []).append(row)
    rows: dict[int, np.ndarray] = {}
    missing: list[tuple[str, str]] = []
    for k, condition in enumerate(layout.conditions):
        found = index.pop((condition.covariate, condition.perturbation), None)
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
    _note_unused(where, index, dataset.control_label, notes)
    pseudobulk = bool(rows) and all(r.size == 1 for r in rows.values())
    return Prediction(
        name=name,
        matrix=matrix,
        rows=rows,
        pseudobulk=pseudobulk,
        missing=missing,
        delta=delta,
        description=table.description + (", changes from the control mean" if delta else ""),
        notes=notes,
    )


def _gene_columns(where: str, genes: pd.Index, dataset: Dataset, notes: list[str]) -> np.ndarray:
    """Column of each truth gene in the prediction; errors for duplicates and missing genes."""
    if genes.has_duplicates:
        duplicated = genes[genes.duplicated()].unique().tolist()
        raise DatasetError(
            f"{where}: {len(duplicated)} duplicate gene name(s): {listing(duplicated)}; "
            "each gene must appear once"
        )
    missing_genes = dataset.var_names.difference(genes)
    if len(missing_genes):
        hint = ""
        lowered = {g.lower() for g in genes}
        by_case = [g for g in missing_genes if g.lower() in lowered]
        if by_case:
            example = by_case[0]
            match = next(g for g in genes if g.lower() == example.lower())
            hint = (
                f"; {len(by_case)} of them match only up to case (e.g. {match!r} for "
                f"{example!r}): gene names are matched exactly"
            )
        raise DatasetError(
            f"{where}: {len(missing_genes)} gene(s) of the truth missing: "
            f"{listing(missing_genes.tolist())}{hint}"
        )
    extra = genes.difference(dataset.var_names)
    if len(extra):
        notes.append(
            f"{where}: {len(extra)} gene(s) not in the truth are ignored: "
            f"{listing(extra.tolist())}"
        )
    return np.asarray(genes.get_indexer(dataset.var_names))


def _check_scale(where: str, matrix: Any) -> None:
    """Refuse values that cannot be log-normalised expression or changes of it."""
    values = np.asarray(matrix.data if sp.issparse(matrix) else matrix)
    if values.size == 0:
        return
    finite = np.isfinite(values)
    if not finite.all():
        raise DatasetError(
            f"{where}: {int((~finite).sum())} non-finite predicted value(s); "
            "predict a number for every gene"
        )
    low, high = float(values.min()), float(values.max())
    largest = max(abs(low), abs(high))
    if largest > RAW_COUNT_MAX:
        integral = bool(np.all(values == np.round(values)))
        scale = "raw counts" if integral else "an expm1 or count scale"
        raise DatasetError(
            f"{where}: values up to {largest:g} look like {scale}; predictions must be on "
            "the truth's scale (normalize_total to 1e4, then log1p)"
        )


def _note_unused(
    where: str, unused: dict[tuple[str, str], list[int]], control: str, notes: list[str]
) -> None:
    controls = sum(len(r) for (_, p), r in unused.items() if p == control)
    if controls:
        notes.append(
            f"{where}: {controls} predicted control row(s) ignored; deltas use the measured "
            "control cells"
        )
    extra = sorted({p for (_, p) in unused if p != control})
    if extra:
        notes.append(
            f"{where}: {len(extra)} predicted perturbation(s) not in the truth are ignored: "
            f"{listing(extra)}"
        )


def _control_totals(dataset: Dataset, layout: Any) -> dict[str, tuple[np.ndarray, float]]:
    """Per covariate group: the control cells' mean expression and its total over genes."""
    totals = {}
    for index, covariate in enumerate(layout.covariates):
        rows = dataset.rows(layout.control_positions(index))
        mean = np.asarray(rows.mean(axis=0, dtype=np.float64)).ravel()
        totals[covariate] = (mean, float(mean.sum()))
    return totals


def _check_totals(
    model: Prediction,
    covariates: np.ndarray,
    controls: dict[str, tuple[np.ndarray, float]],
    notes: list[str],
) -> None:
    """Compare the prediction's total expression per row with the control cells' total.

    An undeclared delta (negative values, totals near 0 where the controls' are not)
    is refused; negative values otherwise, and totals far from the controls', are
    scored with a note.
    """
    where = f"prediction {model.name!r}"
    used = np.concatenate(list(model.rows.values())) if model.rows else np.zeros(0, np.int64)
    if used.size == 0:
        return
    matrix = model.matrix[used]
    row_totals = np.asarray(matrix.sum(axis=1)).ravel()
    expected = np.array([controls[c][1] for c in covariates[used]])
    if model.delta:
        row_totals = row_totals + expected
    values = matrix.data if sp.issparse(matrix) else np.asarray(matrix)
    n_negative = int((values < 0).sum())
    ratio = float(row_totals.mean() / expected.mean()) if expected.mean() > 0 else 1.0
    declare = f"(CLI: --delta {model.name}; Python: deltas=[{model.name!r}])"
    if n_negative and not model.delta:
        low = float(values.min())
        if ratio < 1 / TOTAL_RATIO_WARNING:
            raise DatasetError(
                f"{where}: {n_negative} negative value(s) (minimum {low:g}) and a total "
                f"expression {ratio:.3g} times the control cells' look like changes from the "
                f"control; if the model predicts changes, declare it {declare}"
            )
        notes.append(
            f"{where}: {n_negative} negative value(s) (minimum {low:g}), impossible for "
            f"log-normalised expression, are scored as given; a model predicting changes "
            f"from the control is declared {declare}"
        )
    if ratio > TOTAL_RATIO_WARNING or ratio < 1 / TOTAL_RATIO_WARNING:
        notes.append(
            f"{where}: mean total expression {row_totals.mean():.4g} is {ratio:.3g} times "
            f"the control cells' {expected.mean():.4g}; check that it is on the truth's "
            "scale (and its genes are the truth's)"
        )
