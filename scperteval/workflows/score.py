"""``scperteval.score``: score models and baselines, calibrate, build the leaderboard."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Unpack

from scperteval.data.load import DatasetOptions, load_dataset
from scperteval.engine.calibrators import Thresholds
from scperteval.engine.dispatch import CONTROLS, Candidate, resolve_workers
from scperteval.engine.engine import DEFAULT_SAMPLE_CELLS, Engine
from scperteval.engine.suites import resolve_protocols
from scperteval.errors import DatasetError, SpecError
from scperteval.runinfo import Timer, start_dataset_checksum
from scperteval.scoring.baselines import BASELINES, baseline_candidates
from scperteval.scoring.derive import derive
from scperteval.scoring.predictions import Prediction, load_predictions
from scperteval.scoring.result import ScoreResult
from scperteval.workflows.steps import (
    build_engine,
    dataset_summary,
    protocol_table,
    run_protocol_tasks,
)

__all__ = ["score"]

TRUTH_MODES = ("half", "all")


def score(
    data: Any,
    predictions: Any,
    protocols: Any = "default",
    *,
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
    **dataset_options: Unpack[DatasetOptions],
) -> ScoreResult:
    """Score models and built-in baselines; calibrate; build the leaderboard.

    Parameters
    ----------
    data
        The truth: AnnData, ``.h5ad`` path or :class:`~scperteval.data.dataset.Dataset`.
    predictions
        ``{name: AnnData or path}``, a list of ``"NAME=PATH"``, or a folder of
        ``.h5ad`` files. Each holds cells or one pseudobulk row per perturbation,
        labelled with the truth's perturbation (and covariate) column.
    protocols
        Suite name, TOML path, comma-separated names or a list (see
        :func:`scperteval.calibrate`).
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
    **dataset_options
        How to read the truth: ``perturbation_key``, ``control_label``,
        ``covariate_key``, ``layer``, ``min_cells``, ``normalize``, ``subset``,
        ``backed``, ``chunk_cells`` (see :class:`~scperteval.data.load.DatasetOptions`).

    Returns
    -------
    ScoreResult
        Results, calibration, aggregates, tests and the leaderboard.

    """
    timer = Timer()
    started = time.time()
    thresholds = thresholds or Thresholds()
    if truth not in TRUTH_MODES:
        raise SpecError(f"truth must be 'half' or 'all', got {truth!r}")
    chosen = resolve_protocols(protocols)
    baseline_names = _baseline_names(baselines)
    with timer.step("load"):
        dataset = load_dataset(data, **dataset_options)
    checksum = start_dataset_checksum(dataset)
    engine = build_engine(
        dataset,
        seed=seed,
        de_method=de_method,
        truth=truth,
        sample_cells=sample_cells,
        device=device,
        precision=precision,
    )
    with timer.step("predictions"):
        models = load_predictions(predictions, dataset, engine.context.layout, allow_missing)
    candidates = _candidates(engine, truth, models, baseline_names)
    results = run_protocol_tasks(
        engine,
        chosen,
        timer,
        candidates=candidates,
        workers=resolve_workers(workers),
        executor=executor,
        progress=progress,
    )
    protocols_described = protocol_table(chosen)
    with timer.step("derive"):
        derived = derive(
            results, protocols_described, thresholds, aggregate, correction, truth == "half", seed
        )
    info: dict[str, Any] = {
        "command": "score",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
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
        "models": {m.name: _model_record(m) for m in models},
        **dataset_summary(dataset, results),
    }
    result = ScoreResult.from_derived(derived, protocols_described, thresholds, info)
    info["timings_seconds"] = {**timer.seconds, "total": time.time() - started}
    if out is not None:
        result.write(out, figures=figures)
    return result


def _baseline_names(baselines: Sequence[str] | bool) -> tuple[str, ...]:
    if isinstance(baselines, bool):
        return BASELINES if baselines else ()
    names = tuple(baselines)
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        raise SpecError(f"unknown baseline(s) {unknown}; valid: {', '.join(BASELINES)}")
    return names


def _candidates(
    engine: Engine, truth: str, models: Sequence[Prediction], baseline_names: tuple[str, ...]
) -> list[Candidate]:
    """The controls (calibrated runs only), then the models, then the baselines."""
    clash = sorted({m.name for m in models} & set(BASELINES))
    if clash:
        raise DatasetError(f"model name(s) {clash} clash with built-in baselines; rename them")
    candidates: list[Candidate] = list(CONTROLS) if truth == "half" else []
    candidates += [Candidate("model", m.name, m.source) for m in models]
    return candidates + baseline_candidates(engine, baseline_names)


def _model_record(model: Prediction) -> dict[str, Any]:
    return {
        "coverage": model.coverage,
        "missing": [f"{c}/{p}" for c, p in model.missing],
        "pseudobulk": model.pseudobulk,
    }
