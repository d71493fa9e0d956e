"""Calibrators: DRF, BDS, the calibration table and the trust verdict."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scperteval.engine.calibrators import (
    CALIBRATION_COLUMNS,
    CALIBRATORS,
    Thresholds,
    bds,
    calibration_table,
    drf,
    verdict_reasons,
)

LOWER = {"better": "lower", "perfect": 0.0}
HIGHER = {"better": "higher", "perfect": 1.0}


def results(rows):
    """A tidy results table from (protocol, covariate, perturbation, positive, negative)."""
    records = []
    for protocol, covariate, perturbation, positive, negative in rows:
        for source, value in (("positive", positive), ("negative", negative)):
            records.append(
                {
                    "covariate": covariate,
                    "perturbation": perturbation,
                    "protocol": protocol,
                    "source": source,
                    "source_name": "x",
                    "value": value,
                    "reason": "",
                }
            )
    return pd.DataFrame(records)


# ------------------------------------------------------------------------- DRF


def test_registered():
    assert set(CALIBRATORS.names()) == {"drf", "bds"}


def test_drf_toy_values():
    # SCIENCE section 9.
    assert round(float(drf([0.02], [0.05], "lower", 0.0)[0]), 6) == 0.599988
    assert round(float(drf([0.6], [0.2], "higher", 1.0)[0]), 6) == 0.499999
    # The same by hand, unrounded.
    assert drf([0.02], [0.05], "lower", 0.0)[0] == pytest.approx(0.03 / 0.050001, rel=1e-12)
    assert drf([0.6], [0.2], "higher", 1.0)[0] == pytest.approx(0.4 / 0.800001, rel=1e-12)


def test_drf_with_nonzero_perfect_lower():
    # lower-better with perfect 0.1: (neg - pos) / (neg - perfect + 1e-6)
    assert drf([0.3], [0.5], "lower", 0.1)[0] == pytest.approx(0.2 / (0.4 + 1e-6), rel=1e-12)


def test_drf_is_clipped():
    values = drf([0.9, -0.9, 0.2], [-0.9, 0.9, 0.2], "higher", 1.0)
    # (.9 + .9) / 1.9 < 1; (-.9 - .9) / .1 < -1 -> -1; equal controls: 0.
    np.testing.assert_allclose(values, [1.8 / 1.900001, -1.0, 0.0], rtol=1e-12)
    values = drf([0.2, 2.0], [0.5, 0.1], "lower", 0.0)
    np.testing.assert_allclose(values, [0.3 / 0.500001, -1.0], rtol=1e-12)


def test_drf_counts_values_beyond_perfect_as_perfect():
    # A positive control beyond perfect (an unbiased distance below 0) is perfect.
    assert drf([-0.5], [0.5], "lower", 0.0)[0] == pytest.approx(0.5 / 0.500001, rel=1e-12)
    assert drf([1.5], [0.2], "higher", 1.0)[0] == pytest.approx(0.8 / 0.800001, rel=1e-12)
    # A negative control beyond perfect leaves no dynamic range: never a positive DRF.
    assert drf([0.02], [-0.001], "lower", 0.0)[0] == -1.0
    assert drf([-0.01], [-0.001], "lower", 0.0)[0] == 0.0


def test_drf_propagates_nan():
    values = drf([np.nan, 0.1, 0.1], [0.2, np.nan, 0.3], "lower", 0.0)
    assert np.isnan(values[:2]).all()
    assert values[2] == pytest.approx(0.2 / 0.300001)


def test_drf_perfect_positive_is_one():
    assert drf([0.0], [0.4], "lower", 0.0)[0] == pytest.approx(1.0, abs=1e-5)
    assert drf([1.0], [0.3], "higher", 1.0)[0] == pytest.approx(1.0, abs=1e-5)


# ------------------------------------------------------------------------- BDS


def test_bds_is_strict():
    np.testing.assert_array_equal(bds([0.5, 0.5, 0.4], [0.4, 0.5, 0.5], "higher"), [1, 0, 0])
    np.testing.assert_array_equal(bds([0.1, 0.2, 0.3], [0.2, 0.2, 0.2], "lower"), [1, 0, 0])


def test_bds_nan_where_a_control_is_nan():
    values = bds([np.nan, 0.1, 0.1], [0.2, np.inf * 0, 0.3], "lower")
    assert np.isnan(values[:2]).all()
    assert values[2] == 1.0


# ------------------------------------------------------------------ the table


def test_calibration_table_per_covariate_and_overall():
    rows = [
        # lower-better: a wins 2 of 3 (a tie in p3), b wins 1 of 1
        ("mse", "a", "p1", 0.02, 0.05),
        ("mse", "a", "p2", 0.01, 0.04),
        ("mse", "a", "p3", 0.03, 0.03),
        ("mse", "b", "p1", 0.10, 0.20),
        # higher-better, with a NaN control skipped
        ("r", "a", "p1", 0.6, 0.2),
        ("r", "a", "p2", np.nan, 0.2),
        ("r", "b", "p1", 0.1, 0.5),
    ]
    table = calibration_table(results(rows), {"mse": LOWER, "r": HIGHER})
    assert tuple(table.columns[: len(CALIBRATION_COLUMNS)]) == CALIBRATION_COLUMNS
    assert table[["protocol", "covariate"]].values.tolist() == [
        ["mse", "a"],
        ["mse", "b"],
        ["mse", "all"],
        ["r", "a"],
        ["r", "b"],
        ["r", "all"],
    ]
    row = table.set_index(["protocol", "covariate"])
    mse_a = [0.03 / 0.050001, 0.03 / 0.040001, 0.0]
    mse_b = [0.10 / 0.200001]
    assert row.loc[("mse", "a"), "n"] == 3
    assert row.loc[("mse", "a"), "bds"] == pytest.approx(2 / 3)
    assert row.loc[("mse", "a"), "drf_mean"] == pytest.approx(np.mean(mse_a))
    assert row.loc[("mse", "a"), "drf_median"] == pytest.approx(np.median(mse_a))
    assert row.loc[("mse", "b"), "bds"] == 1.0
    assert row.loc[("mse", "b"), "drf_mean"] == pytest.approx(mse_b[0])
    assert row.loc[("mse", "all"), "n"] == 4
    assert row.loc[("mse", "all"), "bds"] == 0.75
    assert row.loc[("mse", "all"), "drf_mean"] == pytest.approx(np.mean(mse_a + mse_b))
    assert row.loc[("mse", "all"), "drf_median"] == pytest.approx(np.median(mse_a + mse_b))
    # r: p2 of a is skipped; b's positive is worse than its negative.
    r_a = 0.4 / 0.800001
    r_b = max(-1.0, (0.1 - 0.5) / (1 - 0.5 + 1e-6))
    assert row.loc[("r", "a"), "n"] == 1
    assert row.loc[("r", "a"), "n_skipped"] == 1
    assert row.loc[("r", "a"), "drf_mean"] == pytest.approx(r_a)
    assert row.loc[("r", "b"), "bds"] == 0.0
    assert row.loc[("r", "b"), "drf_mean"] == pytest.approx(r_b)
    assert row.loc[("r", "all"), "n"] == 2
    assert row.loc[("r", "all"), "n_skipped"] == 1
    assert row.loc[("r", "all"), "bds"] == 0.5
    assert row.loc[("r", "all"), "drf_median"] == pytest.approx((r_a + r_b) / 2)
    # Verdicts (defaults: BDS >= 0.75, median DRF >= 0.2), group by group.
    assert row.loc[("mse", "a"), "trusted"] == bool(2 / 3 >= 0.75)
    assert row.loc[("mse", "b"), "trusted"]
    assert row.loc[("mse", "all"), "trusted"]
    assert row.loc[("r", "a"), "trusted"]
    assert not row.loc[("r", "b"), "trusted"]
    assert not row.loc[("r", "all"), "trusted"]


def test_single_covariate_still_has_an_overall_row():
    rows = [("mse", "K562", f"p{i}", 0.01, 0.05) for i in range(3)]
    table = calibration_table(results(rows), {"mse": LOWER})
    assert table["covariate"].tolist() == ["K562", "all"]
    assert table["n"].tolist() == [3, 3]


def test_all_nan_controls_are_skipped_and_untrusted():
    rows = [("mse", "a", "p1", np.nan, np.nan), ("mse", "a", "p2", np.nan, 0.1)]
    table = calibration_table(results(rows), {"mse": LOWER})
    overall = table.set_index("covariate").loc["all"]
    assert overall["n"] == 0
    assert overall["n_skipped"] == 2
    assert np.isnan(overall["bds"]) and np.isnan(overall["drf_mean"])
    assert not overall["trusted"]
    reason = verdict_reasons(table, Thresholds())["mse"]
    assert "no perturbation" in reason


def test_model_rows_are_ignored():
    frame = results([("mse", "a", "p1", 0.01, 0.05)])
    model = frame.iloc[[0]].assign(source="model", value=100.0)
    with_model = calibration_table(pd.concat([frame, model]), {"mse": LOWER})
    pd.testing.assert_frame_equal(with_model, calibration_table(frame, {"mse": LOWER}))


def test_negative_estimates_are_counted_for_lower_better():
    rows = [
        ("e", "a", "p1", -0.01, 0.3),
        ("e", "a", "p2", 0.01, 0.3),
        ("e", "a", "p3", 0.02, -0.001),
    ]
    table = calibration_table(results(rows), {"e": LOWER})
    row = overall(table)
    assert row["n_negative"] == 2
    assert row["n"] == 3
    assert row["bds"] == pytest.approx(2 / 3)
    # A positive control below the perfect 0 counts as perfect: (0.3 - 0) / (0.3 + 1e-6).
    np.testing.assert_allclose(
        drf([-0.01, 0.01], [0.3, 0.3], "lower", 0.0), [0.3 / 0.300001, 0.29 / 0.300001]
    )


def test_perturbations_absent_from_a_group_are_not_skipped():
    # Covariate groups with different perturbations, one of them with NaN controls.
    rows = [("m", "A", p, 0.01, 0.05) for p in ("p1", "p2")]
    rows += [("m", "B", p, 0.01, 0.05) for p in ("q1", "q2")]
    rows += [("m", "B", "q3", np.nan, np.nan)]
    table = calibration_table(results(rows), {"m": LOWER}).set_index("covariate")
    assert table["n"].to_dict() == {"A": 2, "B": 2, "all": 4}
    assert table["n_skipped"].to_dict() == {"A": 0, "B": 1, "all": 1}


# ------------------------------------------------------------------ verdicts


def four_perturbations():
    # lower-better; positive strictly better in 3 of 4 (BDS 0.75)
    return results(
        [
            ("m", "a", "p1", 0.01, 0.05),
            ("m", "a", "p2", 0.02, 0.05),
            ("m", "a", "p3", 0.03, 0.05),
            ("m", "a", "p4", 0.05, 0.05),
        ]
    )


def overall(table):
    return table.set_index("covariate").loc["all"]


def test_verdict_flips_exactly_at_the_bds_threshold():
    frame = four_perturbations()
    at = calibration_table(frame, {"m": LOWER}, Thresholds(bds_min=0.75, drf_min=0.0))
    assert overall(at)["bds"] == 0.75
    assert overall(at)["trusted"]
    above = Thresholds(bds_min=float(np.nextafter(0.75, 1.0)), drf_min=0.0)
    assert not overall(calibration_table(frame, {"m": LOWER}, above))["trusted"]


@pytest.mark.parametrize("statistic", ["median", "mean"])
def test_verdict_flips_exactly_at_the_drf_threshold(statistic):
    frame = four_perturbations()
    values = [0.04 / 0.050001, 0.03 / 0.050001, 0.02 / 0.050001, 0.0]
    expected = float(np.median(values) if statistic == "median" else np.mean(values))
    value = overall(calibration_table(frame, {"m": LOWER}))[f"drf_{statistic}"]
    assert value == pytest.approx(expected, rel=1e-12)
    at = Thresholds(bds_min=0.0, drf_min=value, drf_statistic=statistic)
    assert overall(calibration_table(frame, {"m": LOWER}, at))["trusted"]
    above = Thresholds(
        bds_min=0.0, drf_min=float(np.nextafter(value, 1.0)), drf_statistic=statistic
    )
    table = calibration_table(frame, {"m": LOWER}, above)
    assert not overall(table)["trusted"]
    assert f"DRF {statistic}" in verdict_reasons(table, above)["m"]


def test_verdict_uses_the_chosen_drf_statistic():
    # Median high, mean low: only the median passes drf_min = 0.5.
    frame = results(
        [
            ("m", "a", "p1", 0.0, 1.0),
            ("m", "a", "p2", 0.0, 1.0),
            ("m", "a", "p3", 2.0, 1.0),
        ]
    )
    median = Thresholds(bds_min=0.0, drf_min=0.5, drf_statistic="median")
    mean = Thresholds(bds_min=0.0, drf_min=0.5, drf_statistic="mean")
    assert overall(calibration_table(frame, {"m": LOWER}, median))["trusted"]
    assert not overall(calibration_table(frame, {"m": LOWER}, mean))["trusted"]


def test_default_thresholds():
    thresholds = Thresholds()
    assert (thresholds.bds_min, thresholds.drf_min, thresholds.drf_statistic) == (
        0.75,
        0.2,
        "median",
    )
    assert thresholds.as_dict() == {"bds_min": 0.75, "drf_min": 0.2, "drf_statistic": "median"}


# ----------------------------------------------------------- Thresholds.parse


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Thresholds()),
        ("bds=0.8", Thresholds(bds_min=0.8)),
        ("drf=0.3,statistic=mean", Thresholds(drf_min=0.3, drf_statistic="mean")),
        (" bds = 0.9 , drf=0.1 , statistic=median ", Thresholds(0.9, 0.1, "median")),
        ("bds_min=0.5,drf_min=0.25", Thresholds(bds_min=0.5, drf_min=0.25)),
    ],
)
def test_thresholds_parse(text, expected):
    assert Thresholds.parse(text) == expected


@pytest.mark.parametrize("text", ["bds", "foo=1", "bds=high", "statistic=mode"])
def test_thresholds_parse_rejects(text):
    with pytest.raises(ValueError):
        Thresholds.parse(text)
