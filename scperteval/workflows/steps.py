"""The named steps that ``calibrate`` and ``score`` are made of.

A job opens its dataset (:func:`scperteval.data.load.load_dataset`), builds the
run's engine (:func:`build_engine`), runs its protocols over the candidates
(:func:`run_protocol_tasks`), then derives and writes its own tables; the
pieces here are the ones both jobs share.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import pandas as pd

from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.data.load import load_dataset
from scperteval.engine.dispatch import (
    CONTROLS,
    Candidate,
    group_statistics,
    resolve_workers,
    run_protocols,
    task_count,
)
from scperteval.engine.engine import Engine
from scperteval.engine.failures import failure_record
from scperteval.engine.pairs import check_device
from scperteval.engine.population_cap import (
    DEFAULT_MAX_POPULATION_CELLS,
    check_max_population_cells,
    subsampled_summary,
)
from scperteval.engine.protocol import Protocol
from scperteval.engine.suites import resolve_protocols
from scperteval.errors import DatasetError, SpecError
from scperteval.outputs import check_output_folder
from scperteval.progress import cell_progress, progress_bar
from scperteval.runinfo import Timer
from scperteval.runinfo.checksums import PendingChecksum, start_input_checksum
from scperteval.stats.de_methods import DE_METHODS
from scperteval.stats.de_tables import read_de_table
from scperteval.workflows.option_types import is_whole

__all__ = [
    "build_engine",
    "check_calibratable",
    "check_job_options",
    "check_min_perturbations",
    "check_run_options",
    "load_and_hash",
    "open_engine",
    "run_summary",
    "protocol_table",
    "run_protocol_tasks",
]


def check_run_options(
    *,
    out: Any,
    seed: Any,
    workers: Any = None,
    device: Any = None,
    precision: Any = "float64",
    de_method: Any = None,
) -> int:
    """Check the options every job shares, before any data is read.

    Parameters
    ----------
    out
        The output folder, or ``None`` (checked writable, see
        :func:`~scperteval.outputs.check_output_folder`).
    seed
        A whole number.
    workers
        ``None`` or a whole number of at least 1.
    device, precision
        See :func:`~scperteval.engine.pairs.check_device`.
    de_method
        A registered DE method, or ``None``.

    Returns
    -------
    int
        The number of worker threads (:func:`~scperteval.engine.dispatch.resolve_workers`).

    Raises
    ------
    SpecError
        Naming the first invalid option.

    """
    if not is_whole(seed):
        raise SpecError(f"seed must be a whole number, got {seed!r}")
    check_device(device, precision)
    if de_method is not None:
        DE_METHODS.get(de_method)
    if out is not None:
        check_output_folder(out)
    return resolve_workers(workers)


#: Fewest genes a calibrated run accepts.
MIN_CALIBRATION_GENES = 10


def check_calibratable(dataset: Dataset) -> None:
    """Refuse data whose protocols cannot be calibrated: too few genes or perturbations.

    The negative controls of a perturbation are built from the *other*
    perturbations of its covariate group (the leave-one-out dataset mean, the
    perturbed-cell sample), so each group needs at least two. Below
    :data:`MIN_CALIBRATION_GENES` genes, correlations and rankings across genes
    rest on a handful of values and every gene selection (``top_k``, ``heg``,
    ``pca``) is the same few genes, so agreement between the controls would say
    nothing about a metric.

    Raises
    ------
    DatasetError
        Naming the number of genes, or the group.

    """
    if dataset.n_genes < MIN_CALIBRATION_GENES:
        raise DatasetError(
            f"the data has {dataset.n_genes} gene(s); calibration needs at least "
            f"{MIN_CALIBRATION_GENES} (a response measured on fewer genes cannot tell "
            "the metrics apart)"
        )
    for covariate in dataset.covariates:
        n = len(dataset.perturbations(covariate))
        if n < 2:
            where = "the data" if covariate == "all" else f"covariate group {covariate!r}"
            raise DatasetError(
                f"{where} has {n} perturbation(s) with enough cells; calibration compares "
                "each with the others of its group, so it needs at least 2"
            )


def load_and_hash(
    data: Any,
    timer: Timer,
    dataset_options: Mapping[str, Any],
    *,
    checksum: bool = True,
    check: Callable[[Dataset], None] | None = None,
) -> tuple[Dataset, PendingChecksum | None]:
    """Open the dataset (step ``load``) while its file is hashed in the background.

    The hash of a file given by path starts before the file is read, on the core
    the reading leaves idle; it is cancelled if the dataset cannot be opened or
    fails ``check``. The job owns the returned checksum.

    Parameters
    ----------
    data
        What the job was given: an AnnData, a path or an open Dataset.
    timer
        The job's timings.
    dataset_options
        Keyword arguments of :func:`~scperteval.data.load.load_dataset`.
    checksum
        Whether the job records the input's checksum.
    check
        Called with the open dataset before the hash is kept (it raises to refuse).

    Returns
    -------
    tuple
        The dataset, and its pending checksum (``None`` without ``checksum``).

    """
    from_path = checksum and isinstance(data, (str, os.PathLike))
    pending = start_input_checksum(data) if from_path else None
    try:
        with timer.step("load"):
            dataset = load_dataset(data, **dataset_options)
        if check is not None:
            check(dataset)
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise
    if checksum and pending is None:
        pending = start_input_checksum(dataset)
    return dataset, pending


def check_job_options(
    protocols: Any, *, max_population_cells: Any, **run_options: Any
) -> tuple[list[Protocol], int, int | None]:
    """Check the options of a job that runs protocols, before any data is read.

    Parameters
    ----------
    protocols
        What :func:`~scperteval.engine.suites.resolve_protocols` accepts.
    max_population_cells
        See :func:`~scperteval.engine.population_cap.check_max_population_cells`.
    **run_options
        The options of :func:`check_run_options`.

    Returns
    -------
    tuple
        The resolved protocols, the number of worker threads and the population cap.

    """
    workers = check_run_options(**run_options)
    cap = check_max_population_cells(max_population_cells)
    return resolve_protocols(protocols), workers, cap


def check_min_perturbations(min_perturbations: Any) -> None:
    """Refuse a ``min_perturbations`` that is not a whole number of at least 1.

    Parameters
    ----------
    min_perturbations
        Fewest perturbations with both controls a protocol needs to be trusted.

    Raises
    ------
    SpecError
        If it is not a whole number, or is below 1.

    """
    if isinstance(min_perturbations, bool) or not isinstance(min_perturbations, int):
        raise SpecError(f"min_perturbations must be a whole number, got {min_perturbations!r}")
    if min_perturbations < 1:
        raise SpecError(f"min_perturbations must be at least 1, got {min_perturbations}")


def open_engine(
    data: Any,
    timer: Timer,
    dataset_options: Mapping[str, Any],
    *,
    checksum: bool,
    truth: str,
    **engine_settings: Any,
) -> tuple[Engine, PendingChecksum | None]:
    """Open the dataset (:func:`load_and_hash`) and build the job's engine on it.

    Parameters
    ----------
    data, timer, dataset_options, checksum
        As for :func:`load_and_hash`; calibrated jobs (``truth="half"``) refuse data
        :func:`check_calibratable` refuses.
    truth, **engine_settings
        As for :func:`build_engine`.

    Returns
    -------
    tuple
        The engine, and the input's pending checksum (``None`` without ``checksum``).

    """
    check = check_calibratable if truth == "half" else None
    dataset, pending = load_and_hash(data, timer, dataset_options, checksum=checksum, check=check)
    return build_engine(dataset, truth=truth, **engine_settings), pending


def build_engine(
    dataset: Dataset,
    *,
    seed: int,
    de_method: str,
    truth: str,
    sample_cells: int,
    device: str | None,
    precision: str,
    de_tables: Sequence[Any] = (),
    max_population_cells: int | None = DEFAULT_MAX_POPULATION_CELLS,
) -> Engine:
    """The engine of a run: the dataset's derived data and the run's settings.

    Parameters
    ----------
    dataset
        The validated dataset.
    seed, de_method
        Seed of halves and samples; DE method behind spaces, weights and DE protocols.
    truth
        ``half`` (calibrated) or ``all`` (plain scores).
    sample_cells, device, precision
        As for :class:`~scperteval.engine.engine.Engine`.
    de_tables
        Precomputed DE tables to read instead of computing that DE (see
        :func:`~scperteval.stats.de_tables.read_de_table`); checked against the data here.
    max_population_cells
        Cells a population protocol uses of each population at most (``None``: all;
        see :mod:`~scperteval.engine.population_cap`).

    Returns
    -------
    Engine
        The engine; nothing is computed yet.

    """
    context = Context(dataset, seed=seed, de_method=de_method)
    single = isinstance(de_tables, (str, os.PathLike, pd.DataFrame))
    for table in [de_tables] if single else de_tables:
        precomputed = read_de_table(
            table, context.layout.conditions, dataset.var_names, dataset.control_label, seed
        )
        _check_de_half(precomputed, truth)
        context.use_de_table(precomputed)
    return Engine(
        context,
        truth=truth,
        sample_cells=sample_cells,
        device=device,
        precision=precision,
        max_population_cells=max_population_cells,
    )


#: The halves whose DE a run reads: a calibrated run that of the truth half (and the
#: duplicate half a technical duplicate is scored on), a ``truth="all"`` run all cells.
DE_HALVES = MappingProxyType({"half": ("truth", "duplicate"), "all": ("all",)})


def _check_de_half(table: Any, truth: str) -> None:
    """Refuse a DE table of cells the run never takes the DE of (it would go unused)."""
    wanted = DE_HALVES.get(truth, ())
    if table.half in wanted:
        return
    fix = (
        "scperteval de DATA --half truth --seed SEED"
        if truth == "half"
        else "scperteval de DATA --half all"
    )
    kind = "a calibrated run" if truth == "half" else "a --truth all run"
    cells = {"all": "all cells", "truth": "the truth half", "duplicate": "the duplicate half"}
    raise SpecError(
        f"DE table {table.source}: computed on {cells.get(table.half, table.half)}, but "
        f"{kind} uses the DE of {' or '.join(cells[h] for h in wanted)}; compute it with {fix}"
    )


def run_protocol_tasks(
    engine: Engine,
    protocols: Sequence[Protocol],
    timer: Timer,
    *,
    candidates: Sequence[Candidate] = CONTROLS,
    workers: int,
    executor: Any,
    progress: bool | None,
) -> pd.DataFrame:
    """Every protocol's tasks (after the group statistics), timed and with a progress bar.

    Parameters
    ----------
    engine
        The run's engine.
    protocols
        The resolved protocols.
    timer
        Records ``group_statistics`` (when not computed yet) and ``protocols``.
    candidates
        What is scored against the truth (default: the protocols' controls).
    workers, executor
        Threads, or an executor or dask client to run the tasks on.
    progress
        Show a progress bar (default: when stderr is a terminal).

    Returns
    -------
    pandas.DataFrame
        The tidy per-perturbation results.

    """
    # The one pass over the data, timed apart (on the cluster with a dask client).
    context = engine.context
    with (
        timer.step("group_statistics"),
        progress_bar("group statistics", context.dataset.n_cells, progress) as cells,
    ):
        context.progress = cell_progress(cells)
        try:
            group_statistics(engine, executor)
        finally:
            context.progress = None
    with (
        timer.step("protocols"),
        progress_bar("protocols", task_count(engine, protocols), progress, "tasks") as bar,
    ):
        return run_protocols(
            engine, protocols, candidates, workers=workers, executor=executor, progress=bar.update
        )


def protocol_table(protocols: Sequence[Protocol]) -> pd.DataFrame:
    """One row describing each protocol (metric, space, controls, ...)."""
    return pd.DataFrame([p.describe() for p in protocols])


def run_summary(engine: Engine, results: pd.DataFrame) -> dict[str, Any]:
    """What ``run.json`` records about the data, the DE tables read, the failures and the cap."""
    dataset = engine.context.dataset
    return {
        "input": dataset.source,
        "n_cells": dataset.n_cells,
        "n_genes": dataset.n_genes,
        "n_perturbations": len(dataset.conditions),
        "covariates": dataset.covariates,
        "n_failed_values": int(results["value"].isna().sum()),
        "failures": failure_record(results),
        "left_out": [
            {"covariate": c.covariate, "perturbation": c.perturbation, "cells": n}
            for c, n in dataset.dropped
        ],
        "de_tables": engine.context.de_tables,
        "population_cap": subsampled_summary(
            engine.max_population_cells, engine.subsampled_populations
        ),
    }
