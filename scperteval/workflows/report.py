"""``scperteval.report``: leaderboards and reports rebuilt from stored runs, merged or compared.

Runs on the **same dataset** (same input checksum and the same reading options
that select cells: subset, perturbation, control and covariate columns, layer,
``min_cells``, normalisation) merge into one leaderboard:
they must share the seed, truth mode, DE method and control mode (measured or
predicted control); a model may appear in
several runs when they scored different protocols (adding a protocol to an old
leaderboard means scoring only that protocol and merging), and any value two
runs both hold must agree. Runs on **different datasets** are each re-derived
on their own and summarised in a models x datasets table
(:mod:`scperteval.scoring.across`).

Runs that each scored one fold's predictions under the same split are pooled. A
model retrained per fold is often scored fold by fold, as its folds finish: each
run is scored under the whole split (same split, so the same training-fold
baselines and controls) with that fold's predictions only (``allow_missing``). Its
*folds* are the folds holding out the perturbations its models predicted. Pooling
keeps, of every run, the rows of its own folds, so the pooled table is the table a
single run of every fold's predictions would have stored.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd

from scperteval.engine.calibrators import Thresholds
from scperteval.errors import DatasetError, ScpertevalWarning, SpecError
from scperteval.outputs import check_output_folder, staged_output
from scperteval.reporting.across import write_across
from scperteval.scoring.across import AcrossDatasets, across_datasets, dataset_label
from scperteval.scoring.derive import derive
from scperteval.scoring.folds import FOLD_COLUMN, fold_scores, fold_summary
from scperteval.scoring.mean_ratio import mean_ratio_table
from scperteval.scoring.result import (
    CRITERION_VALUES_FILE,
    PROTOCOL_FILE,
    RESULT_FILE,
    RUN_FILE,
    ScoreResult,
)
from scperteval.scoring.trust import MIN_PERTURBATIONS
from scperteval.workflows.option_types import as_thresholds, check_option_types
from scperteval.workflows.stored_run import check_stored_run

__all__ = ["report"]

MERGE_KEYS = ("seed", "truth", "de_method", "control")
#: The value of a merge key in a run recorded before the key existed.
MERGE_DEFAULTS = MappingProxyType({"control": "measured"})
# Reading options that change which cells or values a run scored (not how it read them).
IDENTITY_OPTIONS = (
    "perturbation_key",
    "control_label",
    "covariate_key",
    "layer",
    "min_cells",
    "normalize",
    "subset",
)
Run = tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]


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


def _read_run(folder: Path) -> Run:
    paths = [folder / RESULT_FILE, folder / RUN_FILE, folder / PROTOCOL_FILE]
    for path in paths:
        if not path.exists():
            raise DatasetError(f"{folder}: no {path.name}; is this the output folder of a run?")
    try:
        record = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{folder / RUN_FILE}: not a readable run record ({exc})") from None
    command = record.get("command") if isinstance(record, dict) else None
    if command not in ("score", "report"):
        raise DatasetError(
            f"{folder} holds the output of 'scperteval {command or '?'}'; report rebuilds "
            "the leaderboards of 'scperteval score' runs"
        )
    options = record.get("options", record)
    try:
        results, protocols = pd.read_parquet(paths[0]), pd.read_csv(paths[2])
    except Exception as exc:  # noqa: BLE001 - any reader failure means a damaged run folder
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(f"{folder}: cannot read the stored results ({reason})") from None
    check_stored_run(folder, results, protocols, options)
    return results, protocols, options


def report(
    folders: str | Path | Sequence[str | Path],
    out: str | Path | None = None,
    thresholds: Thresholds | None = None,
    aggregate: str | None = None,
    correction: str | None = None,
    figures: bool = True,
    min_perturbations: int | None = None,
    progress: bool | None = None,
) -> ScoreResult | AcrossDatasets:
    """Re-derive calibration, leaderboard and reports from stored results.

    Parameters
    ----------
    folders
        One output folder of ``score``, or several. Folders on the same data
        (checksum) merge into one leaderboard when they share the seed, truth
        mode and DE method and agree on every value they both hold (the same
        model may appear in several when they scored different protocols).
        Folders on different data give a models x datasets summary.
    out
        Where to write (default: the single input folder).
    thresholds, aggregate, correction
        Override the stored settings.
    figures
        Draw the report's figures.
    min_perturbations
        Override the stored fewest perturbations a protocol needs to be trusted.
    progress
        Show a bar over the figures (default: when stderr is a terminal).

    Returns
    -------
    ScoreResult or AcrossDatasets
        As :func:`score` returns, built without the data; for several datasets
        the summary (each dataset's re-derived result in its ``results``).

    """
    check_option_types(
        folders=folders,
        out=out,
        figures=figures,
        progress=progress,
        aggregate=aggregate,
        correction=correction,
        min_perturbations=min_perturbations,
    )
    if thresholds is not None:
        thresholds = as_thresholds(thresholds)
    paths = [Path(folders)] if isinstance(folders, (str, Path)) else [Path(f) for f in folders]
    if not paths:
        raise SpecError("give at least one results folder")
    target = Path(out) if out is not None else (paths[0] if len(paths) == 1 else None)
    if target is None:
        raise SpecError("merging several runs needs an output folder (out=...)")
    check_output_folder(target)
    runs = [_read_run(p) for p in paths]
    groups: dict[str, list[int]] = {}
    for index, (_, _, options) in enumerate(runs):
        groups.setdefault(_dataset_key(options), []).append(index)
    settings = {
        "thresholds": thresholds,
        "aggregate": aggregate,
        "correction": correction,
        "min_perturbations": min_perturbations,
    }
    if len(groups) == 1:
        result = _merged(runs, paths, settings)
        with staged_output(target) as folder:
            result.write(folder, figures=figures, progress=progress)
        return result
    labelled: dict[str, ScoreResult] = {}
    for indices in groups.values():
        result = _merged([runs[i] for i in indices], [paths[i] for i in indices], settings)
        label = dataset_label(runs[indices[0]][2])
        while label in labelled:
            label += "'"
        labelled[label] = result
    summary = across_datasets(labelled)
    with staged_output(target) as folder:
        write_across(summary, folder, figures=figures)
    return summary


def _dataset_key(options: dict[str, Any]) -> str:
    """What identifies a run's data: the file's checksum and the options that select cells."""
    reading = options.get("dataset_options") or {}
    chosen = {key: reading.get(key) for key in IDENTITY_OPTIONS}
    return json.dumps([options.get("input_checksum"), chosen], sort_keys=True, default=str)


def _merged(runs: Sequence[Run], paths: Sequence[Path], settings: dict[str, Any]) -> ScoreResult:
    """One dataset's runs merged and re-derived."""
    first = runs[0][2]
    for path, (_, _, options) in zip(paths[1:], runs[1:], strict=True):
        for key in MERGE_KEYS:
            theirs = options.get(key, MERGE_DEFAULTS.get(key))
            ours = first.get(key, MERGE_DEFAULTS.get(key))
            if theirs != ours:
                raise DatasetError(
                    f"cannot merge {path} with {paths[0]}: different {key} ({theirs!r} vs {ours!r})"
                )
    tables = [r[0] for r in runs]
    pooled_folds = len(runs) > 1 and any(split_digest(o) is not None for _, _, o in runs)
    if pooled_folds:
        tables = fold_run_rows(tables, [r[2] for r in runs], paths)
    results, protocols = _merge(tables, [r[1] for r in runs], paths)
    if pooled_folds:
        results = in_run_order(results, runs[0][0])
    thresholds = settings["thresholds"] or Thresholds(**first.get("thresholds", {}))
    aggregate = settings["aggregate"] or first.get("aggregate", "median")
    correction = settings["correction"] or first.get("correction", "bonferroni")
    min_perturbations = settings["min_perturbations"]
    if min_perturbations is None:
        min_perturbations = int(first.get("min_perturbations", MIN_PERTURBATIONS))
    flags = {k: v for _, _, o in runs for k, v in (o.get("flags") or {}).items()}
    columns = [c for c in results.columns if c != "calibrated"]

    def derive_on(table: pd.DataFrame, trusted: Any = None) -> Any:
        return derive(
            table,
            protocols,
            thresholds,
            aggregate,
            correction,
            first.get("truth", "half") == "half",
            int(first.get("seed", 0)),
            min_perturbations=min_perturbations,
            flags={name: record.get("flags", []) for name, record in flags.items()},
            trusted_protocols=trusted,
        )

    derived = derive_on(results[columns])
    info = {
        **first,
        "command": "report",
        "thresholds": thresholds.as_dict(),
        "aggregate": aggregate,
        "correction": correction,
        "min_perturbations": min_perturbations,
        "headline": derived.leaderboard.definition,
        "flags": flags,
        "protocols": [str(p) for p in protocols["protocol"]],
        "merged_from": [str(p) for p in paths] if len(paths) > 1 else first.get("merged_from"),
        "models": {k: v for _, _, o in runs for k, v in o.get("models", {}).items()},
    }
    if not info["merged_from"]:
        info.pop("merged_from")
    result = ScoreResult.from_derived(derived, protocols, thresholds, info)
    if pooled_folds:
        # The pooled rows are each fold's own run's: the breakdown by fold follows.
        folds = tuple(str(f) for f in first["split"]["folds"])
        trusted = derived.leaderboard.trusted
        result.fold_scores = fold_scores(
            results[columns], folds, lambda table: derive_on(table, trusted).leaderboard.headline
        )
        # The criterion on the stored error protocols and on those the runs added
        # for it alone (stored apart, not ranked).
        lower = [str(r.protocol) for r in protocols.itertuples() if str(r.better) == "lower"]
        judged = results
        added = _criterion_values(paths, runs)
        if added is not None:
            result.criterion_values = added
            judged = pd.concat([results, added.drop(columns=FOLD_COLUMN)], ignore_index=True)
            lower += [p for p in dict.fromkeys(added["protocol"].astype(str)) if p not in lower]
        result.criterion = mean_ratio_table(judged, lower, int(first.get("seed", 0)))
        result.fold_summary = fold_summary(
            derived.leaderboard.headline, result.fold_scores, result.criterion
        )
        info["pooled_folds"] = sorted(set(results[FOLD_COLUMN].dropna().astype(str)))
    return result


def _criterion_values(paths: Sequence[Path], runs: Sequence[Run]) -> pd.DataFrame | None:
    """The pooled values of the protocols fold runs added for the criterion alone.

    ``None`` when no run added one; when only some runs hold theirs (runs stored
    before these values were kept), the criterion goes without them, as a note says.
    """
    added = [
        bool(((options.get("split") or {}).get("criterion") or {}).get("protocol_added"))
        for _, _, options in runs
    ]
    files = [Path(path) / CRITERION_VALUES_FILE for path in paths]
    if not any(added):
        return None
    if not all(file.exists() for file in files):
        missing = next(path for path, file in zip(paths, files, strict=True) if not file.exists())
        warnings.warn(
            f"{missing} holds no {CRITERION_VALUES_FILE} (stored before these values were "
            "kept): the pooled criterion leaves out the protocols added for it alone",
            ScpertevalWarning,
            stacklevel=3,
        )
        return None
    extras = []
    for file in files:
        try:
            extra = pd.read_parquet(file)
        except Exception as exc:  # noqa: BLE001 - any reader failure means a damaged run folder
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DatasetError(
                f"{file}: cannot read the stored criterion values ({reason})"
            ) from None
        if not set(ROW_KEYS) | {"value", FOLD_COLUMN} <= set(extra.columns):
            raise DatasetError(f"{file}: not the criterion values of a run (columns missing)")
        extras.append(extra)
    # Each run's own folds, pooled in the order of the first run's rows.
    parts = [
        extra[extra[FOLD_COLUMN].astype(str).isin(run_folds(table, options))]
        for extra, (table, _, options) in zip(extras, runs, strict=True)
    ]
    return in_run_order(pd.concat(parts, ignore_index=True), extras[0])


def _merge(
    tables: Sequence[pd.DataFrame], protocol_tables: Sequence[pd.DataFrame], paths: Sequence[Path]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    if len(tables) == 1:
        return tables[0], protocol_tables[0]
    described = pd.concat(protocol_tables, ignore_index=True).astype(str)
    definitions = described.drop_duplicates()
    clash = definitions["protocol"][definitions["protocol"].duplicated()]
    if len(clash):
        raise DatasetError(
            f"runs define protocol {clash.iloc[0]!r} differently; rename one of them"
        )
    merged = pd.concat(tables, ignore_index=True)
    conflicts = merged.groupby(list(ROW_KEYS), observed=True)["value"].nunique(dropna=False)
    if (conflicts > 1).any():
        protocol, covariate, perturbation, source, name = conflicts[conflicts > 1].index[0]
        origin = [
            str(path)
            for table, path in zip(tables, paths, strict=True)
            if ((table["protocol"] == protocol) & (table["source_name"] == name)).any()
        ]
        raise DatasetError(
            f"runs disagree on {source} {name!r}, protocol {protocol!r}, perturbation "
            f"{perturbation!r} ({covariate}): scored differently in {', '.join(origin)}; "
            "a model may appear in several runs only with the same predictions"
        )
    merged = merged.drop_duplicates(subset=list(ROW_KEYS), keep="first").reset_index(drop=True)
    order = list(dict.fromkeys(p for table in protocol_tables for p in table["protocol"]))
    protocols = (
        pd.concat(protocol_tables, ignore_index=True)
        .drop_duplicates("protocol")
        .set_index("protocol")
        .loc[order]
        .reset_index()
    )
    return merged, protocols
