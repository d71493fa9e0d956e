"""Python entry points mirroring the command line."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from scperteval.context import Context
from scperteval.dataset import Dataset
from scperteval.progress import cell_progress, progress_bar
from scperteval.runinfo import Timer, dataset_checksum, write_atomic, write_run_json

__all__ = ["de", "load_dataset"]


def load_dataset(
    data: Any,
    perturbation_key: str = "perturbation",
    control_label: str = "control",
    covariate_key: str | None = None,
    layer: str | None = None,
    min_cells: int = 4,
    normalize: bool = False,
    subset: Mapping[str, Any] | None = None,
    backed: bool | str = "auto",
    chunk_cells: int | None = None,
) -> Dataset:
    """Open and validate a perturbation dataset; see :class:`~scperteval.dataset.Dataset`.

    Parameters
    ----------
    data
        AnnData or path to an ``.h5ad`` file.
    perturbation_key, control_label, covariate_key, layer, min_cells, normalize, subset
        As for :class:`~scperteval.dataset.Dataset`.
    backed, chunk_cells
        Leave the matrices on disk and read this many cells at a time (see
        :class:`~scperteval.dataset.Dataset`).

    Returns
    -------
    Dataset
        The validated dataset.

    """
    if isinstance(data, Dataset):
        return data
    return Dataset(
        data,
        perturbation_key=perturbation_key,
        control_label=control_label,
        covariate_key=covariate_key,
        layer=layer,
        min_cells=min_cells,
        normalize=normalize,
        subset=subset,
        backed=backed,
        chunk_cells=chunk_cells,
    )


def de(
    data: Any,
    perturbation_key: str = "perturbation",
    control_label: str = "control",
    covariate_key: str | None = None,
    layer: str | None = None,
    method: str = "t-test",
    reference: str = "rest",
    half: str = "all",
    min_cells: int = 4,
    normalize: bool = False,
    subset: Mapping[str, Any] | None = None,
    backed: bool | str = "auto",
    chunk_cells: int | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Differential expression of every perturbation against its reference.

    Parameters
    ----------
    data
        AnnData, path to an ``.h5ad`` file, or a :class:`~scperteval.dataset.Dataset`.
    perturbation_key, control_label, covariate_key, layer, min_cells, normalize, subset
        How to read the dataset (see :class:`~scperteval.dataset.Dataset`).
    backed, chunk_cells
        Leave the matrices on disk and read this many cells at a time (see
        :class:`~scperteval.dataset.Dataset`).
    method
        ``t-test`` (Welch), ``t-test_overestim_var`` (scanpy's variant) or
        ``wilcoxon`` (Mann-Whitney U).
    reference
        ``rest`` (other perturbed cells of the covariate group) or ``control``.
    half
        ``all`` cells of each perturbation, or its seeded ``truth`` half or
        technical ``duplicate``.
    seed
        Seed of the truth/duplicate split.
    out
        Folder to write ``de.parquet`` and ``run.json`` to.
    progress
        Show a progress bar (default: when stderr is a terminal).

    Returns
    -------
    pandas.DataFrame
        One row per (covariate, perturbation, gene): ``statistic, pvalue,
        pvalue_adj, log_fold_change, mean_target, mean_reference``.

    Examples
    --------
    >>> import scperteval
    >>> adata = scperteval.simulate(n_perturbations=3, n_genes=20, seed=1)
    >>> table = scperteval.de(adata, perturbation_key="perturbation")
    >>> sorted(table.columns)[:3]
    ['covariate', 'gene', 'log_fold_change']

    """
    timer = Timer()
    started = time.time()
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
    with progress_bar("group statistics", dataset.n_cells, progress) as bar:
        context = Context(dataset, seed=seed, de_method=method, progress=cell_progress(bar))
        with timer.step("group_statistics"):
            context.group_stats  # noqa: B018 - computed here so the timing is separate
        with timer.step("differential_expression"):
            result = context.de(method=method, reference=reference, half=half)
    with timer.step("table"):
        table = result.to_frame()
    if out is not None:
        folder = Path(out)
        with timer.step("write"):
            write_atomic(folder / "de.parquet", lambda p: table.to_parquet(p, index=False))
        write_run_json(
            folder / "run.json",
            "de",
            {
                **dataset.options(),
                "method": method,
                "reference": reference,
                "half": half,
                "seed": seed,
            },
            input=dataset.source,
            input_checksum=dataset_checksum(dataset),
            n_cells=dataset.n_cells,
            n_genes=dataset.n_genes,
            n_perturbations=len(dataset.conditions),
            left_out=[
                {"covariate": c.covariate, "perturbation": c.perturbation, "cells": n}
                for c, n in dataset.dropped
            ],
            timings_seconds={**timer.seconds, "total": time.time() - started},
        )
    return table
