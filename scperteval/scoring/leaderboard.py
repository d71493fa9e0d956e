"""Leaderboards: models and baselines ranked on the protocols that can be trusted.

Like is compared with like: the entries that cover every perturbation and every
trusted protocol that any entry covers are ranked; an entry covering fewer
(``additive`` scores combinations only, a pseudobulk prediction has no
population protocols, a model with missing perturbations) is listed apart,
below them, with its score on what it covers and the rank it would take among
the ranked entries on that coverage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scperteval.scoring.headline import (
    finite_aggregate,
    headline_ci,
    headline_matrix,
    headline_score,
    score_definition,
)

__all__ = ["Leaderboard", "build_leaderboard", "HEADLINE_COLUMNS", "RANKED", "APART"]

HEADLINE_COLUMNS = (
    "model",
    "kind",
    "score",
    "ci_low",
    "ci_high",
    "rank",
    "perturbations",
    "protocols",
    "listing",
    "flags",
    "vcc_score",
)
RANKED = "ranked"
APART = "listed apart"
NO_FLAGS = "none"


@dataclass
class Leaderboard:
    """One row per model and baseline: the headline columns, then one column per protocol.

    Attributes
    ----------
    table
        Columns ``model, kind, score, ci_low, ci_high, rank, perturbations,
        protocols, listing, flags`` then one per protocol. In calibrated mode a
        protocol column is the entry's aggregate (median or mean over
        perturbations) calibrated score and ``score`` is the median of the
        trusted protocols' columns (see :attr:`definition`), with its 95%
        bootstrap interval ``ci_low``-``ci_high``. ``perturbations`` and
        ``protocols`` read ``covered/total``; ``listing`` is ``ranked`` or
        ``listed apart`` (partial coverage, no rank). In plain mode (truth =
        all cells) protocol columns are aggregate raw values and ``score`` is
        the mean rank over protocols (lower is better). A run of the Virtual Cell
        Challenge's terms adds ``vcc_score`` (see :mod:`scperteval.scoring.vcc`).
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
    notes
        Sentences shown under the table.
    verdicts
        One sentence per protocol saying whether it is trusted and why.
    flags
        Per entry, the sanity flags raised on its predictions.

    """

    table: pd.DataFrame
    trusted: list[str]
    excluded: dict[str, str]
    better: dict[str, str]
    aggregate: str = "median"
    calibrated: bool = True
    notes: list[str] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)
    flags: dict[str, list[str]] = field(default_factory=dict)

    @property
    def definition(self) -> str:
        """The sentence defining ``score``, the same in every output."""
        return score_definition(self.aggregate, len(self.trusted), self.calibrated)

    @property
    def protocols(self) -> list[str]:
        """Protocol columns, in order."""
        return [c for c in self.table.columns if c not in HEADLINE_COLUMNS]

    @property
    def headline(self) -> pd.DataFrame:
        """The compact table: the headline columns only (what ``leaderboard.csv`` holds)."""
        return self.table[[c for c in HEADLINE_COLUMNS if c in self.table.columns]]

    def best_per_column(self) -> dict[str, float]:
        """Best value of each numeric column (by its direction), among ranked unflagged entries.

        An entry listed apart, or one whose predictions raised a sanity flag (mode
        collapse, leakage), is never marked best; when no entry qualifies, all count.
        """
        best: dict[str, float] = {}
        frame = self.table
        if "listing" in frame:
            chosen = (frame["listing"] == RANKED) & (frame["flags"] == NO_FLAGS)
            frame = frame[chosen] if chosen.any() else frame
        extra = [c for c in ("vcc_score",) if c in frame.columns]
        for column in ["score", *extra, *self.protocols]:
            values = frame[column].to_numpy(dtype=np.float64)
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
        styled = self.headline.style.format(precision=3, na_rep="–").hide(axis="index")
        return str(styled.set_caption(self.definition).to_html())

    def __repr__(self) -> str:
        return self.headline.to_string(index=False, float_format=lambda v: f"{v:.3g}")


def _coverage(
    entries: pd.DataFrame | None, names: Sequence[str], trusted: Sequence[str], column: str
) -> tuple[dict[str, int], dict[str, int], int, int]:
    """Perturbations and trusted protocols with a value, per entry, and the largest counts."""
    perturbations = {name: 0 for name in names}
    protocols = {name: 0 for name in names}
    if entries is None or entries.empty or not trusted:
        return perturbations, protocols, 0, 0
    part = entries[entries["protocol"].isin(list(trusted))]
    part = part[np.isfinite(part[column].to_numpy(dtype=np.float64))]
    total_perturbations = len(part[["covariate", "perturbation"]].drop_duplicates())
    for name, frame in part.groupby("source_name", observed=True):
        perturbations[str(name)] = len(frame[["covariate", "perturbation"]].drop_duplicates())
        protocols[str(name)] = int(frame["protocol"].nunique())
    return perturbations, protocols, total_perturbations, len(trusted)


def _apart_text(
    name: str,
    value: float,
    ranked: Sequence[str],
    matrices: Mapping[str, pd.DataFrame],
    aggregate: str,
) -> str:
    """``listed apart``, with the entry's place among the ranked ones on its own coverage."""
    own = matrices.get(name)
    if own is None or not np.isfinite(value) or not ranked:
        return APART
    finite = np.isfinite(own.to_numpy(dtype=np.float64))
    rows = own.index[finite.any(axis=1)]
    columns = own.columns[finite.any(axis=0)]
    better = 0
    for other in ranked:
        matrix = matrices[other].reindex(index=rows, columns=columns).to_numpy(dtype=np.float64)
        with np.errstate(all="ignore"):
            columns_values = _nan_aggregate(matrix, aggregate) if matrix.size else np.array([])
        better += int(headline_score(columns_values) > value)
    return f"{APART}; rank {better + 1} of {len(ranked) + 1} on its coverage"


def _apart_rank(listing: str) -> float | None:
    """The rank on its coverage written in an entry's ``listing`` (None when ranked)."""
    if listing == RANKED:
        return None
    _, found, rest = listing.partition("; rank ")
    return float(rest.split(" ")[0]) if found else float("nan")


def _nan_aggregate(matrix: np.ndarray, aggregate: str) -> np.ndarray:
    return np.array([finite_aggregate(matrix[:, j], aggregate) for j in range(matrix.shape[1])])


def build_leaderboard(
    aggregates: pd.DataFrame,
    protocols: Sequence[str],
    better: Mapping[str, str],
    trusted: Sequence[str],
    excluded: Mapping[str, str],
    aggregate: str = "median",
    calibrated: bool = True,
    entries: pd.DataFrame | None = None,
    seed: int = 0,
    flags: Mapping[str, Sequence[str]] | None = None,
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
    entries
        The models' and baselines' tidy per-perturbation rows (with
        ``calibrated``): coverage and the bootstrap interval come from them.
        Without them every entry is ranked and the interval is NaN.
    seed
        Seed of the bootstrap interval.
    flags
        Per entry, the sanity flags to show.

    """
    if aggregate not in ("mean", "median"):
        raise ValueError(f"aggregate must be 'mean' or 'median', got {aggregate!r}")
    flag_lists: dict[str, list[str]] = {str(k): list(v) for k, v in (flags or {}).items()}
    kinds_frame = aggregates[["source", "source_name"]].drop_duplicates()
    kinds = dict(zip(kinds_frame["source_name"], kinds_frame["source"], strict=True))
    wide = aggregates.pivot_table(
        index="source_name", columns="protocol", values=aggregate, aggfunc="first", dropna=False
    )
    wide = wide.reindex(columns=list(protocols))
    names = [str(n) for n in wide.index]
    table = pd.DataFrame({"model": names, "kind": [kinds[n] for n in wide.index]})
    directions = {p: ("higher" if calibrated else better.get(p, "higher")) for p in protocols}
    used = [p for p in protocols if p in trusted]
    value_column = "calibrated" if calibrated else "value"
    covered, scored, n_perturbations, n_protocols = _coverage(entries, names, used, value_column)
    matrices = (
        {n: headline_matrix(entries, n, used) for n in names}
        if calibrated and entries is not None and used
        else {}
    )
    if calibrated:
        score = np.array([headline_score(wide.loc[n, used].to_numpy()) for n in names])
        intervals = [
            headline_ci(matrices[n].to_numpy(), aggregate, seed) if n in matrices else (np.nan,) * 2
            for n in names
        ]
    else:
        ranks = pd.DataFrame(
            {
                p: wide[p].rank(ascending=directions[p] == "lower", method="average")
                for p in protocols
            }
        )
        score = ranks.mean(axis=1, skipna=True).to_numpy()
        intervals = [(np.nan, np.nan)] * len(names)
    full = [
        entries is None or (covered[n] == n_perturbations and scored[n] == n_protocols)
        for n in names
    ]
    listing = [
        RANKED
        if is_full
        else _apart_text(
            name, value, [m for m, f in zip(names, full, strict=True) if f], matrices, aggregate
        )
        for name, value, is_full in zip(names, score, full, strict=True)
    ]
    table["score"] = score
    table["ci_low"] = [low for low, _ in intervals]
    table["ci_high"] = [high for _, high in intervals]
    ranked = pd.Series(np.where(full, score, np.nan))
    order = ranked.rank(ascending=not calibrated, method="min")
    # An entry listed apart takes the rank it would have among the ranked ones on its
    # own coverage, so every scored row has a rank; `listing` says which kind it is.
    apart_ranks = [_apart_rank(text) for text in listing]
    order = pd.Series([r if r is not None else o for r, o in zip(apart_ranks, order, strict=True)])
    table["rank"] = pd.array(order.to_numpy(dtype=np.float64), dtype="Int64")
    table["perturbations"] = [f"{covered[n]}/{n_perturbations}" for n in names]
    table["protocols"] = [f"{scored[n]}/{n_protocols}" for n in names]
    table["listing"] = listing
    # The table names each flag; the sentences with the evidence go under it.
    table["flags"] = [
        "; ".join(f.partition(":")[0] for f in flag_lists.get(n, [])) or NO_FLAGS for n in names
    ]
    for protocol in protocols:
        table[protocol] = wide[protocol].to_numpy()
    # Ranked entries first by rank; those listed apart below, best score first.
    sort_score = -table["score"] if calibrated else table["score"]
    table = (
        table.assign(_apart=table["listing"] != RANKED, _score=sort_score)
        .sort_values(["_apart", "_score", "model"], na_position="last")
        .drop(columns=["_apart", "_score"])
        .reset_index(drop=True)
    )
    notes = []
    apart = table.loc[table["listing"] != RANKED, "model"].tolist()
    if apart:
        notes.append(
            "Listed apart, not ranked among the others (they cover fewer than the "
            f"{n_perturbations} perturbations or {n_protocols} trusted protocols of the ranked "
            f"entries; their score is over what they cover): {', '.join(map(str, apart))}. "
            "'rank k of m on "
            "its coverage': its place among the ranked entries when those are scored on the "
            "same perturbations and protocols."
        )
    return Leaderboard(
        table=table,
        trusted=list(trusted),
        excluded=dict(excluded),
        better={p: directions[p] for p in protocols},
        aggregate=aggregate,
        calibrated=calibrated,
        notes=notes,
        flags=flag_lists,
    )
