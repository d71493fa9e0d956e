"""Model-against-model tests: equal to scipy's paired tests, corrected, tallied as win/tie/loss."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from scperteval.engine.calibrators import Thresholds
from scperteval.scoring.pairwise import pairwise_tests, win_tie_loss
from scperteval.scoring.trust import apply_evidence

ENTRIES = ("a", "b", "c")


def _toy() -> tuple[pd.DataFrame, dict[str, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(4)
    values = {
        "p_high": {"a": rng.normal(0.9, 0.1, 30), "b": rng.normal(0.5, 0.1, 30)},
        "p_low": {"a": rng.normal(0.2, 0.1, 30), "b": rng.normal(0.6, 0.1, 30)},
    }
    values["p_high"]["c"] = values["p_high"]["b"] + rng.normal(0.0, 0.01, 30)
    values["p_low"]["c"] = values["p_low"]["b"] + rng.normal(0.0, 0.01, 30)
    rows = []
    for protocol, by_entry in values.items():
        for name, series in by_entry.items():
            for i, value in enumerate(series):
                rows.append(
                    {
                        "covariate": "all",
                        "perturbation": f"p{i}",
                        "protocol": protocol,
                        "source": "model",
                        "source_name": name,
                        "value": value,
                        # A calibrated score is higher-is-better whatever the metric's sense.
                        "calibrated": value if protocol == "p_high" else 1.0 - value,
                    }
                )
    # "c" is undefined on one protocol's first ten perturbations: fewer pairs, not none.
    table = pd.DataFrame(rows)
    hole = (table["source_name"] == "c") & table["perturbation"].isin([f"p{i}" for i in range(10)])
    table.loc[hole & (table["protocol"] == "p_low"), ["value", "calibrated"]] = np.nan
    return table, values


BETTER = {"p_high": "higher", "p_low": "lower"}


@pytest.mark.parametrize("correction", ["bonferroni", "bh"])
def test_pairwise_tests_equal_scipy(correction: str) -> None:
    table, values = _toy()
    tests = pairwise_tests(table, BETTER, ENTRIES, ["p_high", "p_low"], correction, headline=False)
    assert len(tests) == 6
    raw = {}
    for row in tests.itertuples():
        x = values[row.protocol][row.entry]
        y = values[row.protocol][row.other]
        if row.protocol == "p_low" and "c" in (row.entry, row.other):
            x, y = x[10:], y[10:]
        assert row.n == x.size
        t = stats.ttest_rel(x, y)
        w = stats.wilcoxon(x, y)
        assert row.t_pvalue == pytest.approx(t.pvalue, rel=1e-12)
        assert row.t_statistic == pytest.approx(t.statistic, rel=1e-12)
        assert row.wilcoxon_pvalue == pytest.approx(w.pvalue, rel=1e-12)
        assert row.wilcoxon_statistic == pytest.approx(w.statistic, rel=1e-12)
        raw[(row.protocol, row.entry, row.other)] = w.pvalue
    for protocol in ("p_high", "p_low"):
        keys = [k for k in raw if k[0] == protocol]
        pvalues = np.array([raw[k] for k in keys])
        if correction == "bonferroni":
            expected = np.minimum(pvalues * len(keys), 1.0)
        else:
            expected = stats.false_discovery_control(pvalues)
        got = tests.set_index(["protocol", "entry", "other"]).loc[keys, "wilcoxon_pvalue_adj"]
        np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-12)


def test_win_tie_loss_follows_each_protocols_direction() -> None:
    table, _ = _toy()
    tests = pairwise_tests(table, BETTER, ENTRIES, ["p_high", "p_low"], headline=True)
    outcome = tests.set_index(["protocol", "entry", "other"])["outcome"]
    # a is higher on the higher-is-better protocol and lower on the lower-is-better one.
    assert outcome[("p_high", "a", "b")] == "win"
    assert outcome[("p_low", "a", "b")] == "win"
    assert outcome[("score", "a", "b")] == "win"
    wins = win_tie_loss(tests, ENTRIES).set_index(["entry", "other"])
    assert wins.loc[("a", "b"), ["wins", "ties", "losses"]].tolist() == [2, 0, 0]
    assert wins.loc[("b", "a"), ["wins", "ties", "losses"]].tolist() == [0, 0, 2]
    assert wins.loc[("b", "a"), "score_outcome"] == "loss"
    counts = wins[["wins", "ties", "losses"]].sum(axis=1)
    assert (counts == wins["n_protocols"]).all()


def test_pairs_with_nothing_in_common_get_no_row() -> None:
    table, _ = _toy()
    table.loc[(table["source_name"] == "c") & (table["protocol"] == "p_high"), "value"] = np.nan
    tests = pairwise_tests(table, BETTER, ENTRIES, ["p_high", "p_low"], headline=False)
    assert not ((tests["protocol"] == "p_high") & (tests["other"] == "c")).any()
    assert (tests["n"] > 0).all()


def test_evidence_rule_marks_small_counts() -> None:
    calibration = pd.DataFrame(
        {
            "protocol": ["x", "x", "x", "y", "y", "y"],
            "covariate": ["g1", "g2", "all", "g1", "g2", "all"],
            "n": [12, 4, 16, 5, 3, 8],
            "drf_mean": 0.5,
            "drf_median": 0.5,
            "bds": 1.0,
            "trusted": True,
        }
    )
    table, reasons = apply_evidence(calibration, {"x": "", "y": "BDS 0.50 < 0.75"}, 10)
    assert reasons["x"] == ""
    assert reasons["y"] == (
        "insufficient evidence: 8 perturbations with both controls defined (fewer than 10); "
        "BDS 0.50 < 0.75"
    )
    assert table["trusted"].tolist() == [True, False, True, False, False, False]
    assert (
        table["evidence"].tolist()
        == ["sufficient"] + ["insufficient"] + ["sufficient"] + ["insufficient"] * 3
    )
    _, loose = apply_evidence(calibration, {"x": "", "y": ""}, 8)
    assert loose["y"] == ""
    assert Thresholds().bds_min == 0.75


@pytest.mark.parametrize(("value", "pattern"), [(0, "at least 1"), (2.5, "whole number")])
def test_min_perturbations_is_checked_before_any_work(value, pattern, tmp_path) -> None:
    from scperteval.errors import SpecError
    from scperteval.simulation import simulate
    from scperteval.workflows.report import report
    from scperteval.workflows.score import score

    adata = simulate(n_perturbations=3, n_genes=20, cells_per_perturbation=10, seed=2)
    with pytest.raises(SpecError, match=pattern):
        score(adata, {"m": adata}, protocols="mse", min_perturbations=value, out=tmp_path / "o")
    assert not (tmp_path / "o").exists()
    if isinstance(value, int):
        with pytest.raises(SpecError, match=pattern):
            report(tmp_path, min_perturbations=value)
