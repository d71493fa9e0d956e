"""The baseline-scaled Virtual Cell Challenge score, on hand-computed tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scperteval.engine.dispatch import UNDEFINED_REASON
from scperteval.errors import SpecError
from scperteval.scoring.vcc import metric_means, vcc_scores


def _table(rows: list[tuple[str, str, str, float, str]]) -> pd.DataFrame:
    return pd.DataFrame(
        rows, columns=["source_name", "protocol", "perturbation", "value", "reason"]
    )


def _challenge_table() -> pd.DataFrame:
    rows = []
    for name, mae, overlap, pds in (
        ("base", (0.1, 0.3), (0.1, 0.1), (0.5, 0.5)),
        ("model", (0.05, 0.15), (0.6, 0.5), (0.3, 0.2)),
    ):
        for protocol, values in (
            ("mae", mae),
            ("overlap_at_N", overlap),
            ("discrimination_score_l1", pds),
        ):
            rows += [(name, protocol, p, v, "") for p, v in zip("ab", values, strict=True)]
    return _table(rows)


def test_challenge_score_toy_value():
    scores = vcc_scores(_challenge_table(), baseline="base")
    model = scores.loc["model"]
    assert model["mae"] == pytest.approx(1 - 0.1 / 0.2)  # means 0.1 vs 0.2
    assert model["overlap_at_N"] == pytest.approx((0.55 - 0.1) / 0.9)
    assert model["discrimination_score_l1"] == 0.0  # (0.25 - 0.5) / 0.5 clipped at 0
    assert model["avg_score"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert list(scores.index) == ["model"]


def test_the_baseline_scored_against_itself_is_zero():
    scores = vcc_scores(_challenge_table(), baseline="base", models=["base"])
    assert scores.loc["base"].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_nan_rules_follow_cell_evals_table():
    rows = [
        ("base", "pr_auc", "a", 0.5, ""),
        ("base", "pr_auc", "b", 0.5, ""),
        ("model", "pr_auc", "a", 0.9, ""),
        ("model", "pr_auc", "b", math.nan, UNDEFINED_REASON),  # returned NaN: mean is NaN
        ("base", "de_direction_match", "a", 0.5, ""),
        ("base", "de_direction_match", "b", 0.5, ""),
        ("model", "de_direction_match", "a", 0.8, ""),
        ("model", "de_direction_match", "b", math.nan, "DegenerateInput: no DEG"),  # left out
        ("base", "de_nsig_counts_real", "a", 3.0, ""),  # no best value: not scored
        ("model", "de_nsig_counts_real", "a", 3.0, ""),
        ("base", "my_metric", "a", 1.0, ""),  # not a cell-eval metric
        ("model", "my_metric", "a", 2.0, ""),
    ]
    means = metric_means(_table(rows))
    assert math.isnan(means.loc["model", "pr_auc"])
    assert means.loc["model", "de_direction_match"] == pytest.approx(0.8)
    scores = vcc_scores(_table(rows), baseline="base")
    assert list(scores.columns) == ["de_direction_match", "pr_auc", "avg_score"]
    assert scores.loc["model", "pr_auc"] == 0.0  # NaN becomes 0
    assert scores.loc["model", "de_direction_match"] == pytest.approx((0.8 - 0.5) / 0.5)
    assert scores.loc["model", "avg_score"] == pytest.approx(0.6 / 2)


def test_a_zero_baseline_error_gives_zero_not_infinity():
    rows = [("base", "mse", "a", 0.0, ""), ("model", "mse", "a", 0.1, "")]
    assert vcc_scores(_table(rows), baseline="base").loc["model", "mse"] == 0.0


def test_missing_baseline_model_or_metrics_are_errors():
    table = _challenge_table()
    with pytest.raises(SpecError, match="baseline 'nope'"):
        vcc_scores(table, baseline="nope")
    with pytest.raises(SpecError, match="ghost"):
        vcc_scores(table, baseline="base", models=["ghost"])
    with pytest.raises(SpecError, match="no protocol"):
        vcc_scores(_table([("base", "x", "a", 1.0, ""), ("m", "x", "a", 1.0, "")]), "base")
    with pytest.raises(SpecError, match="lacks column"):
        vcc_scores(table.drop(columns="reason"), baseline="base")
