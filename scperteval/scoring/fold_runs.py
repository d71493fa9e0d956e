"""Runs that each scored one fold's predictions under the same split, pooled.

A model retrained per fold is often scored fold by fold, as its folds finish: each
run is scored under the whole split (same split, so the same training-fold
baselines and controls) with that fold's predictions only (``allow_missing``). Its
*folds* are the folds holding out the perturbations its models predicted. Pooling
keeps, of every run, the rows of its own folds, so the pooled table is the table a
single run of every fold's predictions would have stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scperteval.errors import DatasetError
from scperteval.scoring.folds import FOLD_COLUMN

__all__ = ["fold_run_rows", "in_run_order", "own_fold_rows", "run_folds", "split_digest"]

#: What identifies a row of stored results.
ROW_KEYS = ("protocol", "covariate", "perturbation", "source", "source_name")


def split_digest(options: Mapping[str, Any]) -> str | None:
    """The SHA-256 of the split a run was scored under, ``None`` without a split."""
    split = options.get("split")
    return str(split["sha256"]) if isinstance(split, Mapping) and "sha256" in split else None


def run_folds(results: pd.DataFrame, options: Mapping[str, Any]) -> tuple[str, ...]:
    """The folds whose held-out perturbations a run's models predicted.

    Parameters
    ----------
    results
        The run's stored results, with their ``fold`` column.
    options
        The run's ``run.json`` options (its ``models`` record their missing
        perturbations as ``covariate/perturbation``).

    Returns
    -------
    tuple of str
        The folds, in the split's order; every fold of the results when the run
        holds no model.

    """
    order = list((options.get("split") or {}).get("folds") or {})
    models = results[results["source"] == "model"]
    if models.empty:
        present = set(results[FOLD_COLUMN].dropna().astype(str))
    else:
        records = options.get("models") or {}
        names = models["covariate"].astype(str) + "/" + models["perturbation"].astype(str)
        predicted = [
            name not in set((records.get(model) or {}).get("missing") or ())
            for model, name in zip(models["source_name"], names, strict=True)
        ]
        present = set(models.loc[predicted, FOLD_COLUMN].dropna().astype(str))
    return tuple(f for f in order if f in present) + tuple(sorted(present - set(order)))


def fold_run_rows(
    tables: Sequence[pd.DataFrame], options: Sequence[Mapping[str, Any]], paths: Sequence[Path]
) -> list[pd.DataFrame]:
    """Each fold run's rows of its own folds, after checking that the runs pool.

    Parameters
    ----------
    tables
        The runs' stored results.
    options
        Their ``run.json`` options.
    paths
        Their folders (named in errors).

    Returns
    -------
    list of pandas.DataFrame
        Per run, the rows of the folds it predicted.

    Raises
    ------
    DatasetError
        When a run has no split or another split (another digest), or when two runs
        predicted the same fold on a common protocol.

    """
    digests = [split_digest(o) for o in options]
    for path, digest in zip(paths, digests, strict=True):
        if digest is None:
            raise DatasetError(
                f"cannot merge {path} with runs scored under a split: it has no split"
            )
        if digest != digests[0]:
            raise DatasetError(
                f"cannot merge {path} with {paths[0]}: different splits "
                f"(sha256 {digest[:12]}... vs {str(digests[0])[:12]}...)"
            )
    # Runs of different protocols may share folds (a protocol added to a run).
    owner: dict[tuple[str, str], Path] = {}
    rows = []
    for table, record, path in zip(tables, options, paths, strict=True):
        folds = run_folds(table, record)
        for fold in folds:
            for protocol in sorted(set(table["protocol"].astype(str))):
                if (fold, protocol) in owner:
                    raise DatasetError(
                        f"cannot merge {path} with {owner[fold, protocol]}: both scored "
                        f"fold {fold!r} ({protocol}); fold runs must predict different folds"
                    )
                owner[fold, protocol] = path
        rows.append(table[table[FOLD_COLUMN].astype(str).isin(folds)])
    return rows


def in_run_order(pooled: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """The pooled rows in the order of a fold run's own table (every fold's rows).

    Every run under the split stores a row for every held-out perturbation (a
    model's missing ones as NaN), in the order of one run of all folds; quantities
    that walk the perturbations in order (the criterion's bootstrap) then equal
    that run's. Rows the reference lacks (other protocols) follow in their order.

    Parameters
    ----------
    pooled
        The pooled results.
    reference
        A fold run's stored results, unfiltered.

    Returns
    -------
    pandas.DataFrame
        ``pooled``, reordered, with a fresh index.

    """
    position = {key: index for index, key in enumerate(_keys(reference))}
    rank = [position.get(key, len(position) + i) for i, key in enumerate(_keys(pooled))]
    order = sorted(range(len(rank)), key=rank.__getitem__)
    return pooled.iloc[order].reset_index(drop=True)


def _keys(table: pd.DataFrame) -> list[tuple[str, ...]]:
    columns = [table[c].astype(str) for c in ROW_KEYS]
    return list(zip(*columns, strict=True))


def own_fold_rows(
    extras: Sequence[pd.DataFrame],
    tables: Sequence[pd.DataFrame],
    options: Sequence[Mapping[str, Any]],
) -> pd.DataFrame:
    """Rows kept beside fold runs' results, each run's own folds, pooled in run order.

    Parameters
    ----------
    extras
        Per run, rows stored beside its results with a ``fold`` column (such as the
        values of a protocol run for the criterion alone).
    tables
        The runs' stored results (their models tell the runs' folds, see
        :func:`run_folds`).
    options
        Their ``run.json`` options.

    Returns
    -------
    pandas.DataFrame
        The rows of every run's own folds, in the order of the first run's rows.

    """
    parts = [
        extra[extra[FOLD_COLUMN].astype(str).isin(run_folds(table, record))]
        for extra, table, record in zip(extras, tables, options, strict=True)
    ]
    return in_run_order(pd.concat(parts, ignore_index=True), extras[0])
