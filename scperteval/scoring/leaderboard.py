"""Leaderboards: models and baselines ranked on the protocols that can be trusted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

__all__ = ["Leaderboard", "build_leaderboard"]


@dataclass
class Leaderboard:
    """One row per model and baseline, one column per protocol.

    Attributes
    ----------
    table
        Columns ``model, kind, score, rank`` then one per protocol. In calibrated
        mode a protocol column is the model's aggregate (mean or median over
        perturbations) calibrated score, and ``score`` averages the trusted
        protocols' columns (higher is better). In plain mode (truth = all cells)
        protocol columns are aggregate raw values and ``score`` is the mean rank
        over protocols (lower is better).
    trusted
        Protocols the overall score uses.
    excluded
        Protocols left out of the score, with the reason.
    better
        Direction of each protocol column (``higher`` in calibrated mode).
    aggregate
        ``mean`` or ``median``.
    calibrated
        Whether the table holds calibrated scores.

    """

    table: pd.DataFrame
    trusted: list[str]
    excluded: dict[str, str]
    better: dict[str, str]
    aggregate: str = "median"
    calibrated: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def protocols(self) -> list[str]:
        """Protocol columns, in order."""
        return [c for c in self.table.columns if c not in ("model", "kind", "score", "rank")]

    def best_per_column(self) -> dict[str, float]:
        """Best value of each numeric column (by its direction)."""
        best: dict[str, float] = {}
        for column in ["score", *self.protocols]:
            values = self.table[column].to_numpy(dtype=np.float64)
            if not np.isfinite(values).any():
                continue
            direction = (
                "higher"
                if column == "score" and self.calibrated
                else self.better.get(column, "higher")
            )
            if column == "score" and not self.calibrated:
                direction = "lower"
            best[column] = float(np.nanmax(values) if direction == "higher" else np.nanmin(values))
        return best

    def _repr_html_(self) -> str:
        styled = self.table.style.format(precision=3, na_rep="–").hide(axis="index")
        for column, value in self.best_per_column().items():
            styled = styled.apply(
                lambda s, v=value: ["font-weight: bold" if x == v else "" for x in s],
                subset=[column],
            )
        caption = (
            f"score = {self.aggregate} calibrated score over {len(self.trusted)} trusted protocols"
            if self.calibrated
            else "score = mean rank over protocols (plain scores on all truth cells)"
        )
        return str(styled.set_caption(caption).to_html())

    def __repr__(self) -> str:
        return self.table.to_string(index=False, float_format=lambda v: f"{v:.3f}")


def build_leaderboard(
    aggregates: pd.DataFrame,
    protocols: Sequence[str],
    better: Mapping[str, str],
    trusted: Sequence[str],
    excluded: Mapping[str, str],
    aggregate: str = "median",
    calibrated: bool = True,
) -> Leaderboard:
    """Assemble a leaderboard from per-protocol aggregates.

    Parameters
    ----------
    aggregates
        Output of :func:`scperteval.scoring.calibrated.aggregate` restricted to
        models and baselines.
    protocols
        Protocol columns, in order.
    better
        Direction of each protocol's raw metric.
    trusted, excluded
        Protocols used by the score, and the others with the reason.
    aggregate
        ``mean`` or ``median``.
    calibrated
        Whether ``aggregates`` summarise calibrated scores.

    """
    if aggregate not in ("mean", "median"):
        raise ValueError(f"aggregate must be 'mean' or 'median', got {aggregate!r}")
    entries = aggregates[["source", "source_name"]].drop_duplicates()
    kinds = dict(zip(entries["source_name"], entries["source"], strict=True))
    wide = aggregates.pivot_table(
        index="source_name", columns="protocol", values=aggregate, aggfunc="first", dropna=False
    )
    wide = wide.reindex(columns=list(protocols))
    table = pd.DataFrame({"model": wide.index, "kind": [kinds[n] for n in wide.index]})
    for protocol in protocols:
        table[protocol] = wide[protocol].to_numpy()
    directions = {p: ("higher" if calibrated else better.get(p, "higher")) for p in protocols}
    if calibrated:
        used = [p for p in protocols if p in trusted]
        score = (
            table[used].mean(axis=1, skipna=True) if used else pd.Series(np.nan, index=table.index)
        )
        table.insert(2, "score", score.to_numpy())
        order = table["score"].rank(ascending=False, method="min")
    else:
        ranks = pd.DataFrame(
            {
                p: table[p].rank(ascending=directions[p] == "lower", method="average")
                for p in protocols
            }
        )
        table.insert(2, "score", ranks.mean(axis=1, skipna=True).to_numpy())
        order = table["score"].rank(ascending=True, method="min")
    table.insert(3, "rank", order.to_numpy())
    table["rank"] = table["rank"].astype("Int64")
    table = table.sort_values(["rank", "model"], na_position="last").reset_index(drop=True)
    return Leaderboard(
        table=table,
        trusted=list(trusted),
        excluded=dict(excluded),
        better={p: directions[p] for p in protocols},
        aggregate=aggregate,
        calibrated=calibrated,
    )
