"""Reading the user's own split, checked against the dataset it is for.

A split is given as a table (``.csv``, ``.tsv`` or ``.parquet``; see
:mod:`scperteval.splits.table` for the layouts), a :class:`pandas.DataFrame` with
the same columns, or ``"obs:COLUMN"``: a column of the dataset's ``obs`` that gives
every perturbed cell its perturbation's fold or role. The columns:

``perturbation``
    The label, as in the dataset's perturbation column (required).
``fold``
    The fold that holds the perturbation out; every fold trains on the others'.
``role``
    ``train``, ``val`` or ``test`` (one split). With ``fold`` as well: the
    perturbation's role in that fold, one row per fold and perturbation.
``covariate``
    The covariate group (cell line, cell type); without it a label's fold applies
    in every group that has the label.

Other columns (such as the ``seen`` counts ``scperteval split`` writes) are ignored.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from scperteval.data.dataset import ALL_COVARIATES, Dataset
from scperteval.errors import SpecError
from scperteval.splits.split import Perturbation, Split, _name
from scperteval.splits.table import check_table_path

__all__ = ["read_split", "ROLES"]

ROLES = ("train", "val", "test")
OBS_PREFIX = "obs:"


def read_split(source: Any, dataset: Dataset) -> Split:
    """Read a split and check it against the dataset's perturbations.

    Parameters
    ----------
    source
        A table file, a :class:`pandas.DataFrame`, ``"obs:COLUMN"``, or a
        :class:`Split` (checked as it is).
    dataset
        The dataset scored under the split. Perturbations it leaves out for too
        few cells may be listed or not; they are ignored.

    Returns
    -------
    Split
        With ``origin`` the file name, ``"DataFrame"`` or ``"obs:COLUMN"``.

    Raises
    ------
    SpecError
        When the table lacks a column, a value is missing, a perturbation is
        unknown to the dataset (named with the nearest label of the data) or not in
        the table, a perturbation is in two folds, a role is not ``train``, ``val``
        or ``test``, a split has no test perturbations, or a fold has no training
        perturbations in a covariate group it tests.

    """
    if isinstance(source, Split):
        _check_against(source, dataset, source.origin)
        return source
    if isinstance(source, pd.DataFrame):
        frame, origin = source, "DataFrame"
    elif isinstance(source, str) and source.startswith(OBS_PREFIX):
        frame, origin = _obs_frame(source[len(OBS_PREFIX) :], dataset), source
    elif isinstance(source, (str, os.PathLike)):
        frame, origin = _read_table(Path(source)), str(source)
    else:
        raise SpecError(
            "a split is a table file (.csv, .tsv, .parquet), a DataFrame, 'obs:COLUMN' "
            f"or a Split, got {type(source).__name__}"
        )
    split = _split_of(frame, dataset, origin)
    _check_against(split, dataset, origin)
    return split


def _read_table(path: Path) -> pd.DataFrame:
    check_table_path(path, writing=False)
    try:
        if path.suffix.lower() == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(
            path,
            sep="\t" if path.suffix.lower() == ".tsv" else ",",
            dtype=str,
            keep_default_na=False,
        )
    except Exception as exc:  # any reader failure is the file's fault, reported in one line
        raise SpecError(
            f"split table {str(path)!r}: cannot read as {path.suffix} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


def _obs_frame(column: str, dataset: Dataset) -> pd.DataFrame:
    """One row per perturbation of the dataset from an ``obs`` column of cells' folds."""
    obs = dataset.adata.obs
    if column not in obs.columns:
        raise SpecError(
            f"split column {column!r} not found in obs; available columns: "
            f"{', '.join(map(str, obs.columns))}"
        )
    values = obs[column].iloc[dataset.cell_index]
    perturbed = dataset.perturbation_labels != dataset.control_label
    cells = pd.DataFrame(
        {
            "covariate": dataset.covariate_labels[perturbed],
            "perturbation": dataset.perturbation_labels[perturbed],
            "value": values.to_numpy()[perturbed],
        }
    )
    unlabelled = cells["value"].isna()
    if unlabelled.any():
        first = cells[unlabelled].iloc[0]
        raise SpecError(
            f"obs column {column!r}: {int(unlabelled.sum())} perturbed cell(s) have no fold, "
            f"first of perturbation {first['perturbation']!r}; give every perturbed cell one"
        )
    cells["value"] = cells["value"].astype(str)
    distinct = cells.drop_duplicates()
    shared = distinct.duplicated(["covariate", "perturbation"], keep=False)
    if shared.any():
        first = distinct[shared].iloc[0]
        found = distinct[
            (distinct["covariate"] == first["covariate"])
            & (distinct["perturbation"] == first["perturbation"])
        ]["value"]
        raise SpecError(
            f"obs column {column!r}: the cells of {_name(tuple(first[:2]))} are in folds "
            f"{', '.join(map(repr, sorted(found)))}; all cells of a perturbation share one fold"
        )
    kind = "role" if set(distinct["value"]) <= set(ROLES) else "fold"
    return distinct.rename(columns={"value": kind})


def _split_of(frame: pd.DataFrame, dataset: Dataset, origin: str) -> Split:
    """The table's split, its labels checked against the dataset."""
    columns = [str(c) for c in frame.columns]
    layout = [c for c in ("fold", "role") if c in columns]
    if "perturbation" not in columns or not layout:
        lacking = "perturbation" if "perturbation" not in columns else "fold or role"
        raise SpecError(
            f"split {origin}: no {lacking} column (columns: {', '.join(columns) or 'none'}); "
            "a split table has columns perturbation and fold (or role), optionally covariate"
        )
    if frame.empty:
        raise SpecError(
            f"split {origin}: the table has columns but no row; one row per perturbation"
        )
    wanted = ["covariate"] * ("covariate" in columns) + ["perturbation", *layout]
    table = frame[wanted]
    for column in wanted:
        empty = table[column].isna() | (table[column].astype(str).str.strip() == "")
        if empty.any():
            raise SpecError(
                f"split {origin}: row {int(empty.to_numpy().nonzero()[0][0]) + 1} has no "
                f"{column}; give every row one"
            )
    table = table.astype(str).apply(lambda values: values.str.strip())
    rows = _with_covariates(table, dataset, origin)
    _check_coverage(zip(rows["covariate"], rows["perturbation"], strict=True), dataset, origin)
    if layout == ["fold"]:
        return Split.from_folds(_one_each(rows, "fold", origin), origin=origin)
    bad = ~rows["role"].isin(ROLES)
    if bad.any():
        first = rows[bad].iloc[0]
        raise SpecError(
            f"split {origin}: {_name((first['covariate'], first['perturbation']))} has role "
            f"{first['role']!r}; roles are 'train', 'val' or 'test'"
        )
    if layout == ["role"]:
        return Split.from_roles(_one_each(rows, "role", origin), origin=origin)
    return _per_fold(rows, origin)


def _with_covariates(table: pd.DataFrame, dataset: Dataset, origin: str) -> pd.DataFrame:
    """Rows with their covariate group, unknown labels refused and left-out ones dropped."""
    kept = {(c.covariate, c.perturbation) for c in dataset.conditions}
    known = kept | {(c.covariate, c.perturbation) for c, _ in dataset.dropped}
    if (
        "covariate" in table.columns
        and dataset.covariate_key is None
        and set(table["covariate"].astype(str)) == {ALL_COVARIATES}
    ):
        # The one group of data without a covariate, as `split` writes it.
        table = table.drop(columns="covariate")
    unknown: list[Perturbation] = []
    if "covariate" not in table.columns:
        groups: dict[str, list[str]] = {}
        for covariate, label in sorted(known):
            groups.setdefault(label, []).append(covariate)
        table = table.assign(covariate=table["perturbation"].map(groups))
        unknown_rows = table["covariate"].isna()
        unknown = [
            (ALL_COVARIATES, label)
            for label in dict.fromkeys(table.loc[unknown_rows, "perturbation"])
        ]
        # Each label left takes only known groups, so it adds no unknown pair below.
        table = table[~unknown_rows].explode("covariate")
    elif dataset.covariate_key is None:
        raise SpecError(
            f"split {origin}: the table has a covariate column but the data has no "
            "covariate; name its column (--covariate-key, covariate_key=...) or drop "
            "the table's covariate column"
        )
    pairs = list(zip(table["covariate"], table["perturbation"], strict=True))
    unknown += [pair for pair in dict.fromkeys(pairs) if pair not in known]
    if unknown:
        raise SpecError(_unknown_message(unknown, sorted(kept), dataset, origin))
    return table[[pair in kept for pair in pairs]].reset_index(drop=True)


def _unknown_message(
    unknown: list[Perturbation], kept: list[Perturbation], dataset: Dataset, origin: str
) -> str:
    covariate, label = unknown[0]
    if label == dataset.control_label:
        return (
            f"split {origin}: {label!r} is the control label; control cells are in no fold, "
            "remove its row"
        )
    same_group = [lab for cov, lab in kept if cov == covariate] or [lab for _, lab in kept]
    close = difflib.get_close_matches(label, same_group, n=1, cutoff=0.0)
    nearest = f" (nearest label in the data: {close[0]!r})" if close else ""
    where = "" if covariate == ALL_COVARIATES else f" in covariate group {covariate!r}"
    more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
    return (
        f"split {origin}: perturbation {label!r}{where} is not in the data{nearest}{more}; "
        "fix the label or remove the row"
    )


def _one_each(rows: pd.DataFrame, column: str, origin: str) -> dict[Perturbation, str]:
    """``{perturbation: value}``, refusing a perturbation given two values."""
    found: dict[Perturbation, str] = {}
    for covariate, label, value in zip(
        rows["covariate"], rows["perturbation"], rows[column], strict=True
    ):
        before = found.setdefault((covariate, label), value)
        if before != value:
            noun = "folds" if column == "fold" else "roles"
            raise SpecError(
                f"split {origin}: {_name((covariate, label))} is in {noun} {before!r} and "
                f"{value!r}; each perturbation belongs to one {column}"
            )
    return found


def _per_fold(rows: pd.DataFrame, origin: str) -> Split:
    """A split given fold by fold: the role of each perturbation in each fold."""
    test: dict[str, frozenset[Perturbation]] = {}
    train: dict[str, frozenset[Perturbation]] = {}
    for fold, members in rows.groupby("fold", sort=True):
        role_of = _one_each(members, "role", f"{origin} (fold {fold!r})")
        test[str(fold)] = frozenset(p for p, role in role_of.items() if role == "test")
        train[str(fold)] = frozenset(p for p, role in role_of.items() if role == "train")
    return Split(test=test, train=train, origin=origin)


def _check_against(split: Split, dataset: Dataset, origin: str) -> None:
    """Refuse a split that misses perturbations, tests nothing, or trains on nothing."""
    kept = [(c.covariate, c.perturbation) for c in dataset.conditions]
    named = split.held_out().union(*split.train.values())
    unknown = sorted(
        named - set(kept) - {(c.covariate, c.perturbation) for c, _ in dataset.dropped}
    )
    if unknown:
        raise SpecError(_unknown_message(unknown, sorted(kept), dataset, origin))
    # A train/validation/test split's validation perturbations are in neither set.
    if split.is_k_fold():
        _check_coverage(named, dataset, origin)
    for fold in split.folds:
        if not split.test[fold]:
            raise SpecError(
                f"split {origin}: fold {fold!r} holds no perturbation out; give it test "
                "perturbations or remove it"
            )
        for covariate in _covariates(split.test[fold]):
            if covariate not in _covariates(split.train[fold]):
                where = "" if covariate == ALL_COVARIATES else f" in covariate group {covariate!r}"
                raise SpecError(
                    f"split {origin}: fold {fold!r} has no training perturbations{where}; "
                    "every fold must train on at least one perturbation of each group it "
                    "tests (spread the perturbations over two or more folds)"
                )


def _check_coverage(named: Iterable[Perturbation], dataset: Dataset, origin: str) -> None:
    """Refuse a split that names not every perturbation of the data."""
    kept = [(c.covariate, c.perturbation) for c in dataset.conditions]
    given = set(named)
    missing = [p for p in kept if p not in given]
    if missing:
        shown = ", ".join(_name(p) for p in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise SpecError(
            f"split {origin} misses {len(missing)} of the data's {len(kept)} perturbations: "
            f"{shown}{more}; give each a fold (or a role)"
        )


def _covariates(perturbations: Iterable[Perturbation]) -> set[str]:
    return {covariate for covariate, _ in perturbations}
