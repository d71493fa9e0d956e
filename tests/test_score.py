"""Scoring models: calibrated leaderboards, paired tests, CIs, stored-result reports."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.stats import rankdata

from scperteval.errors import DatasetError
from scperteval.scoring.calibrated import bootstrap_ci, calibrated_values
from scperteval.scoring.significance import paired_tests
from scperteval.simulation import simulate, simulate_predictions
from scperteval.workflows.report import report
from scperteval.workflows.score import score

FAST_PROTOCOLS = (
    "pearson_delta_ctrl_top_k,mse_top_k,weighted_mse,weighted_r2_delta_pert,"
    "rank_full,pds,energy_pca,de_topk_overlap"
)


def _norman_models(adata: ad.AnnData, seed: int = 0) -> dict[str, ad.AnnData]:
    """Models whose quality is known by construction (built from the raw cells)."""
    rng = np.random.default_rng(seed)
    dense = adata.X.toarray()
    labels = adata.obs["condition"].astype(str).to_numpy()
    control = labels == "control"
    perturbations = sorted(set(labels[~control]))
    centroids = np.vstack([dense[labels == p].mean(axis=0) for p in perturbations])

    def make(name: str, matrix: np.ndarray, names: list[str] | np.ndarray) -> ad.AnnData:
        obs = pd.DataFrame(
            {"condition": list(names)}, index=[f"{name}{i}" for i in range(len(names))]
        )
        return ad.AnnData(np.asarray(matrix, dtype=np.float64), obs=obs, var=adata.var[[]].copy())

    total = centroids.sum(axis=0)
    mean_rows = (total - centroids) / (len(perturbations) - 1)
    sampled = []
    control_rows = np.flatnonzero(control)
    for _ in perturbations:
        sampled.append(dense[rng.choice(control_rows, 50, replace=False)])
    return {
        "mean_model": make("m", mean_rows, perturbations),
        "noise_low": make(
            "a", dense[~control] + rng.normal(0, 0.2, dense[~control].shape), labels[~control]
        ),
        "noise_high": make(
            "b", dense[~control] + rng.normal(0, 0.5, dense[~control].shape), labels[~control]
        ),
        "control_relabelled": make("c", np.vstack(sampled), np.repeat(perturbations, 50)),
        "mode_collapse": make(
            "d", np.repeat(centroids[:1], len(perturbations), axis=0), perturbations
        ),
    }


@pytest.fixture(scope="module")
def norman_run(devel_path: Path, tmp_path_factory: pytest.TempPathFactory):
    adata = ad.read_h5ad(devel_path)
    adata = adata[adata.obs["dataset"] == "norman19"].copy()
    out = tmp_path_factory.mktemp("norman_score")
    result = score(
        adata,
        _norman_models(adata),
        protocols=FAST_PROTOCOLS,
        perturbation_key="condition",
        out=out,
        figures=False,
        workers=2,
    )
    return result, out


def test_leaderboard_orders_models_by_construction(norman_run) -> None:
    result, _ = norman_run
    table = result.leaderboard.table.set_index("model")
    scores = table["score"]
    assert scores["technical_duplicate"] == pytest.approx(1.0, abs=0.05)
    assert scores["dataset_mean"] == pytest.approx(0.0, abs=0.1)
    assert scores["noise_low"] > scores["noise_high"] > scores["mean_model"]
    assert scores["noise_low"] > scores["control_relabelled"]
    assert scores["mode_collapse"] < scores["mean_model"]
    assert result.leaderboard.trusted, "some protocols must be trusted on Norman"
    ranks = table["rank"]
    assert ranks["noise_low"] < ranks["noise_high"]
    # Pseudobulk predictions have no population protocols: every model is ranked on
    # the protocols they all cover, and the cell-level models again on the others.
    board = result.leaderboard
    for name in ("mode_collapse", "mean_model"):
        assert table.loc[name, "listing"] == "ranked"
        assert ranks[name] > ranks["noise_low"]
        assert np.isnan(table.loc[name, "population_score"])
    assert np.isfinite(table.loc["noise_low", "population_score"])
    ranked = table[table["listing"] == "ranked"]
    expected = rankdata(-ranked["score"].to_numpy(dtype=float), method="min")
    np.testing.assert_array_equal(ranked["rank"].to_numpy(dtype=float), expected)
    left = [p for p in board.trusted if p not in board.ranked_protocols]
    assert left and set(left) <= set(board.population_protocols)
    named = board.ranking.partition("all but ")[2].partition(";")[0].split(", ")
    assert sorted(named) == sorted(left) and str(len(board.ranked_protocols)) in board.ranking
    assert table.loc["mode_collapse", "flags"] == "mode collapse"


def test_pseudobulk_models_skip_population_protocols(norman_run) -> None:
    result, _ = norman_run
    rows = result.results
    pseudo = rows[(rows["source_name"] == "mean_model") & (rows["protocol"] == "energy_pca")]
    assert pseudo["value"].isna().all()
    assert result.info["models"]["mean_model"]["pseudobulk"] is True
    assert result.info["models"]["noise_low"]["pseudobulk"] is False


def test_calibrated_column_matches_definition(norman_run) -> None:
    result, _ = norman_run
    rows = result.results
    protocol = "mse_top_k"
    part = rows[rows["protocol"] == protocol]
    wide = part.pivot_table(
        index="perturbation", columns="source_name", values="value", aggfunc="first"
    )
    controls = part[part["source"].isin(["positive", "negative"])].pivot_table(
        index="perturbation", columns="source", values="value", aggfunc="first"
    )
    model = wide["noise_low"]
    expected = (model - controls["negative"]) / (controls["positive"] - controls["negative"])
    ok = controls["positive"] < controls["negative"]
    got = part[part["source_name"] == "noise_low"].set_index("perturbation")["calibrated"]
    np.testing.assert_allclose(got[ok.index[ok]], expected[ok], rtol=1e-12)
    assert got[ok.index[~ok]].isna().all()


def test_report_reproduces_the_leaderboard(norman_run, tmp_path: Path) -> None:
    result, out = norman_run
    again = report(out, out=tmp_path, figures=False)
    pd.testing.assert_frame_equal(again.leaderboard.table, result.leaderboard.table)
    stored = pd.read_csv(out / "leaderboard.csv")
    rebuilt = pd.read_csv(tmp_path / "leaderboard.csv")
    pd.testing.assert_frame_equal(stored, rebuilt)


def test_calibrated_values_nan_rules() -> None:
    values = np.array([0.5, 0.5, 0.5, 0.5])
    positive = np.array([1.0, 0.2, 0.3, np.nan])
    negative = np.array([0.0, 0.4, 0.3, 0.0])
    got = calibrated_values(values, positive, negative, "higher")
    assert got[0] == pytest.approx(0.5)
    assert np.isnan(got[1])  # positive not better
    assert np.isnan(got[2])  # no gap
    assert np.isnan(got[3])  # NaN control
    lower = calibrated_values(np.array([0.04]), np.array([0.02]), np.array([0.05]), "lower")
    assert lower[0] == pytest.approx(1 / 3)


def test_bootstrap_ci_agrees_with_scipy() -> None:
    rng = np.random.default_rng(5)
    values = rng.normal(1.0, 2.0, size=200)
    for statistic, function in (("mean", np.mean), ("median", np.median)):
        low, high = bootstrap_ci(values, statistic, n_resamples=20000, seed=1)
        reference = stats.bootstrap(
            (values,), function, n_resamples=20000, method="percentile", random_state=2
        ).confidence_interval
        assert low == pytest.approx(reference.low, abs=0.06)
        assert high == pytest.approx(reference.high, abs=0.06)


def _toy_results() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    values = {
        "good": rng.normal(0.8, 0.1, 30),
        "bad": rng.normal(0.4, 0.1, 30),
        "dataset_mean": rng.normal(0.5, 0.1, 30),
    }
    for name, series in values.items():
        for i, value in enumerate(series):
            rows.append(
                {
                    "covariate": "all",
                    "perturbation": f"p{i}",
                    "protocol": "pearson",
                    "source": "baseline" if name == "dataset_mean" else "model",
                    "source_name": name,
                    "value": value,
                }
            )
    return pd.DataFrame(rows), values


@pytest.mark.parametrize("correction", ["bonferroni", "bh"])
def test_paired_tests_match_scipy(correction: str) -> None:
    table, values = _toy_results()
    tests = paired_tests(
        table, {"pearson": "higher"}, ["good", "bad"], ["dataset_mean"], correction
    )
    tests = tests.set_index("model")
    raw = {}
    for model in ("good", "bad"):
        t = stats.ttest_rel(values[model], values["dataset_mean"], alternative="greater")
        w = stats.wilcoxon(values[model], values["dataset_mean"], alternative="greater")
        assert tests.loc[model, "t_pvalue"] == pytest.approx(t.pvalue, rel=1e-12)
        assert tests.loc[model, "wilcoxon_pvalue"] == pytest.approx(w.pvalue, rel=1e-12)
        raw[model] = t.pvalue
    if correction == "bonferroni":
        expected = {m: min(p * 2, 1.0) for m, p in raw.items()}
    else:
        adjusted = stats.false_discovery_control([raw["good"], raw["bad"]])
        expected = {"good": adjusted[0], "bad": adjusted[1]}
    for model, value in expected.items():
        assert tests.loc[model, "t_pvalue_adj"] == pytest.approx(value, rel=1e-12)
    assert tests.loc["good", "t_pvalue_adj"] < 0.05 < tests.loc["bad", "t_pvalue_adj"]


def test_lower_is_better_tests_use_the_other_tail() -> None:
    table, values = _toy_results()
    tests = paired_tests(table, {"pearson": "lower"}, ["bad"], ["dataset_mean"]).set_index("model")
    t = stats.ttest_rel(values["bad"], values["dataset_mean"], alternative="less")
    assert tests.loc["bad", "t_pvalue"] == pytest.approx(t.pvalue, rel=1e-12)


@pytest.fixture(scope="module")
def simulated() -> ad.AnnData:
    return simulate(
        n_perturbations=8, n_genes=80, cells_per_perturbation=40, n_combinations=2, seed=2
    )


def test_missing_perturbation_is_an_error_unless_allowed(
    simulated: ad.AnnData, tmp_path: Path
) -> None:
    prediction = simulate_predictions(simulated, "noisy_truth", noise=0.1)
    first = prediction.obs["perturbation"].astype(str).iloc[0]
    partial = prediction[prediction.obs["perturbation"].astype(str) != first].copy()
    with pytest.raises(DatasetError, match=rf"not predicted: '{first}'.*allow_missing"):
        score(simulated, {"partial": partial}, protocols="mse", figures=False)
    result = score(
        simulated, {"partial": partial}, protocols="mse", allow_missing=True, baselines=False
    )
    coverage = result.info["models"]["partial"]["coverage"]
    n = simulated.obs["perturbation"].nunique() - 1
    assert coverage == pytest.approx((n - 1) / n)
    rows = result.results[result.results["source_name"] == "partial"]
    assert rows.loc[rows["perturbation"] == first, "value"].isna().all()


def test_genes_aligned_by_name(simulated: ad.AnnData) -> None:
    prediction = simulate_predictions(simulated, "noisy_truth", noise=0.0)
    shuffled = prediction[:, prediction.var_names[::-1]].copy()
    a = score(simulated, {"m": prediction}, protocols="mse,pearson_delta_ctrl", baselines=False)
    b = score(simulated, {"m": shuffled}, protocols="mse,pearson_delta_ctrl", baselines=False)
    pd.testing.assert_frame_equal(a.results, b.results)
    missing = prediction[:, prediction.var_names[1:]].copy()
    with pytest.raises(DatasetError, match="missing"):
        score(simulated, {"m": missing}, protocols="mse", baselines=False)


def test_merge_runs_equals_one_run(simulated: ad.AnnData, tmp_path: Path) -> None:
    good = simulate_predictions(simulated, "noisy_truth", noise=0.1, seed=1)
    mean = simulate_predictions(simulated, "mean", seed=1)
    protocols = "mse_top_k,weighted_mse,rank_full"
    both = score(
        simulated,
        {"good": good, "mean": mean},
        protocols=protocols,
        out=tmp_path / "both",
        figures=False,
    )
    score(simulated, {"good": good}, protocols=protocols, out=tmp_path / "a", figures=False)
    score(simulated, {"mean": mean}, protocols=protocols, out=tmp_path / "b", figures=False)
    merged = report([tmp_path / "a", tmp_path / "b"], out=tmp_path / "merged", figures=False)
    pd.testing.assert_frame_equal(merged.leaderboard.table, both.leaderboard.table)
    score(
        simulated, {"other": good}, protocols=protocols, seed=7, out=tmp_path / "c", figures=False
    )
    with pytest.raises(DatasetError, match="different seed"):
        report([tmp_path / "a", tmp_path / "c"], out=tmp_path / "bad", figures=False)


def test_plain_mode_scores_all_truth_cells(simulated: ad.AnnData) -> None:
    good = simulate_predictions(simulated, "noisy_truth", noise=0.05)
    mean = simulate_predictions(simulated, "mean")
    result = score(
        simulated,
        {"good": good, "mean": mean},
        protocols="mse,rank_full",
        truth="all",
        baselines=False,
    )
    assert not result.leaderboard.calibrated
    assert set(result.results["source"]) == {"model"}
    table = result.leaderboard.table.set_index("model")
    assert table.loc["good", "rank"] == 1
    assert table.loc["good", "mse"] < table.loc["mean", "mse"]
