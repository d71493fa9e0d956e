"""A split as a table: the file ``scperteval split`` writes and :func:`read_split` reads.

Three layouts, one row per perturbation (or per fold and perturbation):

``fold`` table (a K-fold split)
    ``covariate, perturbation, fold, seen, seen_<fold>...``: the fold that holds the
    perturbation out; for a combination ``A+B``, ``seen`` is how many of its singles
    that fold trains on and ``seen_<fold>`` the same count in every fold (empty for
    single perturbations).
``role`` table (one train/validation/test split)
    ``covariate, perturbation, role, seen`` with role ``train``, ``val`` or ``test``.
``fold`` and ``role`` table (any other split)
    ``covariate, perturbation, fold, role, seen``: one row per fold and perturbation.

The ``seen`` columns are written for the reader's information and ignored when
the table is read back.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from scperteval.errors import SpecError
from scperteval.splits.split import Perturbation, Split

__all__ = [
    "TABLE_SUFFIXES",
    "check_table_path",
    "split_record",
    "split_table",
    "write_split",
]

#: File name endings of the tables a split is written to and read from.
TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")

#: The fold of a train/validation/test split (:meth:`Split.from_roles`).
ROLES_FOLD = "test"


def split_table(split: Split, perturbations: Iterable[Perturbation] = ()) -> pd.DataFrame:
    """The split as a table in the layout that suits it (see the module).

    Parameters
    ----------
    split
        The split.
    perturbations
        Every perturbation of the dataset; those no fold holds out or trains on get
        the role ``val``. Defaults to the perturbations the split names.

    Returns
    -------
    pandas.DataFrame
        Rows sorted by covariate and perturbation (and fold in the long layout).

    """
    named = set(split.held_out()).union(*split.train.values())
    everything = sorted(named.union(perturbations))
    if split.is_k_fold() and set(everything) == split.held_out():
        return _fold_table(split, everything)
    long = _long_table(split, everything)
    if split.folds == (ROLES_FOLD,):
        return long.drop(columns="fold")
    return long


def _fold_table(split: Split, everything: list[Perturbation]) -> pd.DataFrame:
    rows = []
    for perturbation in everything:
        fold = split.fold_of(perturbation)
        assert fold is not None  # a K-fold split holds every perturbation out
        seen = {f"seen_{other}": split.category(other, perturbation) for other in split.folds}
        rows.append(_row(split, fold, perturbation) | seen)
    return _nullable_counts(pd.DataFrame(rows))


def _long_table(split: Split, everything: list[Perturbation]) -> pd.DataFrame:
    rows = []
    for fold in split.folds:
        for perturbation in everything:
            tested, trained = perturbation in split.test[fold], perturbation in split.train[fold]
            role = "test" if tested else "train" if trained else "val"
            rows.append(_row(split, fold, perturbation, role=role))
    return _nullable_counts(pd.DataFrame(rows))


def _row(split: Split, fold: str, perturbation: Perturbation, **role: str) -> dict[str, Any]:
    """The columns of every layout: the perturbation, the fold (its role) and ``seen``."""
    covariate, label = perturbation
    seen = split.category(fold, perturbation)
    return {"covariate": covariate, "perturbation": label, "fold": fold, **role, "seen": seen}


def _nullable_counts(frame: pd.DataFrame) -> pd.DataFrame:
    counts = [c for c in frame.columns if c == "seen" or c.startswith("seen_")]
    return frame.astype(dict.fromkeys(counts, "Int64"))


def check_table_path(path: str | os.PathLike[str], *, writing: bool) -> Path:
    """Check a split table's name (and, for writing, its folder) before any work.

    Parameters
    ----------
    path
        A ``.csv``, ``.tsv`` or ``.parquet`` file.
    writing
        Whether the file is to be written (its folder must exist and be writable,
        and it must not be a folder) or read (it must exist).

    Returns
    -------
    pathlib.Path
        ``path`` as a path.

    Raises
    ------
    SpecError
        Naming the problem and what to give instead.

    """
    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise SpecError(
            f"split table {str(path)!r}: unknown file type {path.suffix or '(none)'!r}; "
            f"use {', '.join(TABLE_SUFFIXES)}"
        )
    if not writing:
        if not path.is_file():
            raise SpecError(f"split table {str(path)!r} not found")
        return path
    if path.is_dir():
        raise SpecError(f"split table {str(path)!r} is an existing folder; give a file name")
    folder = path.absolute().parent
    if not folder.is_dir():
        raise SpecError(f"cannot write split table {str(path)!r}: folder {folder} does not exist")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        raise SpecError(
            f"cannot write split table {str(path)!r}: folder {folder} is not writable"
        ) from None
    return path


def write_split(
    split: Split, path: str | os.PathLike[str], perturbations: Iterable[Perturbation] = ()
) -> pd.DataFrame:
    """Write :func:`split_table` to a ``.csv``, ``.tsv`` or ``.parquet`` file.

    The file is written beside its final name and renamed into place, so that an
    interrupted write leaves no partial table.

    Parameters
    ----------
    split, perturbations
        As for :func:`split_table`.
    path
        The file; its ending chooses the format.

    Returns
    -------
    pandas.DataFrame
        The table written.

    Raises
    ------
    SpecError
        As :func:`check_table_path`.

    """
    path = check_table_path(path, writing=True)
    table = split_table(split, perturbations)
    handle, staging = tempfile.mkstemp(prefix=".scperteval-split-", dir=path.absolute().parent)
    os.close(handle)
    try:
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            table.to_parquet(staging, index=False)
        else:
            table.to_csv(staging, sep="\t" if suffix == ".tsv" else ",", index=False)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return table


def split_record(split: Split | None) -> dict[str, object] | None:
    """The ``split`` entry of a run's ``run.json``, or ``None`` for a run without a split.

    Parameters
    ----------
    split
        The split the run was scored under.

    Returns
    -------
    dict or None
        :meth:`Split.describe` (origin, seed, test perturbations per fold,
        SHA-256 digest) with the layout (``"k-fold"``, ``"train/val/test"`` or
        ``"custom"``) and the training perturbations per fold.

    """
    if split is None:
        return None
    roles = split.folds == (ROLES_FOLD,)
    layout = "k-fold" if split.is_k_fold() else "train/val/test" if roles else "custom"
    return {
        **split.describe(),
        "layout": layout,
        "train": {fold: len(split.train[fold]) for fold in split.folds},
    }
