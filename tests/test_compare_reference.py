"""The pure helpers of benchmarks/compare_reference.py (no reference installation needed)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_reference.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare_reference"] = module
    spec.loader.exec_module(module)
    return module


def test_relative_difference_handles_zeros_nan_and_infinity(compare):
    ours = [1.0, 0.0, math.nan, math.nan, 2.0, math.inf, -1.0]
    reference = [1.0 + 1e-12, 0.0, math.nan, 1.0, 1.0, math.inf, 1.0]
    difference = compare.relative_difference(ours, reference)
    assert difference[0] == pytest.approx(1e-12, rel=1e-3)
    assert difference[1] == 0.0
    assert difference[2] == 0.0
    assert difference[3] == math.inf
    assert difference[4] == pytest.approx(0.5)
    assert difference[5] == 0.0
    assert difference[6] == pytest.approx(2.0)


def test_join_maps_names_and_keeps_only_pairs(compare):
    ours = pd.DataFrame(
        {
            "protocol": ["pearson_delta_ctrl", "pearson_delta_ctrl", "mae", "mse_top_k"],
            "perturbation": ["A", "B", "A", "A"],
            "value": [0.5, 0.25, 1.0, 2.0],
        }
    )
    reference = pd.DataFrame(
        {
            "protocol": ["pearson_ctrl", "pearson_ctrl", "mse_top_k=50", "wmse_exp1"],
            "perturbation": ["A", "B", "A", "A"],
            "value": [0.5, 0.5, 2.0, 9.0],
        }
    )
    joined = compare.join_values(ours, reference)
    assert set(joined["protocol"]) == {"pearson_delta_ctrl", "mse_top_k"}
    row = joined.set_index(["protocol", "perturbation"]).loc[("pearson_delta_ctrl", "B")]
    assert row["reference_protocol"] == "pearson_ctrl"
    assert row["relative_difference"] == pytest.approx(0.5)


def test_agreement_table_gives_reasons_only_for_differences(compare):
    joined = pd.DataFrame(
        {
            "protocol": ["mse", "mse", "de_auroc"],
            "reference_protocol": ["mse", "mse", "de_auroc"],
            "perturbation": ["A", "B", "A"],
            "ours": [1.0, 2.0, 0.4],
            "reference": [1.0, 2.0, 0.7],
            "relative_difference": [0.0, 1e-14, 3 / 7],
        }
    )
    table = compare.agreement_table(joined).set_index("protocol")
    assert bool(table.loc["mse", "agrees"])
    assert table.loc["mse", "reason"] == ""
    assert table.loc["mse", "perturbations"] == 2
    assert not bool(table.loc["de_auroc", "agrees"])
    assert "never-detected" in table.loc["de_auroc", "reason"]


def test_every_mapped_protocol_exists_in_our_suites(compare):
    from scperteval.engine.suites import resolve_protocols

    ours = {p.name for p in resolve_protocols("default")}
    ours |= {p.name for p in resolve_protocols(str(compare.ALIGNED_SUITE))}
    assert set(compare.PROTOCOL_MAP) <= ours
    assert set(compare.DIFFERENCES) <= set(compare.PROTOCOL_MAP)


def test_groups_and_cases(compare):
    assert set(compare.REFERENCE_GROUPS) == set(compare.GROUPS)
    cases = compare.parse_cases("norman:*, S:centroid+de")
    assert cases[: len(compare.GROUPS)] == [("norman", g) for g in compare.GROUPS]
    assert cases[-1] == ("S", "centroid+de")
    with pytest.raises(SystemExit):
        compare.parse_cases("S:nothing")


def test_markdown_table(compare):
    frame = pd.DataFrame({"a": ["x|y"], "b": [np.nan], "c": [0.123456]})
    lines = compare.markdown_table(frame).splitlines()
    assert lines[0] == "| a | b | c |"
    assert lines[2] == "| x\\|y | - | 0.123 |"
