"""Models across datasets: one summary row per entry, one score column per dataset.

From the leaderboards of runs on different datasets (each re-derived on its
own: its own trusted protocols, controls and coverage), :func:`across_datasets`
builds

- the **wide** table: ``model, kind``, one column per dataset holding the
  entry's headline score there, then ``mean_rank`` (the mean over the datasets
  where the entry is ranked of its rank there), ``win_rate`` (over every
  dataset and every other entry scored on it, the fraction of comparisons the
  entry's score is higher, ties counting one half) and ``n_datasets``;
- the **long** table: per entry and dataset, the score, its 95% CI, rank,
  listing and flags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scperteval.scoring.leaderboard import HEADLINE_COLUMNS, OPTIONAL_COLUMNS

__all__ = ["AcrossDatasets", "across_datasets", "dataset_label"]

#: Each dataset's headline columns (the optional ones aside), with the dataset after the kind.
LONG_COLUMNS = (
    "model",
    "kind",
    "dataset",
    *(c for c in HEADLINE_COLUMNS[2:] if c not in OPTIONAL_COLUMNS),
)


def dataset_label(info: Mapping[str, Any]) -> str:
    """A short name for a run's dataset: the file's stem and its subset, if any.

    Examples
    --------
    >>> dataset_label({"input": "/d/devel.h5ad", "dataset_options": {"subset": {"dataset": ["x"]}}})
    'devel[dataset=x]'

    """
    name = Path(str(info.get("input", "data"))).stem or "data"
    subset = (info.get("dataset_options") or {}).get("subset") or {}
    if subset:
        listed = {k: v if isinstance(v, list | tuple) else [v] for k, v in subset.items()}
        name += "[" + ",".join(f"{k}={'|'.join(map(str, v))}" for k, v in listed.items()) + "]"
    return name


@dataclass
class AcrossDatasets:
    """Entries summarised over datasets.

    Attributes
    ----------
    table
        The wide table (see the module docstring).
    long
        One row per entry and dataset.
    datasets
        Dataset labels, in column order.
    definitions
        Per dataset, the sentence defining its headline score.
    results
        Per dataset, the re-derived :class:`~scperteval.scoring.result.ScoreResult`.

    """

    table: pd.DataFrame
    long: pd.DataFrame
    datasets: list[str]
    definitions: dict[str, str] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return self.table.to_string(index=False, float_format=lambda v: f"{v:.3g}")


def _win_rate(scores: pd.DataFrame) -> pd.Series:
    """Per entry (row): share of (dataset, other entry) comparisons won, ties one half."""
    wins = pd.Series(0.0, index=scores.index)
    counts = pd.Series(0, index=scores.index)
    for dataset in scores.columns:
        column = scores[dataset].dropna()
        values = column.to_numpy(dtype=np.float64)
        if values.size < 2:
            continue
        greater = (values[:, None] > values[None, :]).sum(axis=1)
        ties = (values[:, None] == values[None, :]).sum(axis=1) - 1
        wins[column.index] += greater + 0.5 * ties
        counts[column.index] += values.size - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return (wins / counts.replace(0, np.nan)).astype(np.float64)


def across_datasets(
    results: Mapping[str, Any], order: Sequence[str] | None = None
) -> AcrossDatasets:
    """Summarise entries over the leaderboards of several datasets.

    Parameters
    ----------
    results
        Dataset label to the :class:`~scperteval.scoring.result.ScoreResult`
        re-derived on that dataset.
    order
        Dataset column order (default: as given).

    Returns
    -------
    AcrossDatasets
        The wide and long tables.

    """
    datasets = list(order) if order is not None else list(results)
    frames = [results[label].leaderboard.headline.assign(dataset=label) for label in datasets]
    long = pd.concat(frames, ignore_index=True)[list(LONG_COLUMNS)]
    kinds = long.drop_duplicates("model").set_index("model")["kind"]
    scores = long.pivot_table(
        index="model", columns="dataset", values="score", aggfunc="first", dropna=False
    ).reindex(columns=datasets)
    # Only ranks among full-coverage entries count; a rank on partial coverage does not.
    ranked = long.assign(rank=long["rank"].where(long["listing"] == "ranked"))
    ranks = ranked.pivot_table(
        index="model", columns="dataset", values="rank", aggfunc="first", dropna=False
    ).reindex(index=scores.index, columns=datasets)
    table = pd.DataFrame({"model": scores.index, "kind": kinds.reindex(scores.index).to_numpy()})
    for label in datasets:
        table[label] = scores[label].to_numpy(dtype=np.float64)
    table["mean_rank"] = ranks.astype(np.float64).mean(axis=1, skipna=True).to_numpy()
    table["win_rate"] = _win_rate(scores).to_numpy()
    table["n_datasets"] = scores.notna().sum(axis=1).to_numpy()
    table = table.sort_values(
        ["mean_rank", "win_rate", "model"], ascending=[True, False, True], na_position="last"
    ).reset_index(drop=True)
    definitions = {label: results[label].leaderboard.definition for label in datasets}
    return AcrossDatasets(table, long, datasets, definitions, dict(results))
