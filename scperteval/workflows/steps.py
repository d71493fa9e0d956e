"""The named steps that ``calibrate`` and ``score`` are made of.

A job opens its dataset (:func:`scperteval.data.load.load_dataset`), builds the
run's engine (:func:`build_engine`), runs its protocols over the candidates
(:func:`run_protocol_tasks`), then derives and writes its own tables; the
pieces here are the ones both jobs share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.engine.dispatch import (
    CONTROLS,
    Candidate,
    group_statistics,
    run_protocols,
    task_count,
)
from scperteval.engine.engine import Engine
from scperteval.engine.failures import failure_record
from scperteval.engine.protocol import Protocol
from scperteval.progress import progress_bar
from scperteval.runinfo import Timer

__all__ = ["build_engine", "dataset_summary", "protocol_table", "run_protocol_tasks"]


def build_engine(
    dataset: Dataset,
    *,
    seed: int,
    de_method: str,
    truth: str,
    sample_cells: int,
    device: str | None,
    precision: str,
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

    Returns
    -------
    Engine
        The engine; nothing is computed yet.

    """
    context = Context(dataset, seed=seed, de_method=de_method)
    return Engine(
        context, truth=truth, sample_cells=sample_cells, device=device, precision=precision
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
    """Group statistics, then every protocol's tasks, timed and with a progress bar.

    Parameters
    ----------
    engine
        The run's engine.
    protocols
        The resolved protocols.
    timer
        Records ``group_statistics`` and ``protocols``.
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
    with timer.step("group_statistics"):
        group_statistics(engine, executor)
    with timer.step("protocols"), progress_bar(
        "protocols", task_count(engine, protocols), progress
    ) as bar:
        bar.unit = "tasks"
        return run_protocols(
            engine, protocols, candidates, workers=workers, executor=executor, progress=bar.update
        )


def protocol_table(protocols: Sequence[Protocol]) -> pd.DataFrame:
    """One row describing each protocol (metric, space, controls, ...)."""
    return pd.DataFrame([p.describe() for p in protocols])


def dataset_summary(dataset: Dataset, results: pd.DataFrame) -> dict[str, Any]:
    """What ``run.json`` and the results record about the data and the failures."""
    return {
        "input": dataset.source,
        "n_cells": dataset.n_cells,
        "n_genes": dataset.n_genes,
        "n_perturbations": len(dataset.conditions),
        "covariates": dataset.covariates,
        "n_failed_values": int(results["value"].isna().sum()),
        "failures": failure_record(results),
    }
