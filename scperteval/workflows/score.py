"""``scperteval.score``: score models and baselines, calibrate, build the leaderboard."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

from scperteval.data.load import DatasetOptions
from scperteval.engine.calibrators import Thresholds
from scperteval.engine.dispatch import CONTROLS, Candidate
from scperteval.engine.engine import DEFAULT_SAMPLE_CELLS, Engine
from scperteval.engine.population_cap import DEFAULT_MAX_POPULATION_CELLS
from scperteval.errors import DatasetError, SpecError
from scperteval.outputs import staged_output
from scperteval.runinfo import Timer
from scperteval.scoring.baselines import BASELINES, CELL_EVAL_MEAN, baseline_candidates
from scperteval.scoring.derive import derive
from scperteval.scoring.flags import prediction_flags
from scperteval.scoring.predictions import CONTROL_MODES, Prediction, load_predictions
from scperteval.scoring.result import ScoreResult
from scperteval.scoring.split_predictions import load_split_predictions
from scperteval.scoring.trust import MIN_PERTURBATIONS
from scperteval.scoring.vcc import has_challenge_terms
from scperteval.splits.reading import read_split
from scperteval.workflows.option_types import (
    as_thresholds,
    check_option_types,
    refuse_de_tables_under_split,
)
from scperteval.workflows.split_scoring import (
    criterion_protocols,
    criterion_record,
    split_breakdown,
    split_verdict_changes,
)
from scperteval.workflows.steps import (
    check_job_options,
    check_min_perturbations,
    open_engine,
    protocol_table,
    run_protocol_tasks,
    run_summary,
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
    deltas: Collection[str] = (),
    control: str = "measured",
    aggregate: str = "median",
    thresholds: Thresholds | None = None,
    correction: str = "bonferroni",
    min_perturbations: int = MIN_PERTURBATIONS,
    workers: int | None = None,
    executor: Any = None,
    sample_cells: int = DEFAULT_SAMPLE_CELLS,
    max_population_cells: int | str | None = DEFAULT_MAX_POPULATION_CELLS,
    device: str | None = None,
    precision: str = "float64",
    de_tables: Any = (),
    out: str | Path | None = None,
    figures: bool = True,
    progress: bool | None = None,
    split: Any = None,
    **dataset_options: Unpack[DatasetOptions],
) -> ScoreResult:
    """Score models and built-in baselines; calibrate; build the leaderboard.

    Parameters
    ----------
    data
        The truth: AnnData, ``.h5ad`` path or :class:`~scperteval.data.dataset.Dataset`.
    predictions
        ``{name: prediction}``, a list of ``"NAME=PATH"``, or a folder of prediction
        files. A prediction is an AnnData (or ``.h5ad``) of cells or pseudobulk rows,
        a table with one row per perturbation and one column per gene (a
        :class:`pandas.DataFrame`, ``.csv``, ``.tsv`` or ``.parquet``), or a
        :class:`~scperteval.PredictionArray` (``.npz``), labelled with the truth's
        perturbation (and covariate) names; see :doc:`/predictions`.
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
        ``True`` for every built-in baseline, ``False`` for none, or names. With
        ``truth="all"`` and the three terms of the Virtual Cell Challenge among the
        protocols, ``True`` adds ``cell_eval_mean``, the baseline of the
        leaderboard's ``vcc_score`` column (see :mod:`scperteval.scoring.vcc`); it
        may be named only with ``truth="all"``.
    allow_missing
        Score models that miss perturbations (NaN there; coverage reported).
    deltas
        Names of the models that predict changes from the control mean rather than
        expression: the measured control mean of each perturbation's covariate
        group is added back before scoring (CLI: ``--delta NAME``).
    control
        Where the models' deltas against the control are taken. ``measured``
        (default): the measured control cells, for every candidate alike.
        ``predicted``: each model's own predicted control cells (the rows labelled
        with the control label, per covariate group), for its deltas, its DE and
        its energy distances against the control, as cell-eval does with the
        control cells of a prediction file (CLI: ``--control-from-predictions``).
        It reproduces cell-eval's values, but a model then moves its own reference;
        baselines keep the measured control. Needs ``truth="all"`` (the controls
        that calibrate a score take their deltas against the measured control) and
        predicted control cells in every covariate group a model predicts.
    aggregate
        ``median`` (default, robust to the unbounded calibrated scores of a
        perturbation whose controls are close) or ``mean`` over perturbations.
    thresholds
        When a protocol is trusted (default BDS >= 0.75, median DRF >= 0.2): a
        :class:`~scperteval.Thresholds` or a mapping of its fields.
    correction
        ``bonferroni`` (default) or ``bh`` for the paired tests.
    min_perturbations
        Fewest perturbations with both controls defined for a protocol to be trusted
        (default 10; see :mod:`scperteval.scoring.trust`).
    workers, executor
        Parallelism: threads (by default the CPU cores this process may use, at
        most 8), any :class:`concurrent.futures.Executor`, or a
        :class:`distributed.Client` to compute on a dask cluster with identical
        results (see :doc:`/distributed`).
    sample_cells
        Cap on the cell samples used as controls.
    max_population_cells
        Cells each population protocol uses of each population (truth, controls,
        every model's predicted cells) at most, default 2000, by the seeded rule of
        :mod:`~scperteval.engine.population_cap`; ``None`` or ``"all"``: every cell.
    device
        Where energy distance, MMD and Sinkhorn are computed: ``None`` (default) with
        NumPy, the reference; ``"cpu"`` or ``"cuda"`` (``"cuda:N"``) with torch
        (the ``ot`` extra).
    precision
        ``"float64"`` (default) or ``"float32"`` (torch devices only; faster on a GPU,
        accurate to the bound given in the torch documentation).
    de_tables
        Differential expression computed earlier, read instead of computed: a
        ``scperteval de`` output folder or DataFrame, or a cell-eval / pdex table (path
        or DataFrame), or a list of them (see :mod:`scperteval.stats.de_tables`); each
        must match the data's perturbations, genes and seed.
    out
        Folder for the tables, reports, figures and ``run.json``.
    figures
        Draw the report's figures.
    progress
        Show progress bars (default: when stderr is a terminal).
    split
        Score under a split (see :doc:`/leaderboards`, "Cross-validated
        benchmarks"): a :class:`~scperteval.splits.split.Split`, a split table
        (``.csv``, ``.tsv``, ``.parquet``) or ``"obs:COLUMN"`` (see
        :func:`~scperteval.splits.reading.read_split`). Only held-out perturbations
        are scored; the baselines and negative controls pool the training
        perturbations of each perturbation's fold; a model may then be given per
        fold (``{fold: prediction}`` or a folder of files named by the folds). The
        result adds each fold's headline and Ahlmann-Eltze et al.'s criterion
        against the training-mean baseline. ``None`` (default): no split.
    **dataset_options
        How to read the truth: ``perturbation_key``, ``control_label``,
        ``covariate_key``, ``layer``, ``min_cells``, ``normalize``, ``subset``,
        ``backed``, ``chunk_cells``, and ``pool=True`` to read as one screen cells that an
        ``obs`` column splits into screens reusing the same labels (refused otherwise;
        see :class:`~scperteval.data.load.DatasetOptions`).

    Returns
    -------
    ScoreResult
        Results, calibration, aggregates, tests and the leaderboard.

    """
    check_option_types(
        out=out,
        sample_cells=sample_cells,
        figures=figures,
        progress=progress,
        baselines=baselines,
        aggregate=aggregate,
        correction=correction,
    )
    timer = Timer()
    thresholds = as_thresholds(thresholds)
    if truth not in TRUTH_MODES:
        raise SpecError(f"truth must be 'half' or 'all', got {truth!r}")
    if control not in CONTROL_MODES:
        raise SpecError(f"control must be 'measured' or 'predicted', got {control!r}")
    if control == "predicted" and truth != "all":
        raise SpecError(
            "deltas against the predicted control (--control-from-predictions) need "
            "--truth all: a calibrated score sets a model between controls whose deltas "
            "are taken against the measured control"
        )
    check_min_perturbations(min_perturbations)
    if isinstance(predictions, Mapping) and not predictions:
        raise SpecError("give at least one model to score (predictions={'name': ...})")
    # Options both the checks and the engine take.
    shared = {"seed": seed, "de_method": de_method, "device": device, "precision": precision}
    chosen, workers, cap = check_job_options(
        protocols, out=out, workers=workers, max_population_cells=max_population_cells, **shared
    )
    baseline_names = _baseline_names(
        baselines, truth, has_challenge_terms(chosen) and split is None
    )
    if split is not None and CELL_EVAL_MEAN in baseline_names:
        raise SpecError(
            f"baseline {CELL_EVAL_MEAN!r} is built from every perturbation's cells, held-out "
            "ones included: it is not scored under a split"
        )
    refuse_de_tables_under_split(split, de_tables)
    engine, checksum = open_engine(
        data,
        timer,
        dataset_options,
        checksum=True,
        truth=truth,
        sample_cells=sample_cells,
        de_tables=de_tables,
        max_population_cells=cap,
        **shared,
    )
    assert checksum is not None
    dataset = engine.context.dataset
    if split is not None:
        engine.use_split(read_split(split, dataset))
    folds = engine.folds
    reading: dict[str, Any] = {"allow_missing": allow_missing, "deltas": deltas, "control": control}
    with timer.step("predictions"):
        if folds is None:
            models = load_predictions(predictions, dataset, engine.context.layout, **reading)
        else:
            models = load_split_predictions(
                predictions, dataset, engine.context.layout, folds, **reading
            )
    candidates = _candidates(engine, truth, models, baseline_names)
    extra = criterion_protocols(chosen) if folds is not None else []
    results = run_protocol_tasks(
        engine,
        [*chosen, *extra],
        timer,
        candidates=candidates,
        workers=workers,
        executor=executor,
        progress=progress,
    )
    protocols_described = protocol_table(chosen)
    with timer.step("flags"):
        flags = prediction_flags(models, engine, seed)
    all_results = results
    if extra:
        # The criterion's own protocol is judged on, not ranked.
        results = results[~results["protocol"].isin([p.name for p in extra])].reset_index(drop=True)

    def derive_on(table: Any, trusted: Any = None) -> Any:
        return derive(
            table,
            protocols_described,
            thresholds,
            aggregate,
            correction,
            truth == "half",
            seed,
            min_perturbations=min_perturbations,
            flags={name: record["flags"] for name, record in flags.items()},
            trusted_protocols=trusted,
        )

    with timer.step("derive"):
        derived = derive_on(results)
    split_tables: dict[str, Any] = {}
    if folds is not None:
        with timer.step("folds"):
            split_tables = split_breakdown(
                derived, results, all_results, folds.split, chosen, extra, seed, derive_on
            )
        if truth == "half":
            split_tables["verdict_changes"] = split_verdict_changes(
                engine,
                chosen,
                derived.calibration,
                thresholds,
                min_perturbations,
                lambda twin: run_protocol_tasks(
                    twin, chosen, timer, workers=workers, executor=executor, progress=progress
                ),
            )
    info: dict[str, Any] = {
        "command": "score",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "input_checksum": checksum(),
        "seed": seed,
        "truth": truth,
        "control": control,
        "aggregate": aggregate,
        "correction": correction,
        "min_perturbations": min_perturbations,
        "headline": derived.leaderboard.definition,
        "flags": flags,
        "thresholds": thresholds.as_dict(),
        "de_method": de_method,
        "pair_backend": engine.pairs.name,
        "protocols": [p.name for p in chosen],
        "dataset_options": dataset.options(),
        "models": {m.name: m.record() for m in models},
        **run_summary(engine, results),
    }
    if folds is not None:
        info["split"] = {
            **folds.split.describe(),
            "scored_perturbations": int(folds.scored().size),
            "criterion": criterion_record(extra),
        }
        if "verdict_changes" in split_tables:
            changes = split_tables["verdict_changes"]
            info["split"]["verdict_changes"] = changes.loc[changes["changed"], "protocol"].tolist()
    result = ScoreResult.from_derived(derived, protocols_described, thresholds, info)
    for name, table in split_tables.items():
        setattr(result, name, table)
    info["timings_seconds"] = timer.timings()
    if out is not None:
        with staged_output(out) as folder:
            result.write(folder, figures=figures, progress=progress)
    return result


def _baseline_names(
    baselines: Sequence[str] | bool, truth: str = "half", challenge: bool = False
) -> tuple[str, ...]:
    if isinstance(baselines, bool):
        if not baselines:
            return ()
        return BASELINES + ((CELL_EVAL_MEAN,) if truth == "all" and challenge else ())
    # One name given as a string is a list of one, not of its letters.
    names = (baselines,) if isinstance(baselines, str) else tuple(baselines)
    valid = (*BASELINES, CELL_EVAL_MEAN)
    unknown = sorted(set(names) - set(valid))
    if unknown:
        raise SpecError(f"unknown baseline(s) {unknown}; valid: {', '.join(valid)}")
    if CELL_EVAL_MEAN in names and truth != "all":
        raise SpecError(
            f"baseline {CELL_EVAL_MEAN!r} is built from every cell, the truth's included: "
            "it is scored only with truth='all'"
        )
    return names


def _candidates(
    engine: Engine, truth: str, models: Sequence[Prediction], baseline_names: tuple[str, ...]
) -> list[Candidate]:
    """The controls (calibrated runs only), then the models, then the baselines."""
    clash = sorted({m.name for m in models} & {*BASELINES, CELL_EVAL_MEAN})
    if clash:
        raise DatasetError(f"model name(s) {clash} clash with built-in baselines; rename them")
    candidates: list[Candidate] = list(CONTROLS) if truth == "half" else []
    candidates += [Candidate("model", m.name, m.source) for m in models]
    return candidates + baseline_candidates(engine, baseline_names)
