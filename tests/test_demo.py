"""The one-command demo, end to end."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scperteval.cli import main


def test_demo_writes_a_report_that_ranks_models_by_construction(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "report.html" in printed
    for name in ("report.html", "leaderboard.csv", "results.parquet", "run.json"):
        assert (tmp_path / name).is_file()
    board = pd.read_csv(tmp_path / "leaderboard.csv").set_index("model")["score"]
    assert board["technical_duplicate"] > 0.9
    assert abs(board["dataset_mean"]) < 0.15
    assert (
        board["replicate_plus_noise_0.1"]
        > board["replicate_plus_noise_0.4"]
        > board["replicate_half_effect"]
        > board["mean_prediction"]
    )
    assert board["control_relabelled"] < board["mean_prediction"]
