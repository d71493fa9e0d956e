"""Every model ranked on what the user models cover; ties share a rank; one trust rule."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import rankdata

from scperteval.engine.calibrators import Thresholds, calibration_table, verdict_reasons
from scperteval.engine.suites import load_suite
from scperteval.scoring.calibrated import aggregate
from scperteval.scoring.leaderboard import RANKED, build_leaderboard
from scperteval.scoring.vcc import CHALLENGE_TERMS, VCC_UNSCORED_COLUMN, unscored_terms
from scperteval.simulation import simulate
from scperteval.workflows.calibrate import calibrate
from scperteval.workflows.score import score

PERTURBATIONS = ["A", "B", "C", "D"]
CENTROID = ["p1", "p2"]
POPULATION = ["p3", "p4"]
PROTOCOLS = CENTROID + POPULATION


def _entries(values: dict[tuple[str, str], dict[str, list[float]]]) -> pd.DataFrame:
    """Tidy entry rows from ``{(name, kind): {protocol: per-perturbation values}}``."""
    rows = []
    for (name, kind), by_protocol in values.items():
        for protocol, column in by_protocol.items():
            for perturbation, value in zip(PERTURBATIONS, column, strict=True):
                rows.append(("all", perturbation, protocol, kind, name, value, value))
    columns = ["covariate", "perturbation", "protocol", "source", "source_name", "value"]
    return pd.DataFrame(rows, columns=[*columns, "calibrated"])


def _board(frame: pd.DataFrame, calibrated: bool = True, better=None):
    directions = better or {p: "higher" for p in PROTOCOLS}
    column = "calibrated" if calibrated else "value"
    return build_leaderboard(
        aggregate(frame, column=column),
        PROTOCOLS,
        directions,
        PROTOCOLS,
        {},
        "median",
        calibrated=calibrated,
        entries=frame,
        population=POPULATION,
    )


# A pseudobulk model (centroid protocols only), a cell-level model (all four), a
# duplicate baseline with cells, one baseline on two perturbations only (additive)
# and one on a single protocol.
TOY = {
    ("bulk", "model"): {"p1": [0.9, 0.8, 0.7, 0.6], "p2": [0.5, 0.6, 0.7, 0.8]},
    ("cells", "model"): {
        "p1": [0.9, 0.8, 0.7, 0.6],
        "p2": [0.5, 0.6, 0.7, 0.8],
        "p3": [0.2, 0.4, 0.6, 0.8],
        "p4": [0.1, 0.1, 0.1, 0.1],
    },
    ("duplicate", "baseline"): {p: [1.0, 1.0, 1.0, 1.0] for p in PROTOCOLS},
    ("mean", "baseline"): {"p1": [0.0, 0.1, 0.2, 0.3], "p2": [0.1, 0.1, 0.1, 0.1]},
    ("additive", "baseline"): {"p1": [0.95, 0.95, math.nan, math.nan]},
}


def _protocols_named(sentence: str, used_all: list[str]) -> list[str]:
    """The protocols a ranking sentence says it uses (either of its two forms)."""
    named = re.search(r"namely ([\w, ]+);", sentence)
    if named:
        return named.group(1).split(", ")
    left = re.search(r"all but ([\w, ]+);", sentence)
    if left:
        return [p for p in used_all if p not in left.group(1).split(", ")]
    assert re.search(rf"Ranks use all {len(used_all)} ", sentence), sentence
    return list(used_all)


def test_a_pseudobulk_and_a_cell_level_model_are_both_ranked_on_what_both_cover():
    board = _board(_entries(TOY))
    table = board.table.set_index("model")
    assert set(table.index[table["listing"] == RANKED]) == {"bulk", "cells", "duplicate", "mean"}
    assert board.ranked_protocols == CENTROID
    # The score of a ranked entry is the median over p1, p2 of each one's median.
    for (name, _), values in TOY.items():
        if name in ("bulk", "cells", "duplicate", "mean"):
            expected = np.median([np.median(values[p]) for p in CENTROID])
            assert table.loc[name, "score"] == pytest.approx(expected)
    ranked = table[table["listing"] == RANKED]
    expected_ranks = rankdata(-ranked["score"].to_numpy(dtype=float), method="min")
    np.testing.assert_array_equal(ranked["rank"].to_numpy(dtype=float), expected_ranks)
    # bulk and cells tie: both 2nd, mean is 4th (competition ranking).
    assert list(ranked.loc[["duplicate", "bulk", "cells", "mean"], "rank"]) == [1, 2, 2, 4]
    assert table.loc["additive", "listing"].startswith("listed apart")
    assert _protocols_named(board.ranking, PROTOCOLS) == board.ranked_protocols
    assert "1, 1, 3" in board.ranking and "ties share" in board.ranking
    assert f"over the {len(PERTURBATIONS)} perturbations" in board.ranking
    assert board.ranking in board.notes
    assert "median over the 2 trusted protocols" in board.definition


def test_cell_level_models_get_a_second_ranking_on_the_population_protocols():
    board = _board(_entries(TOY))
    table = board.table.set_index("model")
    assert board.population_protocols == POPULATION
    scored = table["population_score"].dropna()
    assert set(scored.index) == {"cells", "duplicate"}
    expected = np.median([np.median(TOY[("cells", "model")][p]) for p in POPULATION])
    assert scored["cells"] == pytest.approx(expected)
    ranks = rankdata(-scored.to_numpy(dtype=float), method="min")
    np.testing.assert_array_equal(table.loc[scored.index, "population_rank"], ranks)
    assert "population_rank" in board.ranking and "p3, p4" in board.ranking


def test_no_second_ranking_when_every_model_has_cells():
    only_cells = {k: v for k, v in TOY.items() if k[0] != "bulk"}
    board = _board(_entries(only_cells))
    assert board.ranked_protocols == PROTOCOLS
    assert "population_score" not in board.table and board.population_protocols == []
    assert _protocols_named(board.ranking, PROTOCOLS) == PROTOCOLS


def test_baselines_alone_are_ranked_on_every_trusted_protocol():
    baselines = {k: v for k, v in TOY.items() if k[1] == "baseline"}
    board = _board(_entries(baselines))
    assert board.ranked_protocols == PROTOCOLS
    table = board.table.set_index("model")
    assert list(table.index[table["listing"] == RANKED]) == ["duplicate"]


def test_models_sharing_no_protocol_still_rank_one_of_them():
    apart = {
        ("left", "model"): {"p1": [0.5, 0.5, 0.5, 0.5], "p2": [0.4, 0.4, 0.4, 0.4]},
        ("right", "model"): {"p3": [0.9, 0.9, 0.9, 0.9]},
    }
    board = _board(_entries(apart))
    table = board.table.set_index("model")
    assert table.loc["left", "listing"] == RANKED
    assert board.ranked_protocols == ["p1", "p2"]
    assert "best-covering model" in board.ranking


def test_a_plain_run_ranks_by_a_higher_is_better_share_of_entries_beaten():
    better = {"p1": "higher", "p2": "lower", "p3": "higher", "p4": "lower"}
    board = _board(_entries(TOY), calibrated=False, better=better)
    table = board.table.set_index("model")
    ranked = table[table["listing"] == RANKED]
    names = list(ranked.index)
    # Independently: per protocol, scipy's average ranks (ascending for higher is
    # better) minus 1 over n - 1 is the share of the others beaten, ties one half.
    shares = []
    for protocol in CENTROID:
        medians = np.array([np.median(TOY[(n, k)][protocol]) for n, k in TOY if n in names])
        order = [n for n, _ in TOY if n in names]
        signed = medians if better[protocol] == "higher" else -medians
        share = (rankdata(signed, method="average") - 1) / (len(names) - 1)
        shares.append(pd.Series(share, index=order))
    expected = pd.concat(shares, axis=1).mean(axis=1)
    for name in names:
        assert ranked.loc[name, "score"] == pytest.approx(expected[name])
    np.testing.assert_array_equal(
        ranked["rank"].to_numpy(dtype=float),
        rankdata(-ranked["score"].to_numpy(dtype=float), method="min"),
    )
    assert "higher is better" in board.definition and "lower is better" not in board.definition
    best = board.best_per_column()["score"]
    assert best == pytest.approx(ranked["score"].max())


def test_vcc_names_the_terms_an_entry_has_no_value_for():
    rows = [("cell_eval_mean", "baseline", t, "a", 0.5, "") for t in CHALLENGE_TERMS]
    rows += [
        ("bulk", "model", "mae", "a", 0.25, ""),
        ("bulk", "model", "discrimination_score_l1", "a", 0.75, ""),
        ("bulk", "model", "overlap_at_N", "a", math.nan, "DegenerateInput: no cells"),
    ]
    columns = ["source_name", "source", "protocol", "perturbation", "value", "reason"]
    missing = unscored_terms(pd.DataFrame(rows, columns=columns))
    assert missing == {"bulk": ["overlap_at_N"], "cell_eval_mean": []}


@pytest.fixture(scope="module")
def small_screen():
    # 6 perturbations: fewer than the 10 a protocol needs to be trusted.
    return simulate(
        n_perturbations=6, n_genes=30, cells_per_perturbation=16, effect_size=1.5, seed=5
    )


def _means(screen) -> pd.DataFrame:
    """One predicted profile per perturbation: the measured means (a pseudobulk model)."""
    cells = screen.X.toarray() if hasattr(screen.X, "toarray") else screen.X
    frame = pd.DataFrame(np.asarray(cells), columns=screen.var_names)
    means = frame.groupby(screen.obs["perturbation"].astype(str).to_numpy()).mean()
    return means.drop(index="control")


def test_calibrate_and_score_apply_the_same_evidence_rule(small_screen):
    chosen = "mse,pearson_delta_ctrl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calibration = calibrate(small_screen, chosen, workers=1, progress=False)
        scored = score(
            small_screen,
            {"bulk": _means(small_screen)},
            protocols=chosen,
            workers=1,
            progress=False,
            figures=False,
        )
    overall = calibration.overall()
    assert (overall["n"] < 10).all()
    assert calibration.trusted_protocols() == scored.leaderboard.trusted == []
    assert overall["reason"].str.startswith("insufficient evidence: 6 perturbations").all()
    assert "insufficient evidence" in calibration.summary()
    # With the rule relaxed to 1 the verdict is the controls' alone, as score's.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loose = calibrate(small_screen, chosen, workers=1, progress=False, min_perturbations=1)
        loose_scored = score(
            small_screen,
            {"bulk": _means(small_screen)},
            protocols=chosen,
            workers=1,
            progress=False,
            figures=False,
            min_perturbations=1,
        )
    meta = {
        str(r.protocol): {"better": r.better, "perfect": r.perfect}
        for r in loose.protocols.itertuples()
    }
    table = calibration_table(loose.results, meta, Thresholds())
    by_controls = [p for p, why in verdict_reasons(table, Thresholds()).items() if not why]
    assert sorted(loose.trusted_protocols()) == sorted(by_controls)
    assert sorted(loose_scored.leaderboard.trusted) == sorted(by_controls)


def test_a_pseudobulk_vcc_run_names_overlap_as_counted_zero(small_screen):
    means = _means(small_screen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = score(
            small_screen,
            {"bulk": means},
            protocols=load_suite("vcc2025"),
            truth="all",
            baselines=["cell_eval_mean"],
            workers=1,
            progress=False,
            figures=False,
        )
    table = result.leaderboard.table.set_index("model")
    assert table.loc["bulk", VCC_UNSCORED_COLUMN] == "overlap_at_N"
    note = next(n for n in result.leaderboard.notes if "counts as 0" in n)
    assert "bulk: overlap_at_N" in note
    assert table.loc["bulk", "listing"] == RANKED
