"""``scperteval.de``: differential expression of every perturbation at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Unpack

import pandas as pd

from scperteval.context import Context
from scperteval.data.layout import HALVES
from scperteval.data.load import DatasetOptions
from scperteval.errors import SpecError
from scperteval.outputs import staged_output
from scperteval.progress import cell_progress, progress_bar
from scperteval.runinfo import Timer, write_atomic, write_run_json
from scperteval.stats.diffexp import REFERENCES
from scperteval.workflows.option_types import check_option_types
from scperteval.workflows.steps import check_run_options, load_and_hash

__all__ = ["de"]


def de(
    data: Any,
    *,
    method: str = "t-test",
    reference: str = "rest",
    half: str = "all",
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool | None = None,
    **dataset_options: Unpack[DatasetOptions],
) -> pd.DataFrame:
    """Differential expression of every perturbation against its reference.

    Parameters
    ----------
    data
        AnnData, path to an ``.h5ad`` file, or a :class:`~scperteval.data.dataset.Dataset`.
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
    **dataset_options
        How to read the dataset: ``perturbation_key``, ``control_label``,
        ``covariate_key``, ``layer``, ``min_cells``, ``normalize``, ``subset``,
        ``backed``, ``chunk_cells``, and ``pool=True`` to read as one screen cells that an
        ``obs`` column splits into screens reusing the same labels (refused otherwise;
        see :class:`~scperteval.data.load.DatasetOptions`).

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
    check_option_types(out=out, progress=progress)
    for what, value, choices in (("reference", reference, REFERENCES), ("half", half, HALVES)):
        if value not in choices:
            raise SpecError(f"unknown {what} {value!r}; valid: {', '.join(choices)}")
    check_run_options(out=out, seed=seed, de_method=method)
    dataset, checksum = load_and_hash(data, timer, dataset_options, checksum=out is not None)
    with progress_bar("group statistics", dataset.n_cells, progress) as bar:
        context = Context(dataset, seed=seed, de_method=method, progress=cell_progress(bar))
        with timer.step("group_statistics"):
            context.group_stats  # noqa: B018 - computed here so the timing is separate
        with timer.step("differential_expression"):
            result = context.de(method=method, reference=reference, half=half)
    with timer.step("table"):
        table = result.to_frame()
    settings = {"method": method, "reference": reference, "half": half, "seed": seed}
    # What a later run needs to read this table back instead of recomputing it.
    table.attrs["scperteval_de"] = dict(settings)
    if out is None:
        return table
    assert checksum is not None
    with staged_output(out) as folder:
        with timer.step("write"):
            write_atomic(folder / "de.parquet", lambda p: table.to_parquet(p, index=False))
        write_run_json(
            folder / "run.json",
            "de",
            {**dataset.options(), **settings},
            input=dataset.source,
            input_checksum=checksum(),
            n_cells=dataset.n_cells,
            n_genes=dataset.n_genes,
            n_perturbations=len(dataset.conditions),
            left_out=[
                {"covariate": c.covariate, "perturbation": c.perturbation, "cells": n}
                for c, n in dataset.dropped
            ],
            timings_seconds=timer.timings(),
        )
    return table
