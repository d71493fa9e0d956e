"""Model predictions: reading, alignment to the truth's genes and conditions, scale checks.

A prediction holds predicted cells (any number per perturbation) or one
pseudobulk row per perturbation, in any form of
:mod:`scperteval.scoring.prediction_readers`; population protocols are skipped
for pseudobulk predictions. Genes are aligned to the truth by exact name:
missing genes are an error (with a hint when they match only up to case),
duplicate names are an error, extra genes are dropped with a warning. Deltas
are taken against the truth's measured control, so predicted control rows are
ignored (said once); with ``control="predicted"`` (cell-eval's convention) they
are kept, per covariate group, and each model's deltas, DE and energy distances
against the control are taken against its own predicted control cells, which
every covariate group it predicts must then have. A model declared to predict
*changes* from the control (``deltas``) has the measured control mean of its
covariate group added back (to its predicted control rows too). Values must be
on the truth's scale (log-normalised): count or ``expm1`` scales and negative
values are refused before any work starts.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from scperteval.data.dataset import ALL_COVARIATES, Dataset
from scperteval.data.labels import listing, unmatched_listing
from scperteval.engine.sources import SourceData
from scperteval.errors import DatasetError, ScpertevalWarning, SpecError
from scperteval.metrics import DegenerateInput
from scperteval.scoring.prediction_checks import check_scale, check_totals, control_totals
from scperteval.scoring.prediction_readers import (
    PREDICTION_SUFFIXES,
    PredictionTable,
    read_prediction,
)
from scperteval.stats.groups import GroupStats

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine

__all__ = ["CONTROL_MODES", "Prediction", "load_predictions", "prediction_inputs"]

#: Where a model's deltas against the control are taken: the measured control cells
#: (the default), or the model's own predicted control cells (as cell-eval does).
CONTROL_MODES = ("measured", "predicted")


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
    controls
        Per covariate group, the row numbers of the predicted control cells, when
        the model is scored against its own control (``control="predicted"``);
        empty otherwise.

    """

    name: str
    matrix: Any
    rows: dict[int, np.ndarray]
    pseudobulk: bool
    missing: list[tuple[str, str]] = field(default_factory=list)
    delta: bool = False
    description: str = ""
    notes: list[str] = field(default_factory=list)
    controls: dict[str, np.ndarray] = field(default_factory=dict)
    _sources: dict[int, SourceData] = field(default_factory=dict, repr=False)
    _controls: dict[str, SourceData] = field(default_factory=dict, repr=False)

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
        rows = self._rows(engine, condition, self.rows[condition])
        codes = np.zeros(rows.shape[0], dtype=np.int64)
        moments = GroupStats.from_chunk(rows, codes, 1, engine.threads.serial())
        # One row per perturbation: a centroid, no cells for population protocols.
        cells = {} if self.pseudobulk else {"rows": rows, "moments": moments}
        control = self._own_control(engine, condition)
        source = SourceData(centroid=moments.mean[0], control=control, **cells)
        self._sources[condition] = source
        return source

    def _rows(self, engine: Engine, condition: int, numbers: np.ndarray) -> Any:
        rows = self.matrix[numbers]
        if self.delta:
            dense = rows.toarray() if sp.issparse(rows) else np.asarray(rows, dtype=np.float64)
            rows = dense + engine.control_mean(condition)
        return rows

    def _own_control(self, engine: Engine, condition: int) -> SourceData | None:
        """The predicted control cells of the condition's covariate group, if kept."""
        if not self.controls:
            return None
        covariate = engine.context.layout.conditions[condition].covariate
        cached = self._controls.get(covariate)
        if cached is None:
            if covariate not in self.controls:
                raise DegenerateInput(
                    f"model {self.name!r} has no predicted control cells in {covariate!r}"
                )
            rows = self._rows(engine, condition, self.controls[covariate])
            mean = np.asarray(rows.mean(axis=0, dtype=np.float64)).ravel()
            cached = SourceData(centroid=mean, rows=rows)
            self._controls[covariate] = cached
        return cached

    def record(self) -> dict[str, Any]:
        """What ``run.json`` keeps about the model."""
        groups = [
            f"{len(r)} cells" + ("" if c == "all" else f" in {c}") for c, r in self.controls.items()
        ]
        return {
            "read": self.description,
            "coverage": self.coverage,
            "missing": [f"{c}/{p}" for c, p in self.missing],
            "pseudobulk": self.pseudobulk,
            "delta": self.delta,
            "control": ("predicted: " + ", ".join(groups)) if groups else "measured",
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
        result = _by_stem(spec, lambda stem: f"model name {stem!r} given twice (in folder {spec})")
        if not result:
            raise DatasetError(
                f"no prediction files ({', '.join(PREDICTION_SUFFIXES)}) in folder {spec}"
            )
    elif isinstance(spec, (str, os.PathLike)) or not isinstance(spec, Collection):
        result = _named_items([spec])
    else:
        result = _named_items(list(spec))
    for name in result:
        if not isinstance(name, str) or not name.strip():
            raise DatasetError(f"model names must be non-empty strings, got {name!r}")
    return {_encodable(name): value for name, value in result.items()}


def _by_stem(folder: Any, twice: Callable[[str], str]) -> dict[str, Path]:
    """A folder's prediction files by stem, in name order; ``twice(stem)``: a repeated stem."""
    listed = sorted(f for f in Path(folder).iterdir() if f.suffix.lower() in PREDICTION_SUFFIXES)
    files: dict[str, Path] = {}
    for file in listed:
        if file.stem in files:
            raise DatasetError(twice(file.stem))
        files[file.stem] = file
    return files


def _encodable(name: str) -> str:
    """A model name that every output file can hold.

    A file name that is not UTF-8 (``café.csv`` written in Latin-1) reaches Python
    with surrogate characters, which no table or report can encode: its bytes are
    written as backslash escapes instead.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return name


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
            named = prediction_inputs(text)
        else:
            name, sep, path = text.partition("=")
            _check_named_path(text, name, sep, path)
            # NAME=PATH names a model; an '=' inside a folder name is part of the path.
            if not sep or os.sep in name or "/" in name or Path(text).exists():
                name, path = Path(text).stem, text
            named = {name: path}
        for name, value in named.items():
            if name in result:
                raise DatasetError(f"model name {name!r} given twice")
            result[name] = value
    return result


def _check_named_path(text: str, name: str, sep: str, path: str) -> None:
    """Name the mistake in a ``NAME=PATH`` that cannot be a file as it stands."""
    if not sep or Path(text).exists():
        return
    if not path.strip():
        raise DatasetError(
            f"--pred {text!r}: no file after '='; give NAME=PATH (e.g. {name or 'model'}=pred.h5ad)"
        )
    if ("/" in name or os.sep in name) and Path(path).exists():
        raise DatasetError(
            f"--pred {text!r}: model name {name!r} holds a '/'; model names cannot hold a "
            f"path separator (e.g. {name.replace('/', '_').replace(os.sep, '_')}={path})"
        )


def load_predictions(
    spec: Any,
    dataset: Dataset,
    layout: Any,
    allow_missing: bool = False,
    deltas: Collection[str] = (),
    control: str = "measured",
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
    control
        ``measured`` (default): predicted control rows are ignored; ``predicted``:
        they are kept per covariate group (:attr:`Prediction.controls`), and each
        model is compared with its own control.

    Returns
    -------
    list of Prediction
        In the order given.

    Raises
    ------
    DatasetError
        If a prediction cannot be read, misses genes or perturbations, is not on
        the truth's scale, or (``control="predicted"``) has no predicted control
        cells in a covariate group it predicts.
    SpecError
        If ``deltas`` names a model that is not given, or ``control`` is unknown.

    """
    if control not in CONTROL_MODES:
        raise SpecError(f"control must be 'measured' or 'predicted', got {control!r}")
    inputs = prediction_inputs(spec)
    # One model named as a string is a list of one, not of its letters.
    deltas = (deltas,) if isinstance(deltas, str) else tuple(deltas)
    unknown = sorted(set(deltas) - set(inputs))
    if unknown:
        raise SpecError(
            f"--delta names no given model: {listing(unknown)}; models: {listing(list(inputs))}"
        )
    models = []
    controls: dict[str, tuple[np.ndarray, float]] | None = None
    for name, value in inputs.items():
        table = read_prediction(value, name, dataset)
        model = _align(
            name, table, dataset, layout, allow_missing, delta=name in deltas, control=control
        )
        controls = controls if controls is not None else control_totals(dataset, layout)
        check_totals(model, _row_covariates(table), controls, model.notes)
        for note in model.notes:
            warnings.warn(note, ScpertevalWarning, stacklevel=2)
        models.append(model)
    return models


def _truth_columns(matrix: Any, columns: np.ndarray) -> Any:
    """The prediction's columns in the truth's gene order.

    A CSR or C-ordered dense matrix already in that order is used as it is: the
    selection would copy it unchanged (a CSR's rows keep their entries' order),
    doubling the memory of a prediction as large as the dataset.
    """
    if getattr(matrix, "dtype", None) == np.float16:
        # Half precision has no compiled kernels; float32 holds every such value exactly.
        matrix = matrix.astype(np.float32)
    in_order = columns.size == matrix.shape[1] and np.array_equal(columns, np.arange(columns.size))
    if sp.issparse(matrix):
        rows = sp.csr_matrix(matrix)
        return rows if in_order else rows[:, columns]
    dense = np.asarray(matrix)
    if in_order and dense.flags.c_contiguous:
        return dense
    return dense[:, columns]


def _row_covariates(table: PredictionTable) -> np.ndarray:
    """Each row's covariate; a prediction without them (the truth has none) is all ``"all"``."""
    if table.covariates is None:
        return np.full(len(table.labels), ALL_COVARIATES, dtype=object)
    return np.asarray(table.covariates, dtype=object)


def _align(
    name: str,
    table: PredictionTable,
    dataset: Dataset,
    layout: Any,
    allow_missing: bool,
    delta: bool = False,
    control: str = "measured",
) -> Prediction:
    where = f"prediction {name!r}"
    notes: list[str] = []
    columns = _gene_columns(where, table.genes, dataset, notes)
    matrix = _truth_columns(table.matrix, columns)
    check_scale(where, matrix)
    labels = np.asarray(table.labels, dtype=object)
    covariates = _row_covariates(table)
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
        raise DatasetError(
            f"{where}: {len(missing)} perturbation(s) not predicted: "
            + _missing_listing(missing, labels)
            + "; pass allow_missing=True (CLI: --allow-missing) to score the rest"
        )
    controls = (
        _own_controls(where, index, dataset.control_label, layout, rows)
        if control == "predicted"
        else {}
    )
    _note_unused(where, index, dataset.control_label, notes, dataset.perturbations())
    return Prediction(
        name=name,
        matrix=matrix,
        rows=rows,
        pseudobulk=bool(rows) and all(r.size == 1 for r in rows.values()),
        missing=missing,
        delta=delta,
        description=table.description + (", changes from the control mean" if delta else ""),
        notes=notes,
        controls=controls,
    )


def _own_controls(
    where: str,
    index: dict[tuple[str, str], list[int]],
    control: str,
    layout: Any,
    rows: dict[int, np.ndarray],
) -> dict[str, np.ndarray]:
    """Take the predicted control rows out of ``index``, per covariate group; all needed.

    Every covariate group the model predicts a perturbation of needs control rows.
    """
    needed = sorted({layout.conditions[k].covariate for k in rows})
    found = {c: index.pop((c, control)) for c in needed if (c, control) in index}
    lacking = [c for c in needed if c not in found]
    if lacking:
        groups = "" if lacking == ["all"] else f" in covariate group(s) {listing(lacking)}"
        raise DatasetError(
            f"{where}: no predicted control cells (label {control!r}){groups}; deltas "
            "against the predicted control (CLI: --control-from-predictions; Python: "
            "control='predicted') need them"
        )
    return {c: np.asarray(r, dtype=np.int64) for c, r in found.items()}


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
        shown = (
            listing(missing_genes.tolist())
            if hint or len(missing_genes) > len(genes)
            else unmatched_listing(missing_genes.tolist(), list(genes))
        )
        raise DatasetError(
            f"{where}: {len(missing_genes)} gene(s) of the truth missing: {shown}{hint}"
        )
    extra = genes.difference(dataset.var_names)
    if len(extra):
        notes.append(
            f"{where}: {len(extra)} gene(s) not in the truth are ignored: {listing(extra.tolist())}"
        )
    return np.asarray(genes.get_indexer(dataset.var_names))


def _missing_listing(missing: list[tuple[str, str]], predicted: np.ndarray) -> str:
    """The truth's labels a model lacks, quoted, each with the model's nearest label."""
    if all(c == "all" for c, _ in missing):
        return unmatched_listing([p for _, p in missing], pd.unique(predicted), limit=10)
    shown = ", ".join(f"{p!r} ({c})" for c, p in missing[:10])
    return shown + (" ..." if len(missing) > 10 else "")


def _note_unused(
    where: str,
    unused: dict[tuple[str, str], list[int]],
    control: str,
    notes: list[str],
    truth_labels: Any = (),
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
            f"{unmatched_listing(extra, list(truth_labels))}"
        )
