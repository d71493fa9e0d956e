"""``scperteval calibrate`` and ``scperteval list`` through the command line entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from scperteval.cli import main
from scperteval.engine.calibrators import CALIBRATORS
from scperteval.engine.sources import SOURCES
from scperteval.engine.spaces import SPACES
from scperteval.engine.suites import available_suites, load_suite
from scperteval.metrics import METRICS


def listed_names(output):
    return [line.split()[0] for line in output.splitlines() if line.strip()]


def test_calibrate_example(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["calibrate", "--example", "-p", "pearson_delta_ctrl,mse", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "pearson_delta_ctrl" in printed
    assert "thresholds: BDS >= 0.75" in printed
    results = pd.read_parquet(out / "results.parquet")
    assert set(results["protocol"]) == {"pearson_delta_ctrl", "mse"}
    # The example has two cell lines: each gets its calibration rows, and 'all'.
    calibration = pd.read_csv(out / "calibration.csv")
    assert set(calibration["covariate"]) == {"cell_line_0", "cell_line_1", "all"}
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["options"]["protocols"] == ["pearson_delta_ctrl", "mse"]
    assert run_json["options"]["covariate_key"] == "cell_line"
    # Every value was computed: the failure table exists, with a header only.
    assert run_json["failures"] == {}
    failures = pd.read_csv(out / "failures.csv")
    assert list(failures.columns) == ["protocol", "source_name", "reason", "count"]
    assert failures.empty


def test_calibrate_options_reach_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "calibrate",
            "--example",
            "-p",
            "mse_top_k=10",
            "--seed",
            "4",
            "--workers",
            "2",
            "--thresholds",
            "bds=1.0,drf=1.0",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    # DRF reaches 1 only for a positive control equal to the truth: nothing is trusted.
    assert "not trusted" in capsys.readouterr().out
    options = json.loads((out / "run.json").read_text())["options"]
    assert options["seed"] == 4
    assert options["workers"] == 2
    assert options["protocols"] == ["mse_top_k=10"]
    assert options["thresholds"] == {"bds_min": 1.0, "drf_min": 1.0, "drf_statistic": "median"}
    calibration = pd.read_csv(out / "calibration.csv")
    assert not calibration["trusted"].any()


def test_bad_protocol_name_exits_2_with_one_line(tmp_path, capsys):
    code = main(["calibrate", "--example", "-p", "pearson_delta_ctrll", "--out", str(tmp_path)])
    assert code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert "pearson_delta_ctrll" in lines[0]
    assert "valid names" in lines[0]
    for protocol in load_suite("default"):
        assert protocol.name in lines[0]
    assert not (tmp_path / "results.parquet").exists()


def test_bad_thresholds_exit_2(tmp_path, capsys):
    code = main(
        ["calibrate", "--example", "-p", "mse", "--thresholds", "bds=x", "--out", str(tmp_path)]
    )
    assert code == 2
    assert capsys.readouterr().err.startswith("scperteval: error:")


@pytest.mark.parametrize(
    ("kind", "registry"),
    [("metrics", METRICS), ("spaces", SPACES), ("sources", SOURCES), ("calibrators", CALIBRATORS)],
)
def test_list_registered(kind, registry, capsys):
    assert main(["list", kind]) == 0
    output = capsys.readouterr().out
    assert listed_names(output) == registry.names()
    for entry in registry:
        assert entry.description in output


def test_list_protocols_and_suites(capsys):
    assert main(["list", "protocols"]) == 0
    assert listed_names(capsys.readouterr().out) == [p.name for p in load_suite("default")]
    assert main(["list", "suites"]) == 0
    assert listed_names(capsys.readouterr().out) == sorted(available_suites())
    assert main(["list", "protocols", "-p", "vcc2025"]) == 0
    assert listed_names(capsys.readouterr().out) == [p.name for p in load_suite("vcc2025")]


def test_list_distances_and_the_kinds(capsys):
    from scperteval.cli._listing import KINDS
    from scperteval.distances import DISTANCES

    assert main(["list", "distances"]) == 0
    assert listed_names(capsys.readouterr().out) == DISTANCES.names()
    assert main(["list"]) == 0
    assert listed_names(capsys.readouterr().out) == list(KINDS)


def test_list_unknown_kind_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["list", "widgets"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_plain_calibration_leaves_scipy_stats_unloaded(tmp_path):
    # scipy.stats costs about half a second of imports; only scoring and splits need it.
    code = (
        "import sys\n"
        "from scperteval.cli import main\n"
        f"arguments = ['calibrate', '--example', '-p', 'default', '--out', {str(tmp_path)!r}]\n"
        "assert main(arguments) == 0\n"
        "print('scipy.stats' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip().splitlines()[-1] == "False"
