"""``scperteval.report``: rebuild calibration, leaderboard and reports from stored runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scperteval.engine.calibrators import Thresholds
from scperteval.errors import DatasetError, SpecError
from scperteval.scoring.derive import derive
from scperteval.scoring.result import PROTOCOL_FILE, RESULT_FILE, RUN_FILE, ScoreResult

__all__ = ["report"]


def _read_run(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    paths = [folder / RESULT_FILE, folder / RUN_FILE, folder / PROTOCOL_FILE]
    for path in paths:
        if not path.exists():
            raise DatasetError(f"{folder}: no {path.name}; is this the output folder of a run?")
    record = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    options = record.get("options", record)
    return pd.read_parquet(paths[0]), pd.read_csv(paths[2]), options


def report(
    folders: str | Path | Sequence[str | Path],
    out: str | Path | None = None,
    thresholds: Thresholds | None = None,
    aggregate: str | None = None,
    correction: str | None = None,
    figures: bool = True,
) -> ScoreResult:
    """Re-derive calibration, leaderboard and reports from stored results.

    Parameters
    ----------
    folders
        One output folder of ``score``, or several to merge into one
        leaderboard. Runs merge only when they scored the same data (checksum)
        with the same seed, truth mode and protocols' definitions; each model
        may appear in one run only.
    out
        Where to write (default: the single input folder).
    thresholds, aggregate, correction
        Override the stored settings.
    figures
        Draw the report's figures.

    Returns
    -------
    ScoreResult
        As :func:`score` returns, built without the data.

    """
    paths = [Path(folders)] if isinstance(folders, (str, Path)) else [Path(f) for f in folders]
    if not paths:
        raise SpecError("give at least one results folder")
    runs = [_read_run(p) for p in paths]
    first = runs[0][2]
    for path, (_, _, options) in zip(paths[1:], runs[1:], strict=True):
        for key in ("input_checksum", "seed", "truth", "de_method"):
            if options.get(key) != first.get(key):
                raise DatasetError(
                    f"cannot merge {path} with {paths[0]}: different {key} "
                    f"({options.get(key)!r} vs {first.get(key)!r})"
                )
    results, protocols = _merge([r[0] for r in runs], [r[1] for r in runs], paths)
    thresholds = thresholds or Thresholds(**first.get("thresholds", {}))
    aggregate = aggregate or first.get("aggregate", "median")
    correction = correction or first.get("correction", "bonferroni")
    columns = [c for c in results.columns if c != "calibrated"]
    derived = derive(
        results[columns],
        protocols,
        thresholds,
        aggregate,
        correction,
        first.get("truth", "half") == "half",
        int(first.get("seed", 0)),
    )
    info = {
        **first,
        "command": "report",
        "thresholds": thresholds.as_dict(),
        "aggregate": aggregate,
        "correction": correction,
        "merged_from": [str(p) for p in paths],
        "models": {k: v for _, _, o in runs for k, v in o.get("models", {}).items()},
    }
    result = ScoreResult.from_derived(derived, protocols, thresholds, info)
    target = Path(out) if out is not None else (paths[0] if len(paths) == 1 else None)
    if target is None:
        raise SpecError("merging several runs needs an output folder (out=...)")
    result.write(target, figures=figures)
    return result


def _merge(
    tables: Sequence[pd.DataFrame], protocol_tables: Sequence[pd.DataFrame], paths: Sequence[Path]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    if len(tables) == 1:
        return tables[0], protocol_tables[0]
    keys = ["protocol", "covariate", "perturbation", "source", "source_name"]
    seen_models: dict[str, Path] = {}
    for table, path in zip(tables, paths, strict=True):
        for name in table.loc[table["source"] == "model", "source_name"].unique():
            if name in seen_models:
                raise DatasetError(f"model {name!r} appears in both {seen_models[name]} and {path}")
            seen_models[name] = path
    merged = pd.concat(tables, ignore_index=True)
    shared = merged[merged["source"] != "model"]
    conflicts = shared.groupby(keys, observed=True)["value"].nunique(dropna=False)
    if (conflicts > 1).any():
        example = conflicts[conflicts > 1].index[0]
        raise DatasetError(f"runs disagree on a control or baseline value: {example}")
    merged = merged.drop_duplicates(subset=keys, keep="first").reset_index(drop=True)
    protocols = pd.concat(protocol_tables, ignore_index=True).drop_duplicates("protocol")
    return merged, protocols
