"""``scperteval.calibrate``: find which protocols can be trusted on a dataset."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

import pandas as pd

from scperteval.data.load import DatasetOptions
from scperteval.engine.calibrators import Thresholds, calibration_table, verdict_reasons
from scperteval.engine.engine import DEFAULT_SAMPLE_CELLS
from scperteval.engine.failures import failure_counts, failure_lines
from scperteval.engine.population_cap import DEFAULT_MAX_POPULATION_CELLS, NO_CAP
from scperteval.outputs import staged_output
from scperteval.runinfo import Timer, write_run_json, write_tables
from scperteval.scoring.trust import MIN_PERTURBATIONS, apply_evidence
from scperteval.scoring.verdict_changes import verdict_change_lines, verdict_changes
from scperteval.splits.reading import read_split
from scperteval.splits.table import split_record
from scperteval.workflows.option_types import (
    as_thresholds,
    check_option_types,
    refuse_de_tables_under_split,
)
from scperteval.workflows.steps import (
    check_job_options,
    check_min_perturbations,
    open_engine,
    protocol_table,
    run_protocol_tasks,
    run_summary,
)

__all__ = ["calibrate", "CalibrationResult"]


@dataclass
class CalibrationResult:
    """Controls' scores and the calibration verdict of every protocol.

    Attributes
    ----------
    results
        Tidy per-perturbation values: ``covariate, perturbation, protocol,
        source, source_name, value, reason``.
    calibration
        ``protocol, covariate, n, drf_mean, drf_median, bds, trusted, n_skipped,
        n_negative`` (covariate ``all``: overall).
    protocols
        Description of each protocol (metric, space, controls...).
    thresholds
        Thresholds of the ``trusted`` verdict.
    info
        Run information (dataset, options, timings, failures).
    min_perturbations
        Fewest perturbations with both controls defined a protocol needs to be
        trusted (the rule ``score`` and ``report`` apply, see
        :mod:`scperteval.scoring.trust`).
    unsplit_calibration
        Under a split, the calibration of the same data without it (same columns as
        ``calibration``); empty otherwise.
    verdict_changes
        Under a split, each protocol's overall verdict beside the unsplit one
        (:func:`~scperteval.scoring.verdict_changes.verdict_changes`); empty otherwise.

    """

    results: pd.DataFrame
    calibration: pd.DataFrame
    protocols: pd.DataFrame
    thresholds: Thresholds
    info: dict[str, Any] = field(default_factory=dict)
    min_perturbations: int = MIN_PERTURBATIONS
    unsplit_calibration: pd.DataFrame = field(default_factory=pd.DataFrame)
    verdict_changes: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def n_failed(self) -> int:
        """Number of (perturbation, protocol, source) values that are NaN."""
        return int(self.results["value"].isna().sum())

    def overall(self) -> pd.DataFrame:
        """One row per protocol: the overall calibration with the reason when untrusted."""
        # The evidence rule is applied here too, so a table built without it (by
        # calibration_table alone) gets the verdict score and report give.
        calibration, reasons = apply_evidence(
            self.calibration,
            verdict_reasons(self.calibration, self.thresholds),
            self.min_perturbations,
        )
        table = calibration[calibration["covariate"] == "all"].drop(columns="covariate")
        table = table.assign(reason=table["protocol"].map(reasons))
        return table.reset_index(drop=True)

    def trusted_protocols(self) -> list[str]:
        """Names of the protocols trusted overall."""
        overall = self.overall()
        return overall.loc[overall["trusted"], "protocol"].tolist()

    def summary(self, failures_file: str = "failures.csv") -> str:
        """Readable table for the terminal.

        Parameters
        ----------
        failures_file
            Where the NaN values' counts are written (named in the last line).

        Returns
        -------
        str
            One line per protocol, the thresholds and the count of NaN values.

        """
        table = self.overall()
        lines = [
            f"{'protocol':<34} {'n':>4} {'DRF mean':>9} {'DRF med':>8} {'BDS':>6}  verdict",
        ]
        for row in table.itertuples():
            verdict = "trusted" if row.trusted else f"not trusted ({row.reason})"
            lines.append(
                f"{row.protocol:<34} {row.n:>4} {row.drf_mean:>9.3f} {row.drf_median:>8.3f} "
                f"{row.bds:>6.2f}  {verdict}"
            )
        lines.append(
            f"thresholds: BDS >= {self.thresholds.bds_min}, DRF {self.thresholds.drf_statistic} "
            f">= {self.thresholds.drf_min}; {len(self.trusted_protocols())} of {len(table)} trusted"
        )
        if not self.verdict_changes.empty:
            lines.extend(verdict_change_lines(self.verdict_changes))
        lines.extend(failure_lines(self.results, failures_file))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return str(self.overall().style.format(precision=3).to_html())

    def write(self, folder: str | Path) -> None:
        """Write the tables atomically.

        ``results.parquet``, ``calibration.csv``, ``protocols.csv`` and
        ``failures.csv`` (NaN values counted by protocol, candidate and reason);
        under a split also ``calibration_unsplit.csv`` and ``verdict_changes.csv``.
        """
        tables = {
            "results.parquet": self.results,
            "calibration.csv": self.calibration,
            "protocols.csv": self.protocols,
            "failures.csv": failure_counts(self.results),
        }
        if not self.verdict_changes.empty:
            tables["calibration_unsplit.csv"] = self.unsplit_calibration
            tables["verdict_changes.csv"] = self.verdict_changes
        write_tables(Path(folder), tables)


def calibrate(
    data: Any,
    protocols: Any = "default",
    *,
    seed: int = 0,
    de_method: str = "t-test",
    workers: int | None = None,
    executor: Any = None,
    thresholds: Thresholds | None = None,
    sample_cells: int = DEFAULT_SAMPLE_CELLS,
    max_population_cells: int | str | None = DEFAULT_MAX_POPULATION_CELLS,
    device: str | None = None,
    precision: str = "float64",
    de_tables: Any = (),
    out: str | Path | None = None,
    progress: bool | None = None,
    min_perturbations: int = MIN_PERTURBATIONS,
    split: Any = None,
    **dataset_options: Unpack[DatasetOptions],
) -> CalibrationResult:
    """Score each protocol's positive and negative controls and judge its calibration.

    Parameters
    ----------
    data
        AnnData, path to an ``.h5ad`` file, or a :class:`~scperteval.data.dataset.Dataset`.
    protocols
        A suite name (``default``, ``miller2025``, ``ahlmann_eltze2025``,
        ``vcc2025``), a path to a TOML suite, comma-separated protocol names
        (``"pearson_delta_ctrl,mse_top_k=30"``) or a list of names / protocols.
    seed
        Seed of the truth halves and cell samples.
    de_method
        DE method behind top-k spaces, DEG weights and DE protocols.
    workers
        Threads used when no ``executor`` is given; by default the CPU cores this
        process may use (at most 8). Values do not depend on it, bit for bit (shared
        spaces such as PCA are fitted before the tasks start).
    executor
        Any :class:`concurrent.futures.Executor` to run the tasks on, or a
        :class:`distributed.Client`: then the group statistics and the tasks are
        computed on the cluster's workers, with identical results (see
        :doc:`/distributed`).
    thresholds
        Trust thresholds (default BDS >= 0.75 and median DRF >= 0.2): a
        :class:`~scperteval.Thresholds` or a mapping of its fields.
    sample_cells
        Cap on the perturbed-cell and control-cell samples (at least 2).
    max_population_cells
        Cells each population protocol (energy distance, MMD, Sinkhorn) uses of each
        population at most (default 2000), drawn by a rule seeded by ``seed`` and the
        population's names (see :mod:`~scperteval.engine.population_cap`); ``None``
        or ``"all"`` uses every cell. Smaller populations are used whole.
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
        Folder for ``results.parquet``, ``calibration.csv``, ``protocols.csv``
        and ``run.json``.
    progress
        Show progress bars (default: when stderr is a terminal).
    min_perturbations
        Fewest perturbations with both controls defined a protocol needs to be
        trusted (default 10, the rule of ``score`` and ``report``; see
        :mod:`scperteval.scoring.trust` for why 10).
    split
        Calibrate under a split (a :class:`~scperteval.splits.split.Split`, a split
        table or its path, see :func:`~scperteval.splits.reading.read_split`): only
        held-out perturbations are scored and the negative controls pool each fold's
        training perturbations. The same run also calibrates the data without the
        split (sharing the truth's statistics) and reports which verdicts change
        (``verdict_changes``). ``None`` (default): no split.
    **dataset_options
        How to read the dataset: ``perturbation_key``, ``control_label``,
        ``covariate_key``, ``layer``, ``min_cells``, ``normalize``, ``subset``,
        ``backed``, ``chunk_cells``, and ``pool=True`` to read as one screen cells that an
        ``obs`` column splits into screens reusing the same labels (refused otherwise;
        see :class:`~scperteval.data.load.DatasetOptions`).

    Returns
    -------
    CalibrationResult
        Tables of per-perturbation values and calibration.

    """
    check_option_types(out=out, sample_cells=sample_cells, progress=progress)
    timer = Timer()
    thresholds = as_thresholds(thresholds)
    check_min_perturbations(min_perturbations)
    # Options both the checks and the engine take.
    shared = {"seed": seed, "de_method": de_method, "device": device, "precision": precision}
    chosen, workers, cap = check_job_options(
        protocols, out=out, workers=workers, max_population_cells=max_population_cells, **shared
    )
    refuse_de_tables_under_split(split, de_tables)
    # Only a run written to a folder records the checksum.
    engine, checksum = open_engine(
        data,
        timer,
        dataset_options,
        checksum=out is not None,
        truth="half",
        sample_cells=sample_cells,
        de_tables=de_tables,
        max_population_cells=cap,
        **shared,
    )
    unsplit = None
    if split is not None:
        # The twin is made before the split is set, and shares the context.
        # Imported here: scoring under a split needs scipy.stats, a plain run does not.
        from scperteval.workflows.split_scoring import unsplit_twin

        unsplit = unsplit_twin(engine)
        engine.use_split(read_split(split, engine.context.dataset))
    results = run_protocol_tasks(
        engine, chosen, timer, workers=workers, executor=executor, progress=progress
    )
    meta = {p.name: {"better": p.better, "perfect": p.perfect} for p in chosen}
    with timer.step("calibration"):
        table, _ = apply_evidence(
            calibration_table(results, meta, thresholds), {}, min_perturbations
        )
    info = {**run_summary(engine, results), "timings_seconds": timer.seconds}
    result = CalibrationResult(
        results, table, protocol_table(chosen), thresholds, info, min_perturbations
    )
    if unsplit is not None:
        unsplit_results = run_protocol_tasks(
            unsplit, chosen, timer, workers=workers, executor=executor, progress=progress
        )
        with timer.step("calibration"):
            result.unsplit_calibration = calibration_table(unsplit_results, meta, thresholds)
            result.verdict_changes = verdict_changes(
                table, result.unsplit_calibration, thresholds, min_perturbations
            )
        assert engine.folds is not None
        changed = result.verdict_changes["changed"]
        info["split"] = {
            **(split_record(engine.folds.split) or {}),
            "scored_perturbations": int(engine.folds.scored().size),
            "verdict_changes": result.verdict_changes.loc[changed, "protocol"].tolist(),
        }
    if out is None:
        return result
    assert checksum is not None
    with staged_output(out) as folder:
        with timer.step("write"):
            result.write(folder)
        info["timings_seconds"] = timer.timings()
        options = {
            "protocols": [p.name for p in chosen],
            **engine.context.dataset.options(),
            "seed": seed,
            "de_method": de_method,
            "workers": workers,
            "sample_cells": sample_cells,
            "max_population_cells": NO_CAP if cap is None else cap,
            "pair_backend": engine.pairs.name,
            "thresholds": thresholds.as_dict(),
            "min_perturbations": min_perturbations,
        }
        write_run_json(
            folder / "run.json",
            "calibrate",
            options,
            input_checksum=checksum(),
            **{k: v for k, v in info.items() if k != "input"},
            input=engine.context.dataset.source,
        )
    return result
