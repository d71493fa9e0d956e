"""Calibration under a split, its verdict changes, and fold runs pooled by ``report``."""

from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from scperteval.context import Context
from scperteval.data.load import load_dataset
from scperteval.engine.calibrators import Thresholds, calibration_table
from scperteval.errors import DatasetError
from scperteval.simulation import simulate, simulate_predictions
from scperteval.splits.split import Split
from scperteval.workflows.calibrate import calibrate
from scperteval.workflows.report import report
from scperteval.workflows.score import score

N_FOLDS = 4
KEYS = ["covariate", "perturbation", "protocol", "source", "source_name"]
PROTOCOLS = "mse,pearson_delta_ctrl,rank_full"


@pytest.fixture(scope="module")
def simulated() -> ad.AnnData:
    return simulate(
        n_perturbations=16, n_genes=60, cells_per_perturbation=24, n_combinations=4, seed=5
    )


def _labels(adata: ad.AnnData) -> list[str]:
    return sorted(set(adata.obs["perturbation"].astype(str)) - {"control"})


@pytest.fixture(scope="module")
def split(simulated: ad.AnnData) -> Split:
    labels = _labels(simulated)
    return Split.from_folds({("all", p): str(i % N_FOLDS) for i, p in enumerate(labels)}, seed=7)


@pytest.fixture(scope="module")
def model(simulated: ad.AnnData) -> ad.AnnData:
    return simulate_predictions(simulated, "noisy_truth", noise=0.3, seed=2)


@pytest.fixture(scope="module")
def calibrated(simulated, split, tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrated") / "run"
    return calibrate(simulated, PROTOCOLS, split=split, min_perturbations=2, out=out), out


def _rows_of(prediction: ad.AnnData, labels: set[str]) -> ad.AnnData:
    keep = prediction.obs["perturbation"].astype(str).isin(labels).to_numpy()
    return prediction[keep].copy()


def _fold_labels(split: Split, fold: str) -> set[str]:
    return {label for _, label in split.test[fold]}


def _dense(adata: ad.AnnData) -> np.ndarray:
    matrix = adata.X.toarray() if hasattr(adata.X, "toarray") else adata.X
    return np.asarray(matrix, dtype=np.float64)


def _truth_halves(adata: ad.AnnData) -> dict[str, np.ndarray]:
    """Row positions of each perturbation's truth half (the run's seeded draw)."""
    context = Context(load_dataset(adata), seed=0, de_method="t-test")
    layout = context.layout
    return {
        c.perturbation: np.asarray(layout.positions(index, "truth"))
        for index, c in enumerate(layout.conditions)
    }


def test_dataset_mean_control_pools_the_training_fold(simulated, split, calibrated):
    """The mse negative control under the split, with NumPy: truth half vs training mean."""
    result, _ = calibrated
    dense = _dense(simulated)
    labels = simulated.obs["perturbation"].astype(str).to_numpy()
    centroids = {p: dense[labels == p].mean(axis=0) for p in _labels(simulated)}
    halves = _truth_halves(simulated)
    table = result.results
    rows = table[(table["source_name"] == "dataset_mean") & (table["protocol"] == "mse")]
    values = rows.set_index("perturbation")["value"]
    plain = result_unsplit_values(simulated)
    checked = 0
    for fold in split.folds:
        training = sorted(label for _, label in split.train[fold])
        fold_mean = np.mean([centroids[p] for p in training], axis=0)
        for label in _fold_labels(split, fold):
            truth = dense[halves[label]].mean(axis=0)
            assert values[label] == pytest.approx(np.mean((truth - fold_mean) ** 2), rel=1e-9)
            others = np.mean([centroids[p] for p in centroids if p != label], axis=0)
            assert plain[label] == pytest.approx(np.mean((truth - others) ** 2), rel=1e-9)
            checked += 1
    assert checked == len(_labels(simulated))


def result_unsplit_values(adata: ad.AnnData) -> pd.Series:
    unsplit = calibrate(adata, "mse", min_perturbations=2)
    rows = unsplit.results[unsplit.results["source_name"] == "dataset_mean"]
    return rows.set_index("perturbation")["value"]


def _overall(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["covariate"] == "all"].set_index("protocol")


def test_verdict_changes_compare_the_two_calibrations(simulated, split):
    """A threshold between the two median DRFs of mse flips its verdict, and only its."""
    first = calibrate(simulated, PROTOCOLS, split=split, min_perturbations=2)
    unsplit = calibrate(simulated, PROTOCOLS, min_perturbations=2)
    # The unsplit calibration of the split run is that of a run without the split.
    common = [c for c in first.unsplit_calibration.columns if c in unsplit.calibration]
    pd.testing.assert_frame_equal(
        first.unsplit_calibration[common].reset_index(drop=True),
        unsplit.calibration[common].reset_index(drop=True),
    )
    split_median = _overall(first.calibration).loc["mse", "drf_median"]
    unsplit_median = _overall(unsplit.calibration).loc["mse", "drf_median"]
    assert split_median != unsplit_median
    cut = (split_median + unsplit_median) / 2
    thresholds = Thresholds(bds_min=0.0, drf_min=float(cut))
    result = calibrate(
        simulated, PROTOCOLS, split=split, min_perturbations=2, thresholds=thresholds
    )
    changes = result.verdict_changes.set_index("protocol")
    # The comparison, computed here from the two calibration tables.
    split_table = calibration_table(result.results, _meta(), thresholds)
    plain = calibrate(simulated, PROTOCOLS, min_perturbations=2, thresholds=thresholds)
    expected = _overall(split_table)["trusted"].astype(bool) != _overall(plain.calibration)[
        "trusted"
    ].astype(bool)
    assert changes["changed"].to_dict() == expected.to_dict()
    assert changes.loc["mse", "changed"]
    assert bool(changes.loc["mse", "trusted_unsplit"]) == (unsplit_median >= cut)
    assert changes.loc["mse", "drf_median_split"] == split_median
    assert changes.loc["mse", "drf_median_unsplit"] == unsplit_median
    # The summary names the protocol with both medians.
    text = result.summary()
    assert f"DRF median {unsplit_median:.3f} -> {split_median:.3f}" in text
    assert f"under the split {int(expected.sum())} of 3 verdicts change" in text


def _meta() -> dict[str, dict[str, object]]:
    from scperteval.engine.suites import resolve_protocols

    return {
        p.name: {"better": p.better, "perfect": p.perfect} for p in resolve_protocols(PROTOCOLS)
    }


def test_calibration_run_records_its_split(split, calibrated):
    result, out = calibrated
    record = json.loads((out / "run.json").read_text())
    stored = record["options"]["split"] if "split" in record.get("options", {}) else record["split"]
    assert stored["sha256"] == split.digest()
    assert stored["layout"] == "k-fold"
    assert stored["folds"] == {fold: len(split.test[fold]) for fold in split.folds}
    changes = pd.read_csv(out / "verdict_changes.csv")
    assert list(changes["protocol"]) == PROTOCOLS.split(",")
    assert (out / "calibration_unsplit.csv").is_file()
    assert stored is not None and result.info["split"]["sha256"] == split.digest()


def test_unsplit_calibration_writes_no_comparison(simulated, tmp_path):
    result = calibrate(simulated, "mse", min_perturbations=2, out=tmp_path / "plain")
    assert result.verdict_changes.empty and "split" not in result.info
    assert not (tmp_path / "plain" / "verdict_changes.csv").exists()
    assert "under the split" not in result.summary()


def _fold_runs(simulated, split, model, tmp_path, protocols="mse,pearson_delta_ctrl,rank_full"):
    folders = []
    for fold in split.folds:
        folder = tmp_path / f"fold{fold}"
        score(
            simulated,
            {"m": _rows_of(model, _fold_labels(split, fold))},
            protocols=protocols,
            split=split,
            allow_missing=True,
            min_perturbations=2,
            out=folder,
            figures=False,
        )
        folders.append(folder)
    return folders


def test_report_pools_fold_runs_into_the_split_run(simulated, split, model, tmp_path):
    whole = score(
        simulated,
        {"m": model},
        protocols=PROTOCOLS,
        split=split,
        min_perturbations=2,
        figures=False,
    )
    folders = _fold_runs(simulated, split, model, tmp_path)
    pooled = report(folders, out=tmp_path / "pooled", figures=False)
    ours = pooled.results.set_index(KEYS).sort_index()
    theirs = whole.results.set_index(KEYS).sort_index()
    assert ours.index.equals(theirs.index)
    np.testing.assert_array_equal(ours["value"].to_numpy(), theirs["value"].to_numpy())
    pd.testing.assert_frame_equal(pooled.leaderboard.headline, whole.leaderboard.headline)
    pd.testing.assert_frame_equal(
        pooled.fold_scores.reset_index(drop=True), whole.fold_scores.reset_index(drop=True)
    )
    assert pooled.info["pooled_folds"] == sorted(split.folds)
    # The criterion equals the split run's, on the protocol added for it alone too.
    assert {"l2_heg1000", "mse"} <= set(whole.criterion["protocol"])
    assert "l2_heg1000" not in set(pooled.results["protocol"])
    pd.testing.assert_frame_equal(
        pooled.criterion.reset_index(drop=True), whole.criterion.reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(
        pooled.fold_summary.reset_index(drop=True), whole.fold_summary.reset_index(drop=True)
    )
    written = pd.read_csv(tmp_path / "pooled" / "mean_ratio.csv")
    assert set(written["protocol"]) == set(whole.criterion["protocol"])
    # The pooled folder pools again, as a single run of every fold.
    again = report([tmp_path / "pooled"], out=tmp_path / "again", figures=False)
    pd.testing.assert_frame_equal(again.leaderboard.headline, whole.leaderboard.headline)


def test_report_pools_older_fold_runs_without_the_added_criterion_values(
    simulated, split, model, tmp_path
):
    from scperteval.errors import ScpertevalWarning
    from scperteval.scoring.result import CRITERION_VALUES_FILE

    folders = _fold_runs(simulated, split, model, tmp_path)
    (folders[1] / CRITERION_VALUES_FILE).unlink()
    with pytest.warns(ScpertevalWarning, match="leaves out the protocols added for it alone"):
        pooled = report(folders, out=tmp_path / "pooled", figures=False)
    assert "mse" in set(pooled.criterion["protocol"])
    assert "l2_heg1000" not in set(pooled.criterion["protocol"])


def test_report_refuses_fold_runs_that_do_not_pool(simulated, split, model, tmp_path):
    folders = _fold_runs(simulated, split, model, tmp_path, protocols="mse")
    with pytest.raises(DatasetError, match=r"both scored fold '0' \(mse\)"):
        report([folders[0], folders[0]], out=tmp_path / "twice", figures=False)
    labels = _labels(simulated)
    other = Split.from_folds(
        {("all", p): str((i + 1) % N_FOLDS) for i, p in enumerate(labels)}, seed=7
    )
    shifted = tmp_path / "shifted"
    score(
        simulated,
        {"m": _rows_of(model, _fold_labels(other, "1"))},
        protocols="mse",
        split=other,
        allow_missing=True,
        out=shifted,
        figures=False,
    )
    with pytest.raises(DatasetError, match="different splits"):
        report([folders[0], shifted], out=tmp_path / "mixed", figures=False)
    plain = tmp_path / "plain"
    score(simulated, {"u": model}, protocols="mse", out=plain, figures=False)
    with pytest.raises(DatasetError, match="it has no split"):
        report([folders[0], plain], out=tmp_path / "unsplit", figures=False)
    for name in ("twice", "mixed", "unsplit"):
        assert not (tmp_path / name).exists()


def test_score_under_a_split_states_the_verdict_changes(simulated, split, model, tmp_path):
    """Score's comparison equals that of the two calibrations, and reaches the terminal."""
    from scperteval.cli._score import split_lines

    first = calibrate(simulated, PROTOCOLS, split=split, min_perturbations=2)
    split_median = _overall(first.calibration).loc["mse", "drf_median"]
    unsplit_median = _overall(first.unsplit_calibration).loc["mse", "drf_median"]
    thresholds = Thresholds(bds_min=0.0, drf_min=float((split_median + unsplit_median) / 2))
    scored = score(
        simulated,
        {"m": model},
        protocols=PROTOCOLS,
        split=split,
        thresholds=thresholds,
        min_perturbations=2,
        out=tmp_path / "run",
        figures=False,
    )
    split_run = calibrate(
        simulated, PROTOCOLS, split=split, min_perturbations=2, thresholds=thresholds
    )
    unsplit_run = calibrate(simulated, PROTOCOLS, min_perturbations=2, thresholds=thresholds)
    expected = _overall(split_run.calibration)["trusted"].astype(bool) != _overall(
        unsplit_run.calibration
    )["trusted"].astype(bool)
    changes = scored.verdict_changes.set_index("protocol")["changed"]
    assert changes.to_dict() == expected.to_dict()
    assert changes["mse"]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["options"]["split"]["verdict_changes"] == list(expected.index[expected])
    written = pd.read_csv(tmp_path / "run" / "verdict_changes.csv")
    assert written["changed"].tolist() == scored.verdict_changes["changed"].tolist()
    lines = split_lines(scored)
    assert any(line.startswith("mse: ") and "under it" in line for line in lines)


def test_calibrate_command_under_a_split(simulated, split, tmp_path, capsys):
    from scperteval.cli import main

    data = tmp_path / "data.h5ad"
    simulated.write_h5ad(data)
    table = tmp_path / "split.csv"
    split.to_frame().query("role == 'test'")[["perturbation", "fold"]].to_csv(table, index=False)
    code = main(
        ["calibrate", str(data), "-p", "mse", "--split", str(table), "--out", str(tmp_path / "c")]
    )
    printed = capsys.readouterr().out
    assert code == 0
    record = json.loads((tmp_path / "c" / "run.json").read_text())
    stored = record["options"]["split"] if "split" in record["options"] else record["split"]
    assert stored["sha256"] == split.digest()
    assert stored["verdict_changes"] == []
    assert "under the split no verdict changes (1 protocol compared)" in printed
    assert "verdict_changes.csv" in printed
