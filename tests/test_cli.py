"""The command line, mostly in-process through ``scperteval.cli.main``."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import version

import pandas as pd
import pytest

import scperteval
from scperteval.cli import main
from scperteval.cli._de import EXAMPLE_SETTINGS

COLUMNS = [
    "covariate",
    "perturbation",
    "gene",
    "statistic",
    "pvalue",
    "pvalue_adj",
    "log_fold_change",
    "mean_target",
    "mean_reference",
]
RUN_KEYS = {"scperteval_version", "options", "input_checksum", "timings_seconds"}
LABELS = ["covariate", "perturbation", "gene"]


def plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Label columns as plain strings (categories' index names do not survive parquet)."""
    frame = frame.copy()
    for column in LABELS:
        frame[column] = frame[column].astype(str)
    return frame


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"scperteval {version('scperteval')}"
    assert scperteval.__version__ == version("scperteval")


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: scperteval")
    assert "de" in out and "--version" in out
    with pytest.raises(SystemExit):
        main(["de", "--help"])
    out = capsys.readouterr().out
    for option in [
        "--perturbation-key",
        "--covariate-key",
        "--control-label",
        "--layer",
        "--min-cells",
        "--normalize",
        "--subset",
        "--method",
        "--reference",
        "--half",
        "--seed",
        "--out",
        "--example",
    ]:
        assert option in out
    assert main([]) == 0  # no command: help, success
    assert capsys.readouterr().out.startswith("usage: scperteval")


def test_usage_errors_exit_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["de", "--example", "--out", str(tmp_path), "--method", "anova"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'anova'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["de", "--out", str(tmp_path)])  # neither DATA nor --example
    assert exit_info.value.code == 2
    assert main(["de", "--example", "--out", str(tmp_path), "--subset", "cell_type"]) == 2
    assert "--subset expects COLUMN=VALUE, got 'cell_type'" in capsys.readouterr().err


def test_example_writes_table_and_run_record(tmp_path, capsys):
    out = tmp_path / "example"
    assert main(["de", "--example", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("simulated example: t-test vs rest for ")
    table = pd.read_parquet(out / "de.parquet")
    assert list(table.columns) == COLUMNS
    record = json.loads((out / "run.json").read_text())
    assert RUN_KEYS <= set(record)
    assert record["scperteval_version"] == scperteval.__version__
    assert record["options"]["method"] == "t-test" and record["options"]["reference"] == "rest"
    assert record["input_checksum"].startswith("md5-memory:")
    assert {"load", "group_statistics", "differential_expression", "total"} <= set(
        record["timings_seconds"]
    )
    assert all(v >= 0 for v in record["timings_seconds"].values())
    # Same table as the Python API on the same simulated data.
    expected = scperteval.de(scperteval.simulate(**EXAMPLE_SETTINGS), covariate_key="cell_line")
    pd.testing.assert_frame_equal(plain(table), plain(expected), check_exact=True)
    n_conditions = table.groupby(["covariate", "perturbation"], observed=True).ngroups
    assert len(table) == n_conditions * EXAMPLE_SETTINGS["n_genes"]
    assert table["covariate"].nunique() == EXAMPLE_SETTINGS["n_covariates"]


def test_real_data_equals_python_api(devel_path, tmp_path, capsys):
    out = tmp_path / "devel"
    argv = [
        "de",
        str(devel_path),
        "--perturbation-key",
        "condition",
        "--covariate-key",
        "cell_type",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    summary = f"{devel_path}: t-test vs rest for 60 perturbations x 500 genes"
    assert summary in capsys.readouterr().out
    table = pd.read_parquet(out / "de.parquet")
    expected = scperteval.de(devel_path, perturbation_key="condition", covariate_key="cell_type")
    assert list(table.columns) == COLUMNS
    pd.testing.assert_frame_equal(plain(table), plain(expected), check_exact=True)
    record = json.loads((out / "run.json").read_text())
    assert RUN_KEYS <= set(record)
    digest = hashlib.md5(devel_path.read_bytes(), usedforsecurity=False).hexdigest()
    assert record["input_checksum"] == f"md5:{digest}"
    assert record["options"]["perturbation_key"] == "condition"
    assert record["options"]["covariate_key"] == "cell_type"
    assert record["n_cells"] == 5961 and record["n_perturbations"] == 60


def test_options_reach_the_api(devel_path, tmp_path):
    out = tmp_path / "options"
    argv = [
        "de",
        str(devel_path),
        "--perturbation-key",
        "condition",
        "--covariate-key",
        "cell_type",
        "--subset",
        "dataset=norman19",
        "--method",
        "t-test_overestim_var",
        "--reference",
        "control",
        "--half",
        "truth",
        "--seed",
        "3",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    expected = scperteval.de(
        devel_path,
        perturbation_key="condition",
        covariate_key="cell_type",
        subset={"dataset": ["norman19"]},
        method="t-test_overestim_var",
        reference="control",
        half="truth",
        seed=3,
    )
    table = pd.read_parquet(out / "de.parquet")
    pd.testing.assert_frame_equal(plain(table), plain(expected), check_exact=True)
    assert set(table["covariate"]) == {"k562"}
    options = json.loads((out / "run.json").read_text())["options"]
    assert options["subset"] == {"dataset": ["norman19"]} and options["seed"] == 3


def test_raw_counts_error_exit_2(counts_path, tmp_path, capsys):
    out = tmp_path / "counts"
    status = main(["de", str(counts_path), "--out", str(out)])
    captured = capsys.readouterr()
    assert status == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"scperteval: error: {counts_path}: X looks like raw counts")
    assert "--normalize" in lines[0]
    assert not (out / "de.parquet").exists()
    # Accepted once normalised.
    # (Its stimulated and unstimulated cells are two screens under the same labels.)
    arguments = ["de", str(counts_path), "--normalize", "--covariate-key", "condition"]
    assert main([*arguments, "--out", str(out)]) == 0
    assert (out / "de.parquet").exists()


def test_console_script_reports_errors_with_status_2(tmp_path):
    script = shutil.which("scperteval", path=sysconfig.get_path("scripts")) or shutil.which(
        "scperteval"
    )
    if script is None:
        pytest.skip("console script 'scperteval' is not installed")
    missing = tmp_path / "absent.h5ad"
    completed = subprocess.run(
        [script, "de", str(missing), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip() == f"scperteval: error: {missing}: file not found"
    assert completed.stdout == ""


def test_the_program_tunes_the_collector_and_a_call_from_python_does_not() -> None:
    script = (
        "import gc, sys\n"
        "from scperteval import cli\n"
        "before = (gc.get_threshold(), gc.get_freeze_count())\n"
        "assert cli.main(['list', 'metrics']) == 0\n"
        "assert (gc.get_threshold(), gc.get_freeze_count()) == before, before\n"
        "assert cli.console_main() == 0\n"
        "assert gc.get_threshold()[0] == cli.GC_THRESHOLD\n"
        "assert gc.get_freeze_count() > 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "list", "metrics"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "pearson" in done.stdout
