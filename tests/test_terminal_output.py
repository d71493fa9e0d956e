"""What a run prints: tested against the run's own numbers and files."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

import scperteval
from scperteval.cli._options import engine_kwargs
from scperteval.engine.calibrators import Thresholds
from scperteval.progress import progress_bar
from scperteval.reporting.formatting import percent
from scperteval.reporting.terminal import empty_entry_lines, terminal_lines
from scperteval.scoring.trust import verdict_sentences
from scperteval.simulation import simulate

PROTOCOLS = "mse,pearson_delta_ctrl,mae,de_auprc,energy_pca"


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    truth = simulate(n_perturbations=12, n_genes=60, cells_per_perturbation=30, seed=5)
    labels = truth.obs["perturbation"].astype(str).to_numpy()
    X = np.asarray(truth.X.todense())
    names = sorted(set(labels) - {"control"})
    table = pd.DataFrame(
        np.vstack([X[labels == name].mean(axis=0) for name in names]), columns=truth.var_names
    )
    table.insert(0, "perturbation", names)
    out = tmp_path_factory.mktemp("terminal") / "run"
    # A strict DRF threshold, so that some protocols are untrusted and some trusted.
    result = scperteval.score(
        truth,
        {"means": table},
        protocols=PROTOCOLS,
        thresholds=Thresholds(drf_min=0.6),
        out=out,
        figures=False,
    )
    return result, out


def test_one_line_per_untrusted_protocol_and_a_count_of_trusted(scored) -> None:
    result, out = scored
    board = result.leaderboard
    lines = terminal_lines(result, str(out / "failures.csv"))
    calibration = result.calibration
    overall = calibration[calibration["covariate"] == "all"].set_index("protocol")
    untrusted = [str(p) for p in overall.index if not bool(overall.loc[p, "trusted"])]
    trusted = [str(p) for p in overall.index if bool(overall.loc[p, "trusted"])]
    assert untrusted and trusted, "the thresholds should split the protocols"
    shown = [line.split(":")[0].strip() for line in lines if "not trusted" in line]
    assert sorted(shown) == sorted(untrusted)
    assert sorted(set(board.verdicts) - set(board.trusted)) == sorted(untrusted)
    count = f"{len(trusted)} of {len(overall)} protocols trusted"
    assert sum(line.startswith(count) for line in lines) == 1
    assert not any(line.lstrip().startswith("trusted:") for line in lines)
    assert not any(f"  {p}: " in line for p in trusted for line in lines)


def test_the_nan_count_is_one_line_naming_the_file_that_lists_them(scored) -> None:
    result, out = scored
    listed = out / "failures.csv"
    lines = terminal_lines(result, str(listed))
    nan_lines = [line for line in lines if "NaN by rule" in line]
    assert len(nan_lines) == 1
    written = pd.read_csv(listed)
    expected = int(result.results["value"].isna().sum())
    assert int(written["count"].sum()) == expected
    assert nan_lines[0].startswith(f"{expected} values are NaN by rule")
    assert str(listed) in nan_lines[0]


def test_the_terminal_table_shows_the_listing_of_each_rank(scored) -> None:
    result, _ = scored
    lines = terminal_lines(result)
    header = lines[0].split()
    assert "listing" in header and "rank" in header
    table = result.leaderboard.table
    for row in table.itertuples(index=False):
        line = next(text for text in lines[1 : len(table) + 1] if text.split()[0] == row.model)
        assert str(row.listing) in line


def test_an_entry_without_a_score_says_its_commonest_reason() -> None:
    reasons = ["targets not measured"] * 3 + ["too few cells"]
    results = pd.DataFrame(
        {
            "protocol": ["mse", "mae", "l2", "mse", "mse"],
            "source_name": ["linear"] * 4 + ["m"],
            "value": [np.nan] * 4 + [0.5],
            "reason": [*reasons, ""],
        }
    )
    table = pd.DataFrame({"model": ["m", "linear"], "score": [0.5, math.nan]})
    lines = empty_entry_lines(table, results, "out/failures.csv")
    assert lines == [
        "linear: no score; 4 of its 4 values are NaN, most for 'targets not measured' "
        "(all reasons in out/failures.csv)"
    ]


@pytest.mark.parametrize(
    ("fraction", "text"),
    [
        (0.0, "0%"),
        (1.4e-29, "<0.1%"),
        (0.0009, "<0.1%"),
        (0.001, "0.1%"),
        (0.0142, "1.4%"),
        (0.02, "2%"),
        (0.1249, "12%"),
        (0.5, "50%"),
        (0.9949, "99%"),
        (0.996, "99.6%"),
        (0.99999, ">99.9%"),
        (1.0, "100%"),
        (-0.996, "-99.6%"),
        (math.nan, "–"),
    ],
)
def test_percentages_read_as_a_person_writes_them(fraction, text) -> None:
    assert percent(fraction) == text
    assert "e-" not in percent(fraction) and "e+" not in percent(fraction)


def test_the_progress_bar_counts_tasks_on_stderr_and_stays_off_when_asked(capsys) -> None:
    truth = simulate(n_perturbations=4, n_genes=30, cells_per_perturbation=12, seed=3)
    scperteval.calibrate(truth, protocols="mse,mae", progress=True)
    shown = capsys.readouterr()
    assert "protocols" in shown.err and "tasks" in shown.err and shown.out == ""
    # Two per-perturbation protocols on 4 perturbations: 8 tasks; and the cells read.
    perturbations = set(truth.obs["perturbation"].astype(str)) - {"control"}
    total = 2 * len(perturbations)
    assert re.search(rf"protocols: .*\d+/{total} .*tasks", shown.err)
    assert re.search(rf"group statistics: .*\d+/{truth.n_obs} .*cells", shown.err)
    scperteval.calibrate(truth, protocols="mse,mae", progress=False)
    assert capsys.readouterr().err == ""
    with progress_bar("x", 3, enabled=False) as bar:
        bar.update(2)
        assert bar.n == 2


def test_quiet_turns_the_bars_off_on_the_command_line() -> None:
    from scperteval.cli import build_parser

    parser = build_parser()
    quiet = parser.parse_args(["calibrate", "--example", "--quiet", "--out", "x"])
    loud = parser.parse_args(["calibrate", "--example", "--out", "x"])
    assert engine_kwargs(quiet)["progress"] is False
    assert engine_kwargs(loud)["progress"] is None


def test_verdict_sentences_write_the_drf_share_as_a_person_would() -> None:
    # 7 of 8 wins is BDS 0.875; a DRF median of 0.0142 is 1.4% of the range, not "1%".
    calibration = pd.DataFrame(
        {
            "protocol": ["mse"],
            "covariate": ["all"],
            "n": [8],
            "bds": [7 / 8],
            "drf_median": [0.0142],
            "drf_mean": [0.5],
        }
    )
    protocols = pd.DataFrame(
        {"protocol": ["mse"], "positive": ["technical_duplicate"], "negative": ["dataset_mean"]}
    )
    reasons = {"mse": "DRF median 0.01 < 0.2"}
    sentences = verdict_sentences(calibration, reasons, protocols, Thresholds())
    assert sentences["mse"] == (
        "not trusted: the technical duplicate beats the dataset mean on 7/8 perturbations "
        "(BDS 0.88) and covers a median 1.4% of the range (DRF 0.01) (DRF median 0.01 < 0.2)"
    )


def test_the_figures_get_a_bar_counting_every_figure_written(scored, tmp_path, capsys) -> None:
    result, _ = scored
    result.write(tmp_path / "loud", progress=True)
    shown = capsys.readouterr().err
    written = len(list((tmp_path / "loud" / "figures").glob("*.png")))
    assert written > 0
    assert re.search(rf"figures: .*\d+/{written} .*figures", shown)
    result.write(tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == ""


def test_quiet_turns_the_figure_bar_off_in_report() -> None:
    from scperteval.cli import build_parser
    from scperteval.cli._options import progress_setting

    parser = build_parser()
    assert progress_setting(parser.parse_args(["report", "run", "--quiet"])) is False
    assert progress_setting(parser.parse_args(["report", "run"])) is None
