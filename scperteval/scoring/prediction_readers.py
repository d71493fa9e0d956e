"""Reading a model's predictions from the forms users hold them in.

Every form is read into a :class:`PredictionTable`: a rows x genes matrix with
the gene names, each row's perturbation label and, when the truth has one, its
covariate. Accepted forms, in Python and as files on the command line:

- an AnnData of predicted cells or pseudobulk rows (in memory or ``.h5ad``, read
  by :func:`~scperteval.data.h5ad.open_h5ad`),
  labelled by the truth's perturbation column in ``obs`` (or, failing that, by
  ``obs_names`` when they are the truth's perturbation labels);
- a table with one row per perturbation and one column per gene: a
  :class:`pandas.DataFrame`, ``.csv``, ``.tsv`` or ``.parquet``; the perturbation
  is the column named like the truth's perturbation column, or else the index;
  the covariate, when the truth has one, a column of the same name;
- a NumPy array with its labels: :class:`PredictionArray` in Python, an ``.npz``
  file with arrays ``X``, ``perturbations``, ``genes`` (and ``covariates``) on the
  command line.

Each reader says in :attr:`PredictionTable.description` which form and which
label source it used.

The layout of a table is checked too: a table read with the wrong separator, a
header naming a gene twice, two different rows for one perturbation or rows
without a label would each be scored as something nobody predicted; these checks
refuse them in one line naming the mistake.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from scperteval.data.dataset import Dataset
from scperteval.data.h5ad import is_annotated_data, open_h5ad
from scperteval.data.labels import listing
from scperteval.errors import DatasetError

__all__ = ["PREDICTION_SUFFIXES", "PredictionArray", "PredictionTable", "read_prediction"]

#: File suffixes read as predictions, and the form each holds.
PREDICTION_SUFFIXES = MappingProxyType(
    {
        ".h5ad": "AnnData",
        ".csv": "CSV table",
        ".tsv": "TSV table",
        ".parquet": "Parquet table",
        ".npz": "NumPy arrays",
    }
)

ACCEPTED = (
    "an AnnData or .h5ad file, a pandas DataFrame or .csv/.tsv/.parquet table "
    "(one row per perturbation, one column per gene), or a scperteval.PredictionArray "
    "(.npz file with X, perturbations and genes)"
)

#: Separators a table may be written with, by the name a message gives them.
SEPARATOR_NAMES = MappingProxyType(
    {",": "commas", "\t": "tabs", ";": "semicolons", "|": "vertical bars"}
)


@dataclass(frozen=True)
class PredictionArray:
    """Predicted expression as an array together with its labels.

    Parameters
    ----------
    values
        Rows x genes (a NumPy array or a SciPy sparse matrix): predicted cells or
        one pseudobulk row per perturbation.
    perturbations
        The perturbation label of each row (a sequence or 1-D array).
    genes
        The name of each column (a sequence or 1-D array).
    covariates
        The covariate (cell line, cell type) of each row, when the truth has one.

    Examples
    --------
    >>> import numpy as np
    >>> import scperteval
    >>> arr = scperteval.PredictionArray(np.zeros((2, 3)), ["A", "B"], ["g1", "g2", "g3"])
    >>> arr.values.shape
    (2, 3)

    """

    values: Any
    perturbations: Any
    genes: Any
    covariates: Any = None


@dataclass(frozen=True)
class PredictionTable:
    """A prediction in one normalised form, before alignment to the truth.

    Attributes
    ----------
    matrix
        Rows x genes, as read (dense or CSR).
    genes
        Column names.
    labels
        Perturbation label of each row (strings).
    covariates
        Covariate of each row (strings), or ``None`` when the truth has none.
    description
        What was read and where the labels came from, for the run record.

    """

    matrix: Any
    genes: pd.Index
    labels: np.ndarray
    covariates: np.ndarray | None
    description: str


def read_prediction(value: Any, name: str, dataset: Dataset) -> PredictionTable:
    """Read one model's prediction in any accepted form.

    Parameters
    ----------
    value
        The prediction (see the module documentation for the accepted forms) or
        the path of a file holding one.
    name
        The model's name, for messages.
    dataset
        The truth: its perturbation and covariate columns and labels.

    Returns
    -------
    PredictionTable
        The prediction's matrix and labels.

    Raises
    ------
    DatasetError
        For an unreadable file, an unsupported type or missing labels.

    """
    where = f"prediction {name!r}"
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if not path.exists():
            raise DatasetError(f"{where}: file {path} not found")
        if path.is_dir():
            raise DatasetError(
                f"{where}: {path} is a folder, not a prediction file; give a file "
                f"({', '.join(PREDICTION_SUFFIXES)}), or the folder alone (--pred {path}) "
                "to score each file in it as a model"
            )
        return _read_file(path, where, dataset)
    if is_annotated_data(value):
        return _from_anndata(value, "AnnData", where, dataset)
    if isinstance(value, pd.DataFrame):
        return _from_frame(value, "DataFrame", where, dataset)
    if isinstance(value, PredictionArray):
        return _from_array(value, "PredictionArray", where, dataset)
    if isinstance(value, np.ndarray) or sp.issparse(value):
        raise DatasetError(
            f"{where}: a bare array has no perturbation labels or gene names; wrap it as "
            "scperteval.PredictionArray(values, perturbations=..., genes=...)"
        )
    raise DatasetError(f"{where}: cannot score a {type(value).__name__}; give {ACCEPTED}")


def _read_file(path: Path, where: str, dataset: Dataset) -> PredictionTable:
    suffix = path.suffix.lower()
    form = PREDICTION_SUFFIXES.get(suffix)
    if form is None:
        raise DatasetError(
            f"{where}: cannot read {path.name}: accepted files are {', '.join(PREDICTION_SUFFIXES)}"
        )
    # A file name that is not UTF-8 holds surrogates no report can print: escape them.
    shown = os.fsencode(path).decode("utf-8", "backslashreplace")
    described = f"{form} {shown}"
    try:
        if suffix == ".h5ad":
            return _from_anndata(open_h5ad(path), described, where, dataset)
        if suffix in (".csv", ".tsv"):
            separator = "," if suffix == ".csv" else "\t"
            frame = pd.read_csv(path, sep=separator, float_precision="round_trip")
            refuse_other_separator(where, path, frame, separator)
            refuse_repeated_columns(where, path, separator)
        elif suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            with np.load(path, allow_pickle=False) as arrays:
                return _from_npz(dict(arrays), described, where, dataset)
    except DatasetError:
        raise
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{where}: cannot read {path} as {form}: it is not UTF-8 text ({exc.reason} at "
            f"byte {exc.start}); save it as UTF-8"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any reader failure means unreadable input
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(f"{where}: cannot read {path} as {form} ({reason})") from None
    return _from_frame(frame, described, where, dataset, from_file=True)


def _from_anndata(adata: Any, described: str, where: str, dataset: Dataset) -> PredictionTable:
    key = dataset.perturbation_key
    obs = adata.obs
    if key in obs.columns:
        refuse_unlabelled_rows(where, obs[key], key)
        labels = obs[key].astype(str).to_numpy()
        source = f"obs[{key!r}]"
    elif _overlap(adata.obs_names, dataset):
        labels = np.asarray(adata.obs_names.astype(str))
        source = "obs_names"
    else:
        raise DatasetError(
            f"{where}: perturbation column {key!r} not found in obs" + _column_hint(obs, dataset)
        )
    if adata.X is None:
        raise DatasetError(f"{where}: no expression matrix X")
    covariates = _covariates_from(obs, where, dataset)
    return PredictionTable(
        matrix=adata.X,
        genes=pd.Index(adata.var_names.astype(str)),
        labels=labels,
        covariates=covariates,
        description=f"{described}: {adata.n_obs} rows, perturbations from {source}",
    )


def _from_frame(
    frame: pd.DataFrame, described: str, where: str, dataset: Dataset, from_file: bool = False
) -> PredictionTable:
    key = dataset.perturbation_key
    covariate_key = dataset.covariate_key
    if frame.empty and len(frame.columns):
        raise DatasetError(f"{where}: the table has columns but no row; one row per perturbation")
    frame = frame.reset_index() if _index_is_named_label(frame, key, covariate_key) else frame
    if key in frame.columns:
        refuse_unlabelled_rows(where, frame[key], key)
        labels = frame[key].astype(str).to_numpy()
        source = f"column {key!r}"
        label_columns = [key]
    elif _overlap(frame.index, dataset):
        labels = np.asarray(frame.index.astype(str))
        source = "the index"
        label_columns = []
    elif from_file and len(frame.columns) and _overlap(frame.iloc[:, 0], dataset):
        # A table written with its index has the labels in an unnamed first column.
        labels = frame.iloc[:, 0].astype(str).to_numpy()
        source = f"the first column {str(frame.columns[0])!r}"
        label_columns = [frame.columns[0]]
    else:
        raise DatasetError(
            f"{where}: no perturbation labels: neither a column {key!r} nor an index of "
            "the truth's perturbation names" + _column_hint(frame, dataset)
        )
    covariates = _covariates_from(frame, where, dataset, "")
    if covariate_key is not None:
        label_columns.append(covariate_key)
    values = frame.drop(columns=label_columns)
    non_numeric = [c for c, t in values.dtypes.items() if not pd.api.types.is_numeric_dtype(t)]
    if non_numeric:
        raise DatasetError(
            f"{where}: column(s) {listing([str(c) for c in non_numeric])} are not numeric; "
            f"a table holds the labels ({key!r}"
            + (f", {covariate_key!r}" if covariate_key else "")
            + ") and one numeric column per gene"
        )
    matrix = values.to_numpy(dtype=np.float64)
    refuse_differing_rows(where, matrix, labels, covariates)
    return PredictionTable(
        matrix=matrix,
        genes=pd.Index([str(c) for c in values.columns]),
        labels=labels,
        covariates=covariates,
        description=f"{described}: {len(frame)} rows, perturbations from {source}",
    )


def _from_array(
    array: PredictionArray, described: str, where: str, dataset: Dataset
) -> PredictionTable:
    values = array.values if sp.issparse(array.values) else np.asarray(array.values)
    if values.ndim != 2:
        raise DatasetError(f"{where}: values must be 2-D (rows x genes), got {values.ndim}-D")
    labels = np.asarray([str(p) for p in array.perturbations], dtype=object)
    genes = pd.Index([str(g) for g in array.genes])
    if labels.shape[0] != values.shape[0]:
        raise DatasetError(
            f"{where}: {labels.shape[0]} perturbation labels for {values.shape[0]} rows"
        )
    if len(genes) != values.shape[1]:
        raise DatasetError(f"{where}: {len(genes)} gene names for {values.shape[1]} columns")
    covariates = None
    if dataset.covariate_key is not None:
        if array.covariates is None:
            raise DatasetError(
                f"{where}: the truth has covariate column {dataset.covariate_key!r}; "
                "give each row's covariate (covariates=...)"
            )
        covariates = np.asarray([str(c) for c in array.covariates], dtype=object)
        if covariates.shape[0] != values.shape[0]:
            raise DatasetError(f"{where}: {covariates.shape[0]} covariates for {len(labels)} rows")
    return PredictionTable(
        matrix=values,
        genes=genes,
        labels=labels,
        covariates=covariates,
        description=f"{described}: {values.shape[0]} rows, perturbations given with the array",
    )


def _from_npz(
    arrays: dict[str, np.ndarray], described: str, where: str, dataset: Dataset
) -> PredictionTable:
    missing = [k for k in ("X", "perturbations", "genes") if k not in arrays]
    if missing:
        raise DatasetError(
            f"{where}: the .npz file lacks array(s) {', '.join(missing)}; it holds "
            f"{listing(sorted(arrays)) or 'nothing'} (expected X, perturbations, genes"
            " and, with a covariate, covariates)"
        )
    array = PredictionArray(
        arrays["X"], arrays["perturbations"], arrays["genes"], arrays.get("covariates")
    )
    return _from_array(array, described, where, dataset)


def _index_is_named_label(frame: pd.DataFrame, key: str, covariate_key: str | None) -> bool:
    names = [n for n in frame.index.names if n is not None]
    return bool(names) and all(n in (key, covariate_key) for n in names)


def _overlap(values: Any, dataset: Dataset) -> bool:
    """Whether most distinct values are the truth's perturbation (or control) labels."""
    known = set(dataset.perturbations()) | {dataset.control_label}
    distinct = set(map(str, pd.unique(np.asarray(values, dtype=object))))
    return bool(distinct) and len(distinct & known) >= max(1, len(distinct) // 2)


def _column_hint(frame: pd.DataFrame, dataset: Dataset) -> str:
    """``; column 'x' holds N of the truth's labels`` for the best-matching columns."""
    known = set(dataset.perturbations())
    matches = []
    for column in frame.columns:
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values):
            continue
        shared = len(set(map(str, pd.unique(values.astype(str)))) & known)
        if shared:
            matches.append((shared, str(column)))
    if not matches:
        return "; no column holds the truth's perturbation labels"
    shared, column = max(matches)
    return (
        f"; column {column!r} holds {shared} of the truth's {len(known)} perturbation labels "
        f"(name the truth's column {dataset.perturbation_key!r} the same in the prediction)"
    )


def _covariates_from(
    obs: pd.DataFrame, where: str, dataset: Dataset, place: str = " in obs"
) -> np.ndarray | None:
    if dataset.covariate_key is None:
        return None
    if dataset.covariate_key not in obs.columns:
        raise DatasetError(f"{where}: covariate column {dataset.covariate_key!r} not found{place}")
    return np.asarray(obs[dataset.covariate_key].astype(str).to_numpy())


def refuse_other_separator(where: str, path: Path, frame: pd.DataFrame, separator: str) -> None:
    """Refuse a table read as one column whose header holds another separator.

    Parameters
    ----------
    where
        The prediction, for messages (``prediction 'm'``).
    path
        The file.
    frame
        The table as read.
    separator
        The separator it was read with (``,`` for ``.csv``, a tab for ``.tsv``).

    Raises
    ------
    DatasetError
        Naming the separator the file uses.

    """
    if len(frame.columns) != 1:
        return
    header = str(frame.columns[0])
    found = [s for s in SEPARATOR_NAMES if s != separator and s in header]
    if found:
        expected = ".csv (commas)" if separator == "," else ".tsv (tabs)"
        raise DatasetError(
            f"{where}: {path.name} is separated by {SEPARATOR_NAMES[found[0]]}, not "
            f"{SEPARATOR_NAMES[separator]}; write it as {expected}"
            + (" or name it .tsv" if found[0] == "\t" else "")
        )


def refuse_unlabelled_rows(where: str, labels: pd.Series, key: str) -> None:
    """Refuse rows without a label, which would become a perturbation ``'nan'``.

    Parameters
    ----------
    where
        The prediction, for messages (``prediction 'm'``).
    labels
        The label column.
    key
        Its name.

    Raises
    ------
    DatasetError
        Counting the rows without a label.

    """
    unlabelled = int(labels.isna().sum())
    if unlabelled:
        raise DatasetError(
            f"{where}: {unlabelled} row(s) have no label (NaN or empty) in column {key!r}; "
            "label every row, or leave the row out"
        )


def refuse_repeated_columns(where: str, path: Path, separator: str) -> None:
    """Refuse a header naming a column twice (pandas would rename the second ``G.1``).

    Parameters
    ----------
    where, path
        The prediction, for messages (``prediction 'm'``), and the file.
    separator
        Its separator.

    Raises
    ------
    DatasetError
        Naming the repeated columns.

    """
    header = pd.read_csv(path, sep=separator, header=None, nrows=1, dtype=str).iloc[0]
    names = pd.Index(header.fillna("").astype(str))
    if names.has_duplicates:
        repeated = names[names.duplicated()].unique().tolist()
        raise DatasetError(
            f"{where}: {path.name} names {len(repeated)} column(s) twice: {listing(repeated)}; "
            "each gene must appear once"
        )


def refuse_differing_rows(
    where: str, matrix: np.ndarray, labels: np.ndarray, covariates: np.ndarray | None
) -> None:
    """Refuse two different rows for one label: a table has one row per perturbation.

    Averaging them silently would score a profile that nobody predicted; rows that
    repeat the same values are harmless and kept.

    Parameters
    ----------
    where
        The prediction, for messages (``prediction 'm'``).
    matrix
        The table's values, one row per label.
    labels, covariates
        Each row's perturbation label and covariate (``None`` without covariates).

    Raises
    ------
    DatasetError
        Naming the labels with differing rows.

    """
    keys = pd.MultiIndex.from_arrays(
        [labels, covariates if covariates is not None else np.zeros(len(labels))]
    )
    repeated = keys.duplicated(keep=False)
    if not repeated.any():
        return
    frame = pd.DataFrame(matrix[repeated]).assign(_key=keys[repeated])
    differing = [
        key for key, rows in frame.groupby("_key", sort=True) if len(rows.drop_duplicates()) > 1
    ]
    if differing:
        shown = listing([str(label) for label, _ in differing], limit=5)
        raise DatasetError(
            f"{where}: {len(differing)} perturbation(s) have two or more different rows: "
            f"{shown}; a table holds one row per perturbation (average the rows, or give "
            "cells as an .h5ad)"
        )
