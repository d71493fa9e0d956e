"""The leaderboard's ``vcc_score`` column and its baseline ``cell_eval_mean``."""

from __future__ import annotations

import math
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from scperteval.engine.dispatch import UNDEFINED_REASON
from scperteval.engine.suites import load_suite
from scperteval.errors import SpecError
from scperteval.scoring.vcc import CHALLENGE_TERMS, vcc_column
from scperteval.workflows.report import report
from scperteval.workflows.score import score


@pytest.fixture(scope="module")
def screen() -> ad.AnnData:
    from scperteval.simulation import simulate

    return simulate(
        n_perturbations=6, n_genes=30, cells_per_perturbation=16, effect_size=1.5, seed=5
    )


def _dense(matrix) -> np.ndarray:
    return np.asarray(matrix.toarray() if sp.issparse(matrix) else matrix, dtype=np.float64)


@pytest.fixture(scope="module")
def noisy(screen) -> ad.AnnData:
    rng = np.random.default_rng(2)
    cells = _dense(screen.X)
    values = np.clip(cells + rng.normal(0.0, 0.4, cells.shape), 0.0, None)
    return ad.AnnData(values, obs=screen.obs.copy(), var=screen.var.copy())


def _score(screen, models, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return score(screen, models, workers=1, progress=False, figures=False, **options)


@pytest.fixture(scope="module")
def plain(screen, noisy, tmp_path_factory):
    out = tmp_path_factory.mktemp("vcc") / "run"
    result = _score(
        screen,
        {"noisy": noisy},
        protocols="vcc2025",
        truth="all",
        baselines=["cell_eval_mean", "dataset_mean"],
        out=out,
    )
    return result, out


def _challenge_by_hand(results: pd.DataFrame, model: str, baseline: str) -> float:
    """cell-eval score's formula on the mean of each term over perturbations.

    A value the entry could not compute (a centroid has no DE: a failure, not a
    returned NaN) is left out of its mean, as cell-eval leaves it out of its table.
    """

    def mean(name: str, rows: pd.DataFrame) -> float:
        values = rows.loc[rows["source_name"] == name, "value"].to_numpy(dtype=float)
        return float(values.mean()) if values.size else math.nan

    terms = []
    for term in CHALLENGE_TERMS:
        rows = results[results["protocol"] == term]
        rows = rows[rows["value"].notna() | (rows["reason"] == UNDEFINED_REASON)]
        u, b = mean(model, rows), mean(baseline, rows)
        scaled = 1.0 - u / b if term == "mae" else (u - b) / (1.0 - b)
        terms.append(0.0 if math.isnan(scaled) else max(scaled, 0.0))
    return sum(terms) / len(terms)


def test_the_baseline_is_the_mean_of_every_labels_centroid_control_included(screen, plain):
    result, _ = plain
    labels = screen.obs["perturbation"].astype(str).to_numpy()
    cells = _dense(screen.X)
    profile = np.mean([cells[labels == label].mean(axis=0) for label in np.unique(labels)], axis=0)
    mae = result.results[
        (result.results["protocol"] == "mae") & (result.results["source_name"] == "cell_eval_mean")
    ]
    assert len(mae) == len(np.unique(labels)) - 1
    for row in mae.itertuples():
        expected = np.abs(cells[labels == row.perturbation].mean(axis=0) - profile).mean()
        assert row.value == pytest.approx(expected, rel=1e-12)


def test_vcc_score_is_cell_evals_formula_on_the_per_perturbation_values(plain):
    result, _ = plain
    values = result.results
    terms = values[values["protocol"].isin(CHALLENGE_TERMS)]
    # Only the centroid baseline lacks values: it has no cells for DE.
    assert set(terms.loc[terms["value"].isna(), "source_name"]) == {"dataset_mean"}
    board = result.leaderboard.table.set_index("model")
    for name in ("noisy", "dataset_mean", "cell_eval_mean"):
        expected = _challenge_by_hand(values, name, "cell_eval_mean")
        assert board.loc[name, "vcc_score"] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert board.loc["cell_eval_mean", "vcc_score"] == 0.0
    assert board.loc["noisy", "vcc_score"] > 0.1


def test_vcc_score_is_in_every_leaderboard_format_and_rebuilt_by_report(plain, tmp_path):
    result, out = plain
    board = result.leaderboard.table.set_index("model")
    written = pd.read_csv(out / "leaderboard.csv").set_index("model")
    np.testing.assert_allclose(
        written.loc[board.index, "vcc_score"], board["vcc_score"], rtol=1e-12
    )
    shown = f"{board.loc['noisy', 'vcc_score']:.3g}"
    for name in ("leaderboard.md", "leaderboard.tex", "report.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert "vcc" in text and shown in text, name
    rebuilt = report(out, out=tmp_path / "again", figures=False)
    again = rebuilt.leaderboard.table.set_index("model")
    np.testing.assert_allclose(again.loc[board.index, "vcc_score"], board["vcc_score"], rtol=0)


def test_no_column_without_the_three_terms(screen, noisy):
    result = _score(screen, {"noisy": noisy}, protocols="mae", truth="all", baselines=False)
    assert "vcc_score" not in result.leaderboard.table.columns
    assert "vcc_score" not in result.leaderboard.headline.columns


def test_nan_with_a_reason_when_the_score_cannot_be_computed(screen, noisy):
    plain = _score(screen, {"noisy": noisy}, protocols="vcc2025", truth="all", baselines=False)
    assert plain.leaderboard.table["vcc_score"].isna().all()
    assert any("cell_eval_mean" in note for note in plain.leaderboard.notes)
    calibrated = _score(screen, {"noisy": noisy}, protocols="vcc2025", baselines=False)
    assert calibrated.leaderboard.table["vcc_score"].isna().all()
    assert any("--truth all" in note for note in calibrated.leaderboard.notes)


def test_a_term_defined_otherwise_gives_no_score():
    protocols = pd.DataFrame([p.describe() for p in load_suite("vcc2025")])
    rows = [
        (name, term, "a", 0.5, "") for name in ("m", "cell_eval_mean") for term in CHALLENGE_TERMS
    ]
    results = pd.DataFrame(
        rows, columns=["source_name", "protocol", "perturbation", "value", "reason"]
    )
    results["source"] = np.where(results["source_name"] == "m", "model", "baseline")
    scores, reason = vcc_column(results, protocols, calibrated=False)
    assert reason == "" and scores == {"cell_eval_mean": 0.0, "m": 0.0}
    changed = protocols.assign(
        centering=np.where(protocols["protocol"] == "mae", "control", protocols["centering"])
    )
    scores, reason = vcc_column(results, changed, calibrated=False)
    assert scores == {} and "mae" in reason
    assert vcc_column(results, protocols[protocols["protocol"] != "mae"], False) is None


def test_an_undefined_term_counts_as_nan_and_the_score_takes_it_as_zero():
    protocols = pd.DataFrame([p.describe() for p in load_suite("vcc2025")])
    rows = [("cell_eval_mean", "baseline", t, "a", 0.5, "") for t in CHALLENGE_TERMS]
    rows += [
        ("m", "model", "mae", "a", 0.25, ""),
        ("m", "model", "discrimination_score_l1", "a", 0.75, ""),
        ("m", "model", "overlap_at_N", "a", math.nan, UNDEFINED_REASON),
    ]
    # An entry whose every value failed (a centroid baseline on DE alone) has none.
    rows += [
        ("broken", "baseline", t, "a", math.nan, "DegenerateInput: no") for t in CHALLENGE_TERMS
    ]
    columns = ["source_name", "source", "protocol", "perturbation", "value", "reason"]
    scores, _ = vcc_column(pd.DataFrame(rows, columns=columns), protocols, calibrated=False)
    # mae: 1 - 0.25 / 0.5; PDS: (0.75 - 0.5) / 0.5; DES: NaN -> 0.
    assert scores["m"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert set(scores) == {"m", "cell_eval_mean"}


def test_the_baseline_is_refused_in_a_calibrated_run(screen, noisy):
    with pytest.raises(SpecError, match="cell_eval_mean"):
        _score(screen, {"noisy": noisy}, protocols="vcc2025", baselines=["cell_eval_mean"])
