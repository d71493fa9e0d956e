"""Checks of a stored run before ``report`` re-derives it.

A run folder can be edited by hand, copied half-way or written by another
version. Every column and option that ``report`` reads is checked for its type
here, so that a changed file is refused in one line naming the file and the
value, instead of failing deep inside the re-derivation.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from scperteval.errors import DatasetError
from scperteval.workflows.option_types import is_whole

__all__ = ["check_stored_run"]

#: Columns a stored results table must hold, with what each must be.
TEXT_COLUMNS = ("protocol", "covariate", "perturbation", "source", "source_name")

#: What the ``source`` column may hold.
SOURCES = ("model", "baseline", "negative", "positive")

#: Options of ``run.json`` with the values they may take (a type, or the accepted words).
WORD_OPTIONS = MappingProxyType(
    {
        "truth": ("half", "all"),
        "aggregate": ("mean", "median"),
        "correction": ("bonferroni", "bh"),
    }
)
MAPPING_OPTIONS = ("thresholds", "flags", "models", "dataset_options")


def check_stored_run(
    folder: Path, results: pd.DataFrame, protocols: pd.DataFrame, options: Any
) -> None:
    """Refuse a stored run whose tables or record do not hold what a run writes.

    Parameters
    ----------
    folder
        The run folder, for messages.
    results, protocols
        Its ``results.parquet`` and ``protocols.csv``.
    options
        The ``options`` of its ``run.json``.

    Raises
    ------
    DatasetError
        Naming the file, the column or option and the value found.

    """
    _check_options(folder / "run.json", options)
    _check_results(folder / "results.parquet", results)
    where = folder / "protocols.csv"
    if "protocol" not in protocols.columns:
        raise DatasetError(f"{where}: no column 'protocol'; {_RERUN}")
    unknown = sorted(set(results["protocol"].astype(str)) - set(protocols["protocol"].astype(str)))
    if unknown:
        raise DatasetError(
            f"{folder / 'results.parquet'}: protocol(s) {', '.join(map(repr, unknown[:5]))} "
            f"are not described in {where.name}; {_RERUN}"
        )


_RERUN = "the folder was changed after the run; run scperteval score again"


def _check_results(where: Path, results: pd.DataFrame) -> None:
    missing = [c for c in (*TEXT_COLUMNS, "value") if c not in results.columns]
    if missing:
        raise DatasetError(f"{where}: no column(s) {', '.join(map(repr, missing))}; {_RERUN}")
    if results.empty:
        raise DatasetError(f"{where}: holds no result; {_RERUN}")
    for column in ("value", "calibrated"):
        if column in results.columns and not (
            pd.api.types.is_numeric_dtype(results[column])
            and not pd.api.types.is_bool_dtype(results[column])
        ):
            raise DatasetError(
                f"{where}: column {column!r} holds {results[column].dtype} values, not numbers; "
                + _RERUN
            )
    if np.isinf(results["value"].to_numpy(dtype=float)).any():
        raise DatasetError(f"{where}: column 'value' holds infinite values; {_RERUN}")
    sources = sorted(set(results["source"].astype(str)) - set(SOURCES))
    if sources:
        raise DatasetError(
            f"{where}: unknown source(s) {', '.join(map(repr, sources[:5]))} (expected "
            f"{', '.join(SOURCES)}); {_RERUN}"
        )


def _check_options(where: Path, options: Any) -> None:
    if not isinstance(options, dict):
        raise DatasetError(f"{where}: its options are a {type(options).__name__}; {_RERUN}")
    for key in ("seed", "min_perturbations"):
        value = options.get(key)
        if value is not None and not is_whole(value):
            raise DatasetError(f"{where}: {key} is {value!r}, not a whole number; {_RERUN}")
    for key, words in WORD_OPTIONS.items():
        value = options.get(key)
        if value is not None and value not in words:
            raise DatasetError(
                f"{where}: {key} is {value!r}, not one of {', '.join(words)}; {_RERUN}"
            )
    for key in MAPPING_OPTIONS:
        value = options.get(key)
        if value is not None and not isinstance(value, dict):
            raise DatasetError(f"{where}: {key} is {value!r}, not a mapping; {_RERUN}")
    flags = options.get("flags") or {}
    if not all(isinstance(record, dict) for record in flags.values()):
        raise DatasetError(f"{where}: flags hold a value that is not a mapping; {_RERUN}")
    for key in ("covariates", "protocols"):
        value = options.get(key)
        if value is not None and not isinstance(value, list):
            raise DatasetError(f"{where}: {key} is {value!r}, not a list; {_RERUN}")
