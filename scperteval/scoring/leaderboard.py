"""Leaderboards: models and baselines ranked on the protocols that can be trusted.

Like is compared with like: the ranked entries are those that cover the
ranking coverage (the trusted protocols every user model covers, over the
perturbations they all cover; see :mod:`scperteval.scoring.ranking`), and their
``score`` is computed on exactly that coverage. An entry covering less
(``additive`` scores combinations only, ``linear`` may have no values) is
listed apart, below them, with its score on what it covers and the rank it
would take among the ranked entries on that coverage. Cell-level models get a
second ranking (``population_score``, ``population_rank``) on the population
protocols they cover, when the first leaves those out. Ties share a rank
(competition ranking, 1, 1, 3). :attr:`Leaderboard.ranking` is the sentence
saying what the ranking uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scperteval.scoring.headline import headline_ci, headline_matrix, score_definition
from scperteval.scoring.ranking import (
    TIE_RULE,
    Coverage,
    competition_ranks,
    covers,
    entry_coverage,
    ranking_coverage,
    restricted,
    scores_on,
)

__all__ = [
    "Leaderboard",
    "build_leaderboard",
    "ranking_sentence",
    "HEADLINE_COLUMNS",
    "OPTIONAL_COLUMNS",
    "RANKED",
    "APART",
]

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
    "vcc_terms_as_zero",
    "population_score",
    "population_rank",
)
#: Headline columns present only in some runs (the VCC terms, the second ranking).
OPTIONAL_COLUMNS = ("vcc_score", "vcc_terms_as_zero", "population_score", "population_rank")
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
        ``listed apart`` (partial coverage: ``rank`` is then its place on its own
        coverage). In plain mode (truth = all cells) protocol columns are
        aggregate raw values and ``score`` is the mean share of the other ranked
        entries it beats per protocol (higher is better, as in calibrated mode). A
        run of the Virtual Cell Challenge's terms adds ``vcc_score`` (see
        :mod:`scperteval.scoring.vcc`); a second ranking of cell-level models adds
        ``population_score`` and ``population_rank``.
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
    ranking
        The sentence saying which protocols and perturbations the ranks use.
    ranked_protocols
        The protocols the ranked entries' ``score`` uses.
    population_protocols
        The protocols of the second ranking (empty when there is none).

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
    ranking: str = ""
    ranked_protocols: list[str] | None = None
    population_protocols: list[str] = field(default_factory=list)

    @property
    def definition(self) -> str:
        """The sentence defining ``score``, the same in every output."""
        used = self.trusted if self.ranked_protocols is None else self.ranked_protocols
        return score_definition(self.aggregate, len(used), self.calibrated)

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
        extra = [c for c in ("vcc_score", "population_score") if c in frame.columns]
        for column in ["score", *extra, *self.protocols]:
            values = frame[column].to_numpy(dtype=np.float64)
            if not np.isfinite(values).any():
                continue
            # Both headline scores are higher-is-better in every mode.
            direction = self.better.get(column, "higher")
            best[column] = float(np.nanmax(values) if direction == "higher" else np.nanmin(values))
        return best

    def _repr_html_(self) -> str:
        styled = self.headline.style.format(precision=3, na_rep="–").hide(axis="index")
        return str(styled.set_caption(self.definition).to_html())

    def __repr__(self) -> str:
        return self.headline.to_string(index=False, float_format=lambda v: f"{v:.3g}")


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
    population: Sequence[str] = (),
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
    population
        The protocols that need predicted cells (population protocols): a user
        model with values there is cell-level and gets the second ranking.

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
    if entries is not None and used:
        matrices = {n: headline_matrix(entries, n, used, value_column) for n in names}
    else:
        # Without per-perturbation rows each entry's aggregates stand for one row.
        matrices = {n: wide.loc[[n], used].reset_index(drop=True) for n in names}
    models = [n for n in names if kinds[n] == "model"]
    coverage = ranking_coverage(matrices, models, used)
    full = [entries is None or covers(matrices[n], coverage) for n in names]
    ranked_names = [n for n, f in zip(names, full, strict=True) if f]

    def score_of(chosen: Sequence[str], where: Coverage) -> dict[str, float]:
        values = {n: restricted(matrices[n], where) for n in chosen}
        return scores_on(values, [directions[p] for p in where.protocols], aggregate, calibrated)

    ranked_scores = score_of(ranked_names, coverage)
    score, listing, apart_ranks = [], [], []
    for name, is_full in zip(names, full, strict=True):
        if is_full:
            score.append(ranked_scores[name])
            listing.append(RANKED)
            apart_ranks.append(np.nan)
            continue
        own = entry_coverage(matrices[name], used)
        mine = score_of([*ranked_names, name], own) if own.protocols else {name: np.nan}
        score.append(mine[name])
        text, place = _apart(name, mine, ranked_names)
        listing.append(text)
        apart_ranks.append(place)
    ranks = competition_ranks([s if f else np.nan for s, f in zip(score, full, strict=True)])
    # An entry listed apart takes the rank it would have among the ranked ones on its
    # own coverage, so every scored row has a rank; `listing` says which kind it is.
    order = np.where(full, ranks, apart_ranks)
    intervals = [
        headline_ci(
            restricted(matrices[n], coverage if f else entry_coverage(matrices[n], used)),
            aggregate,
            seed,
        )
        if calibrated and entries is not None and used
        else (np.nan, np.nan)
        for n, f in zip(names, full, strict=True)
    ]
    n_perturbations = len(coverage.rows) if entries is not None else 0
    table["score"] = score
    table["ci_low"] = [low for low, _ in intervals]
    table["ci_high"] = [high for _, high in intervals]
    table["rank"] = pd.array(np.asarray(order, dtype=np.float64), dtype="Int64")
    table["perturbations"] = [
        f"{_count_rows(matrices[n], coverage)}/{n_perturbations}" for n in names
    ]
    n_protocols = len(coverage.protocols)
    table["protocols"] = [
        f"{len(entry_coverage(matrices[n], coverage.protocols).protocols)}/{n_protocols}"
        for n in names
    ]
    table["listing"] = listing
    # The table names each flag; the sentences with the evidence go under it.
    table["flags"] = [
        "; ".join(f.partition(":")[0] for f in flag_lists.get(n, [])) or NO_FLAGS for n in names
    ]
    second = _population_ranking(matrices, models, used, population, coverage)
    if second is not None:
        cell_names = [n for n in names if covers(matrices[n], second)]
        second_scores = score_of(cell_names, second)
        values = [second_scores.get(n, np.nan) for n in names]
        table["population_score"] = values
        table["population_rank"] = pd.array(competition_ranks(values), dtype="Int64")
    for protocol in protocols:
        table[protocol] = wide[protocol].to_numpy()
    # Ranked entries first by rank; those listed apart below, best score first.
    table = (
        table.assign(_apart=table["listing"] != RANKED, _score=-table["score"])
        .sort_values(["_apart", "_score", "model"], na_position="last")
        .drop(columns=["_apart", "_score"])
        .reset_index(drop=True)
    )
    sentence = ranking_sentence(coverage, used, models, calibrated, second)
    notes = [sentence]
    apart = table.loc[table["listing"] != RANKED, "model"].tolist()
    if apart:
        notes.append(
            "Listed apart, not ranked among the others (they do not cover the "
            f"{len(coverage.protocols)} protocols and {n_perturbations} perturbations of the "
            f"ranking; their score is over what they cover): {', '.join(map(str, apart))}. "
            "'rank k of m on its coverage': its place among the ranked entries when those "
            "are scored on the same perturbations and protocols."
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
        ranking=sentence,
        ranked_protocols=list(coverage.protocols),
        population_protocols=list(second.protocols) if second is not None else [],
    )


def _count_rows(matrix: pd.DataFrame, coverage: Coverage) -> int:
    """Perturbations of a coverage on which an entry has a value."""
    values = restricted(matrix, coverage)
    return int(np.isfinite(values).any(axis=1).sum()) if values.size else 0


def _population_ranking(
    matrices: Mapping[str, pd.DataFrame],
    models: Sequence[str],
    used: Sequence[str],
    population: Sequence[str],
    first: Coverage,
) -> Coverage | None:
    """The coverage of the cell-level models' second ranking, or None when there is none."""
    cells = [p for p in used if p in set(population)]
    if not cells or set(cells) <= set(first.protocols):
        return None
    cell_models = [m for m in models if entry_coverage(matrices[m], cells).protocols]
    if not cell_models:
        return None
    second = ranking_coverage({m: matrices[m] for m in cell_models}, cell_models, cells)
    return second if second.protocols else None


def _apart(name: str, scores: Mapping[str, float], ranked: Sequence[str]) -> tuple[str, float]:
    """``listed apart``, with the entry's place among the ranked ones on its own coverage.

    Returns the listing text and that place (NaN when it has none).
    """
    value = scores.get(name, np.nan)
    if not np.isfinite(value) or not ranked:
        return APART, np.nan
    better = sum(int(scores[other] > value) for other in ranked)
    return f"{APART}; rank {better + 1} of {len(ranked) + 1} on its coverage", float(better + 1)


def _names(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "none"


def ranking_sentence(
    coverage: Coverage,
    used: Sequence[str],
    models: Sequence[str],
    calibrated: bool,
    second: Coverage | None = None,
) -> str:
    """The sentence saying which protocols and perturbations the ranks use.

    Parameters
    ----------
    coverage
        The ranking coverage.
    used
        The protocols that could be used (the trusted ones).
    models
        The user models.
    calibrated
        Calibrated or plain mode (``trusted protocols`` or ``protocols``).
    second
        The coverage of the cell-level models' second ranking, if any.

    Returns
    -------
    str
        For example ``Ranks use the 25 of the 30 trusted protocols that every model
        (m1, m2) covers, all but energy_pca, mmd_pca, ...; over the 33 perturbations
        they all cover; ties share ...``.

    """
    kind = "trusted protocols" if calibrated else "protocols"
    n_rows = len(coverage.rows)
    left = [p for p in used if p not in coverage.protocols]
    # Name the shorter list: the protocols used, or those left out.
    which = (
        f"namely {_names(coverage.protocols)}"
        if len(coverage.protocols) <= len(left)
        else f"all but {_names(left)}"
    )
    if models:
        whose = f"every model ({_names(models)}) covers"
        if len(coverage.protocols) == len(used):
            head = f"Ranks use all {len(used)} {kind}, which {whose}"
        else:
            head = (
                f"Ranks use the {len(coverage.protocols)} of the {len(used)} {kind} that "
                f"{whose if coverage.shared else 'the best-covering model covers'}, {which}"
            )
        rows = f"over the {n_rows} perturbations they all cover"
    else:
        head = f"Ranks use all {len(used)} {kind}"
        rows = f"over the {n_rows} perturbations scored"
    sentence = f"{head}; {rows}; {TIE_RULE}."
    if second is not None:
        sentence += (
            f" population_rank ranks the cell-level models and every entry with cells again "
            f"on the {len(second.protocols)} population {kind} they all cover "
            f"({_names(second.protocols)}), over {len(second.rows)} perturbations."
        )
    return sentence
