"""``scperteval.score`` and ``scperteval.report``: calibrated leaderboards."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from scperteval.api import load_dataset
from scperteval.context import Context
from scperteval.engine.calibrators import Thresholds
from scperteval.engine.dispatch import (
    CONTROLS,
    Candidate,
    group_statistics,
    resolve_workers,
    run_protocols,
    task_count,
)
from scperteval.engine.engine import DEFAULT_SAMPLE_CELLS, Engine
from scperteval.engine.failures import failure_counts, failure_record
from scperteval.engine.suites import resolve_protocols
from scperteval.errors import DatasetError, SpecError
from scperteval.progress import progress_bar
from scperteval.runinfo import Timer, start_dataset_checksum, write_atomic, write_run_json
from scperteval.scoring.baselines import BASELINES, baseline_candidates
from scperteval.scoring.derive import Derived, derive
from scperteval.scoring.predictions import load_predictions

__all__ = ["score", "report", "ScoreResult"]

RESULT_FILE = "results.parquet"
RUN_FILE = "run.json"
PROTOCOL_FILE = "protocols.csv"


@dataclass
class ScoreResult:
    """Scores of models and baselines, their calibration and the leaderboard.

    Attributes
    ----------
    results
        Tidy per-perturbation values of every model, baseline and control:
        ``covariate, perturbation, protocol, source, source_name, value, reason,
        calibrated``.
    calibration
        DRF/BDS per protocol and covariate group (empty in plain mode).
    protocols
        Description of each protocol.
    aggregates
        Per protocol and entry: n, mean, median and bootstrap 95% CIs.
    leaderboard
        The :class:`~scperteval.scoring.leaderboard.Leaderboard`.
    tests
        Paired one-sided tests against the negative baselines.
    thresholds
        The trust thresholds used.
    info
        Run information (data checksum, seed, options, coverage, timings).

    """

    results: pd.DataFrame
    calibration: pd.DataFrame
    protocols: pd.DataFrame
    aggregates: pd.DataFrame
    leaderboard: Any
    tests: pd.DataFrame
    thresholds: Thresholds
    info: dict[str, Any] = field(default_factory=dict)

    def _repr_html_(self) -> str:
        return str(self.leaderboard._repr_html_())

    def __repr__(self) -> str:
        return repr(self.leaderboard)

    def write(self, folder: str | Path, figures: bool = True) -> None:
        """Write every table, the reports and ``run.json`` into ``folder``."""
        from scperteval.reporting import write_reports

        folder = Path(folder)
        write_atomic(folder / RESULT_FILE, lambda p: self.results.to_parquet(p, index=False))
        write_atomic(folder / PROTOCOL_FILE, lambda p: self.protocols.to_csv(p, index=False))
        if not self.calibration.empty:
            write_atomic(
                folder / "calibration.csv", lambda p: self.calibration.to_csv(p, index=False)
            )
        write_atomic(folder / "aggregates.csv", lambda p: self.aggregates.to_csv(p, index=False))
        write_atomic(folder / "tests.csv", lambda p: self.tests.to_csv(p, index=False))
        failures = failure_counts(self.results)
        write_atomic(folder / "failures.csv", lambda p: failures.to_csv(p, index=False))
        write_atomic(
            folder / "leaderboard.csv", lambda p: self.leaderboard.table.to_csv(p, index=False)
        )
        write_reports(self, folder, figures=figures)
        write_run_json(folder / RUN_FILE, self.info.get("command", "score"), self.info)


def _result(
    derived: Derived, protocols: pd.DataFrame, thresholds: Thresholds, info: dict[str, Any]
) -> ScoreResult:
    return ScoreResult(
        results=derived.results,
        calibration=derived.calibration,
        protocols=protocols,
        aggregates=derived.aggregates,
        leaderboard=derived.leaderboard,
        tests=derived.tests,
        thresholds=thresholds,
        info=info,
    )


def score(
    data: Any,
    predictions: Any,
    protocols: Any = "default",
    perturbation_key: str = "perturbation",
    control_label: str = "control",
    covariate_key: str | None = None,
    layer: str | None = None,
    min_cells: int = 4,
    normalize: bool = False,
    subset: Mapping[str, Any] | None = None,
    backed: bool | str = "auto",
    chunk_cells: int | None = None,
    seed: int = 0,
    de_method: str = "t-test",
    truth: str = "half",
    baselines: Sequence[str] | bool = True,
    allow_missing: bool = False,
    aggregate: str = "median",
    thresholds: Thresholds | None = None,
    correction: str = "bonferroni",
    workers: int | None = None,
    executor: Any = None,
    sample_cells: int = DEFAULT_SAMPLE_CELLS,
    device: str | None = None,
    precision: str = "float64",
    out: str | Path | None = None,
    figures: bool = True,
    progress: bool | None = None,
) -> ScoreResult:
    """Score models and built-in baselines; calibrate; build the leaderboard.

    Parameters
    ----------
    data
        The truth: AnnData, ``.h5ad`` path or :class:`~scperteval.dataset.Dataset`.
    predictions
        ``{name: AnnData or path}``, a list of ``"NAME=PATH"``, or a folder of
        ``.h5ad`` files. Each holds cells or one pseudobulk row per perturbation,
        labelled with the truth's perturbation (and covariate) column.
    protocols
        Suite name, TOML path, comma-separated names or a list (see
        :func:`scperteval.calibrate`).
    perturbation_key, control_label, covariate_key, layer, min_cells, normalize, subset
        How to read the truth (see :class:`~scperteval.dataset.Dataset`).
    backed, chunk_cells
        Leave the matrices on disk and read this many cells at a time (see
        :class:`~scperteval.dataset.Dataset`).
    seed
        Seed of the truth halves, cell samples and bootstrap.
    de_method
        DE method behind spaces, weights and DE protocols.
    truth
        ``half``: score against the truth half and calibrate (default);
        ``all``: plain, uncalibrated scores against all truth cells.
    baselines
        ``True`` for every built-in baseline, ``False`` for none, or names.
    allow_missing
        Score models that miss perturbations (NaN there; coverage reported).
    aggregate
        ``median`` (default, robust to the unbounded calibrated scores of a
        perturbation whose controls are close) or ``mean`` over perturbations.
    thresholds
        When a protocol is trusted (default BDS >= 0.75, median DRF >= 0.2).
    correction
        ``bonferroni`` (default) or ``bh`` for the paired tests.
    workers, executor
        Parallelism: threads (by default the CPU cores this process may use, at
        most 8), any :class:`concurrent.futures.Executor`, or a
        :class:`distributed.Client` to compute on a dask cluster with identical
        results (see :doc:`/distributed`).
    sample_cells
        Cap on the cell samples used as controls.
    device
        Where energy distance, MMD and Sinkhorn are computed: ``None`` (default) with
        NumPy, the reference; ``"cpu"`` or ``"cuda"`` (``"cuda:N"``) with torch
        (the ``ot`` extra).
    precision
        ``"float64"`` (default) or ``"float32"`` (torch devices only; faster on a GPU,
        accurate to the bound given in the torch documentation).
    out
        Folder for the tables, reports, figures and ``run.json``.
    figures
        Draw the report's figures.
    progress
        Show progress bars (default: when stderr is a terminal).

    Returns
    -------
    ScoreResult
        Results, calibration, aggregates, tests and the leaderboard.

    """
    timer = Timer()
    started = time.time()
    thresholds = thresholds or Thresholds()
    if truth not in ("half", "all"):
        raise SpecError(f"truth must be 'half' or 'all', got {truth!r}")
    chosen = resolve_protocols(protocols)
    with timer.step("load"):
        dataset = load_dataset(
            data,
            perturbation_key,
            control_label,
            covariate_key,
            layer,
            min_cells,
            normalize,
            subset,
            backed,
            chunk_cells,
        )
    checksum = start_dataset_checksum(dataset)
    context = Context(dataset, seed=seed, de_method=de_method)
    engine = Engine(
        context, truth=truth, sample_cells=sample_cells, device=device, precision=precision
    )
    with timer.step("predictions"):
        models = load_predictions(predictions, dataset, context.layout, allow_missing)
    names = [m.name for m in models]
    baseline_names: tuple[str, ...]
    if isinstance(baselines, bool):
        baseline_names = BASELINES if baselines else ()
    else:
        baseline_names = tuple(baselines)
        unknown = sorted(set(baseline_names) - set(BASELINES))
        if unknown:
            raise SpecError(f"unknown baseline(s) {unknown}; valid: {', '.join(BASELINES)}")
    clash = sorted(set(names) & set(BASELINES))
    if clash:
        raise DatasetError(f"model name(s) {clash} clash with built-in baselines; rename them")
    candidates: list[Candidate] = list(CONTROLS) if truth == "half" else []
    candidates += [Candidate("model", m.name, m.source) for m in models]
    candidates += baseline_candidates(engine, baseline_names)
    workers = resolve_workers(workers)
    with timer.step("group_statistics"):
        group_statistics(engine, executor)  # here, so that the timing is separate
    n_tasks = task_count(engine, chosen)
    with timer.step("protocols"), progress_bar("protocols", n_tasks, progress) as bar:
        bar.unit = "tasks"
        results = run_protocols(
            engine, chosen, candidates, workers=workers, executor=executor, progress=bar.update
        )
    protocol_table = pd.DataFrame([p.describe() for p in chosen])
    with timer.step("derive"):
        derived = derive(
            results, protocol_table, thresholds, aggregate, correction, truth == "half", seed
        )
    info: dict[str, Any] = {
        "command": "score",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "input": dataset.source,
        "input_checksum": checksum(),
        "seed": seed,
        "truth": truth,
        "aggregate": aggregate,
        "correction": correction,
        "thresholds": thresholds.as_dict(),
        "de_method": de_method,
        "pair_backend": engine.pairs.name,
        "protocols": [p.name for p in chosen],
        "dataset_options": dataset.options(),
        "models": {
            m.name: {
                "coverage": m.coverage,
                "missing": [f"{c}/{p}" for c, p in m.missing],
                "pseudobulk": m.pseudobulk,
            }
            for m in models
        },
        "n_cells": dataset.n_cells,
        "n_perturbations": len(dataset.conditions),
        "n_failed_values": int(results["value"].isna().sum()),
        "failures": failure_record(results),
    }
    result = _result(derived, protocol_table, thresholds, info)
    info["timings_seconds"] = {**timer.seconds, "total": time.time() - started}
    if out is not None:
        result.write(out, figures=figures)
    return result


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
    result = _result(derived, protocols, thresholds, info)
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
