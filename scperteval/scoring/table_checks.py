"""Checks of a prediction table's layout: separators, repeated columns, rows and labels.

A table read with the wrong separator, a header naming a gene twice, two different
rows for one perturbation or rows without a label would each be scored as
something nobody predicted; these checks refuse them in one line naming the
mistake.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import numpy as np
import pandas as pd

from scperteval.data.labels import listing
from scperteval.errors import DatasetError

__all__ = [
    "SEPARATOR_NAMES",
    "refuse_differing_rows",
    "refuse_other_separator",
    "refuse_repeated_columns",
    "refuse_unlabelled_rows",
]

#: Separators a table may be written with, by the name a message gives them.
SEPARATOR_NAMES = MappingProxyType(
    {",": "commas", "\t": "tabs", ";": "semicolons", "|": "vertical bars"}
)


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
    where
        The prediction, for messages (``prediction 'm'``).
    path
        The file.
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
