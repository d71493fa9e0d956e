"""Differential expression computed elsewhere, read instead of computed.

Two kinds of table are read:

- the output folder of ``scperteval de`` (``de.parquet`` and ``run.json``), whose
  run record says the method, reference, cell half and seed it was computed with;
- a cell-eval / pdex table with columns ``target``, ``feature``, ``p_value``,
  ``fdr``, ``log2_fold_change`` and ``statistic``: Wilcoxon tests of each target's
  cells against the control cells (method ``wilcoxon``, reference ``control``,
  all cells), one covariate group.

:func:`read_de_table` checks the table against the dataset (every perturbation
and every gene present, the same seed for a table of one half) and returns a
:class:`PrecomputedDE`, which builds the :class:`~scperteval.stats.diffexp.DEResult`
in the dataset's order once the group means (for the mean columns) are known.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scperteval.data.dataset import Condition
from scperteval.data.labels import listing
from scperteval.errors import DatasetError
from scperteval.stats.diffexp import DEResult

__all__ = ["CELL_EVAL_COLUMNS", "PrecomputedDE", "read_de_table"]

#: The columns of a cell-eval / pdex DE table that are read.
CELL_EVAL_COLUMNS = ("target", "feature", "p_value", "fdr", "log2_fold_change", "statistic")
_OWN_VALUES = ("statistic", "pvalue", "pvalue_adj", "log_fold_change")


@dataclass(frozen=True)
class PrecomputedDE:
    """A DE table aligned to a dataset's conditions and genes.

    Attributes
    ----------
    method, reference, half
        What the table holds: ``Context.de(method, reference, half)``.
    values
        ``statistic``, ``pvalue``, ``pvalue_adj``, ``log_fold_change`` (and, when the
        table has them, ``mean_target``, ``mean_reference``), each
        ``(n_conditions, n_genes)`` in the dataset's order.
    source
        Where the table came from, for the run record.

    """

    method: str
    reference: str
    half: str
    values: dict[str, np.ndarray]
    source: str

    def result(
        self, conditions: tuple[Condition, ...], genes: pd.Index, means: tuple[Any, Any]
    ) -> DEResult:
        """The table as a :class:`DEResult`; ``means`` fill mean columns it lacks."""
        mean_target = self.values.get("mean_target", means[0])
        mean_reference = self.values.get("mean_reference", means[1])
        return DEResult(
            conditions=conditions,
            genes=genes,
            statistic=self.values["statistic"],
            pvalue=self.values["pvalue"],
            pvalue_adj=self.values["pvalue_adj"],
            log_fold_change=self.values["log_fold_change"],
            mean_target=np.asarray(mean_target),
            mean_reference=np.asarray(mean_reference),
            method=self.method,
            reference=self.reference,
            half=self.half,
        )

    def record(self) -> dict[str, str]:
        """What ``run.json`` keeps about the table."""
        return {name: getattr(self, name) for name in ("source", "method", "reference", "half")}


def read_de_table(
    table: Any,
    conditions: Sequence[Condition],
    genes: pd.Index,
    control_label: str,
    seed: int,
) -> PrecomputedDE:
    """Read and check a precomputed DE table against a dataset.

    Parameters
    ----------
    table
        A ``scperteval de`` output folder (or its ``de.parquet``), a cell-eval /
        pdex table as a ``.csv``/``.parquet`` path, or a :class:`pandas.DataFrame`
        in either format (a DataFrame in scperteval's format needs
        ``attrs["scperteval_de"]`` with ``method``, ``reference``, ``half``, ``seed``, as
        :func:`scperteval.de` sets it).
    conditions
        The dataset's conditions, in order.
    genes
        The dataset's genes, in order.
    control_label
        The dataset's control label (control rows of a table are ignored).
    seed
        The run's seed: a table of one half must have been computed with it.

    Returns
    -------
    PrecomputedDE
        The table in the dataset's order.

    Raises
    ------
    DatasetError
        If the table cannot be read or does not match the dataset.

    """
    frame, options, source = _load(table)
    where = f"DE table {source}"
    if set(CELL_EVAL_COLUMNS) <= set(frame.columns):
        return _from_cell_eval(frame, conditions, genes, control_label, where, source)
    needed = {"covariate", "perturbation", "gene", *_OWN_VALUES}
    if not needed <= set(frame.columns):
        raise DatasetError(
            f"{where}: neither scperteval's columns ({', '.join(sorted(needed))}) nor "
            f"cell-eval's ({', '.join(CELL_EVAL_COLUMNS)}); it has "
            f"{listing([str(c) for c in frame.columns])}"
        )
    if options is None:
        raise DatasetError(
            f"{where}: a table in scperteval's format needs its run record (run.json of "
            "'scperteval de') to say its method, reference, half and seed"
        )
    half = str(options.get("half", "all"))
    if half != "all" and int(options.get("seed", 0)) != int(seed):
        raise DatasetError(
            f"{where}: computed on the {half} half with seed {options.get('seed')}, but this "
            f"run's halves use seed {seed}; recompute it with --seed {seed}"
        )
    keys = list(zip(frame["covariate"].astype(str), frame["perturbation"].astype(str), strict=True))
    rows = pd.MultiIndex.from_tuples(keys, names=["covariate", "perturbation"])
    columns = [*_OWN_VALUES, "mean_target", "mean_reference"]
    values = _pivot(frame, rows, frame["gene"].astype(str), columns, conditions, genes, where)
    return PrecomputedDE(
        method=str(options.get("method", "t-test")),
        reference=str(options.get("reference", "rest")),
        half=half,
        values=values,
        source=source,
    )


def _load(table: Any) -> tuple[pd.DataFrame, dict[str, Any] | None, str]:
    if isinstance(table, pd.DataFrame):
        options = table.attrs.get("scperteval_de")
        return table, dict(options) if options else None, "DataFrame"
    if not isinstance(table, (str, os.PathLike)):
        raise DatasetError(
            f"a DE table must be a path or a pandas DataFrame, got {type(table).__name__}"
        )
    path = Path(table)
    if path.is_dir():
        path = path / "de.parquet"
    if not path.exists():
        raise DatasetError(f"DE table {table}: not found")
    record = path.parent / "run.json"
    options = None
    if path.name == "de.parquet" and record.exists():
        options = json.loads(record.read_text(encoding="utf-8")).get("options")
    try:
        if path.suffix.lower() in (".csv", ".tsv"):
            separator = "\t" if path.suffix.lower() == ".tsv" else ","
            frame = pd.read_csv(path, sep=separator, float_precision="round_trip")
        else:
            frame = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure means unreadable input
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(f"DE table {path}: cannot read it ({reason})") from None
    return frame, options, str(path)


def _from_cell_eval(
    frame: pd.DataFrame,
    conditions: Sequence[Condition],
    genes: pd.Index,
    control_label: str,
    where: str,
    source: str,
) -> PrecomputedDE:
    covariates = {c.covariate for c in conditions}
    if len(covariates) > 1:
        raise DatasetError(
            f"{where}: a cell-eval table has no covariate column, but the data has "
            f"{len(covariates)} covariate groups; score one group at a time (--subset)"
        )
    covariate = next(iter(covariates)) if covariates else "all"
    frame = frame[frame["target"].astype(str) != control_label]
    rows = pd.MultiIndex.from_arrays(
        [np.full(len(frame), covariate, dtype=object), frame["target"].astype(str).to_numpy()],
        names=["covariate", "perturbation"],
    )
    renamed = frame.rename(
        columns={
            "p_value": "pvalue",
            "fdr": "pvalue_adj",
            "log2_fold_change": "log_fold_change",
        }
    )
    values = _pivot(
        renamed, rows, renamed["feature"].astype(str), list(_OWN_VALUES), conditions, genes, where
    )
    return PrecomputedDE(
        method="wilcoxon", reference="control", half="all", values=values, source=source
    )


def _pivot(
    frame: pd.DataFrame,
    rows: pd.MultiIndex,
    gene_labels: pd.Series,
    columns: list[str],
    conditions: Sequence[Condition],
    genes: pd.Index,
    where: str,
) -> dict[str, np.ndarray]:
    """Each value column as a conditions x genes array in the dataset's order."""
    wanted = pd.MultiIndex.from_tuples(
        [(c.covariate, c.perturbation) for c in conditions], names=["covariate", "perturbation"]
    )
    present = set(rows.tolist())
    missing = [
        p if c == "all" else f"{p} ({c})" for c, p in wanted.tolist() if (c, p) not in present
    ]
    if missing:
        raise DatasetError(
            f"{where}: {len(missing)} perturbation(s) of the data missing: {listing(missing)}"
        )
    missing_genes = genes.difference(pd.Index(gene_labels.unique()))
    if len(missing_genes):
        raise DatasetError(
            f"{where}: {len(missing_genes)} gene(s) of the data missing: "
            f"{listing(missing_genes.tolist())}"
        )
    condition_index = wanted.get_indexer(rows)
    gene_index = genes.get_indexer(gene_labels)
    keep = (condition_index >= 0) & (gene_index >= 0)
    pairs = condition_index[keep] * len(genes) + gene_index[keep]
    if np.unique(pairs).size != pairs.size:
        raise DatasetError(f"{where}: a (perturbation, gene) pair appears more than once")
    if pairs.size != len(wanted) * len(genes):
        raise DatasetError(f"{where}: some (perturbation, gene) pairs are missing")
    values = {}
    for column in columns:
        if column not in frame.columns:
            continue
        out = np.empty(len(wanted) * len(genes))
        out[pairs] = frame[column].to_numpy(dtype=np.float64)[keep]
        values[column] = out.reshape(len(wanted), len(genes))
    return values
