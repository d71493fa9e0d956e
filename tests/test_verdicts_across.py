"""Reports over several runs: same models with different protocols, and different datasets."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from scperteval.errors import DatasetError
from scperteval.scoring.across import AcrossDatasets
from scperteval.simulation import simulate, simulate_predictions
from scperteval.workflows.report import report
from scperteval.workflows.score import score

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PROTOCOLS = "pearson_delta_ctrl,mse,rank_full"


def _noisy(adata: ad.AnnData, columns: list[str], seed: int) -> ad.AnnData:
    rng = np.random.default_rng(seed)
    dense = adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)
    keep = adata.obs["condition"].astype(str).to_numpy() != "control"
    cells = dense[keep]
    obs = adata.obs.loc[keep, columns].astype(str).copy()
    obs.index = [f"c{i}" for i in range(len(obs))]
    values = cells * np.exp(rng.normal(0.0, 0.3, cells.shape))
    return ad.AnnData(np.asarray(values, dtype=np.float32), obs=obs, var=adata.var[[]].copy())


def test_norman_and_mcfaline_give_one_column_per_dataset(devel_path: Path, tmp_path: Path) -> None:
    adata = ad.read_h5ad(devel_path)
    norman = adata[adata.obs["dataset"] == "norman19"].copy()
    mcfaline = adata[adata.obs["dataset"] == "mcfaline23"].copy()
    common = {"protocols": PROTOCOLS, "figures": False, "workers": 2, "progress": False}
    score(
        devel_path,
        {"good": _noisy(norman, ["condition"], 1)},
        perturbation_key="condition",
        subset={"dataset": ["norman19"]},
        out=tmp_path / "norman",
        **common,
    )
    score(
        devel_path,
        {"good": _noisy(mcfaline, ["condition", "cell_type"], 2)},
        perturbation_key="condition",
        covariate_key="cell_type",
        subset={"dataset": ["mcfaline23"]},
        out=tmp_path / "mcfaline",
        **common,
    )
    summary = report([tmp_path / "norman", tmp_path / "mcfaline"], out=tmp_path / "both")
    assert isinstance(summary, AcrossDatasets)
    assert len(summary.datasets) == 2
    assert any("norman19" in d for d in summary.datasets)
    assert any("mcfaline23" in d for d in summary.datasets)
    table = pd.read_csv(tmp_path / "both" / "datasets.csv")
    assert list(table.columns) == [
        "model",
        "kind",
        *summary.datasets,
        "mean_rank",
        "win_rate",
        "n_datasets",
    ]
    for label, result in summary.results.items():
        board = result.leaderboard.table.set_index("model")
        got = table.set_index("model")[label]
        expected = board["score"].reindex(got.index).to_numpy(dtype=float)
        np.testing.assert_allclose(got.to_numpy(dtype=float), expected)
        ranks = board["rank"].dropna()
        assert ranks.loc["good"] == 1 or ranks.loc["good"] <= ranks.max()
    good = table.set_index("model").loc["good"]
    ranked = {
        label: r.leaderboard.table.set_index("model")["rank"]
        for label, r in summary.results.items()
    }
    listing = {
        label: r.leaderboard.table.set_index("model")["listing"]
        for label, r in summary.results.items()
    }
    assert all(listing[label]["good"] == "ranked" for label in summary.datasets)
    expected = np.mean([float(ranked[label]["good"]) for label in summary.datasets])
    assert good["mean_rank"] == pytest.approx(expected)
    # win rate by hand: comparisons won over every dataset and every other scored entry
    wins = total = 0.0
    for label in summary.datasets:
        scores = table.set_index("model")[label].dropna()
        others = scores.drop("good")
        wins += float((scores["good"] > others).sum() + 0.5 * (scores["good"] == others).sum())
        total += len(others)
    assert good["win_rate"] == pytest.approx(wins / total)
    for name in ("datasets.md", "datasets.tex", "datasets.html", "datasets_long.csv"):
        assert (tmp_path / "both" / name).stat().st_size > 0
    assert "norman19" in (tmp_path / "both" / "datasets.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def simulated() -> ad.AnnData:
    return simulate(n_perturbations=12, n_genes=60, cells_per_perturbation=30, seed=4)


def test_adding_a_protocol_by_merging_equals_one_run(simulated, tmp_path: Path) -> None:
    models = {
        "good": simulate_predictions(simulated, "noisy_truth", noise=0.1, seed=1),
        "mean": simulate_predictions(simulated, "mean", seed=2),
    }
    options = {"figures": False, "progress": False}
    both = score(simulated, models, protocols="mse_top_k,weighted_mse,rank_full", **options)
    score(simulated, models, protocols="mse_top_k,weighted_mse", out=tmp_path / "old", **options)
    score(simulated, models, protocols="rank_full", out=tmp_path / "new", **options)
    merged = report([tmp_path / "old", tmp_path / "new"], out=tmp_path / "merged", figures=False)
    pd.testing.assert_frame_equal(merged.leaderboard.table, both.leaderboard.table)
    pd.testing.assert_frame_equal(
        merged.pairs.reset_index(drop=True), both.pairs.reset_index(drop=True)
    )
    assert merged.info["protocols"] == ["mse_top_k", "weighted_mse", "rank_full"]


def test_merging_different_predictions_of_one_model_fails(simulated, tmp_path: Path) -> None:
    options = {"figures": False, "progress": False, "protocols": "mse_top_k"}
    first = simulate_predictions(simulated, "noisy_truth", noise=0.1, seed=1)
    other = simulate_predictions(simulated, "noisy_truth", noise=0.3, seed=5)
    score(simulated, {"good": first}, out=tmp_path / "a", **options)
    score(simulated, {"good": other}, out=tmp_path / "b", **options)
    with pytest.raises(DatasetError, match="scored differently"):
        report([tmp_path / "a", tmp_path / "b"], out=tmp_path / "m", figures=False)
