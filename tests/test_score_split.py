"""Scoring under a split: training-fold baselines, pooled folds, per-fold predictions."""

from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from scperteval.errors import DatasetError, SpecError
from scperteval.scoring.mean_ratio import error_ratio_interval
from scperteval.simulation import simulate, simulate_predictions
from scperteval.splits.split import Split
from scperteval.workflows.report import report
from scperteval.workflows.score import score

N_FOLDS = 4
KEYS = ["covariate", "perturbation", "protocol", "source", "source_name"]


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


def _rows_of(prediction: ad.AnnData, labels: set[str]) -> ad.AnnData:
    keep = prediction.obs["perturbation"].astype(str).isin(labels).to_numpy()
    return prediction[keep].copy()


def _fold_labels(split: Split, fold: str) -> set[str]:
    return {label for _, label in split.test[fold]}


def _centroids(adata: ad.AnnData) -> tuple[dict[str, np.ndarray], np.ndarray]:
    dense = np.asarray(
        adata.X.toarray() if hasattr(adata.X, "toarray") else adata.X, dtype=np.float64
    )
    labels = adata.obs["perturbation"].astype(str).to_numpy()
    means = {p: dense[labels == p].mean(axis=0) for p in set(labels)}
    return means, means.pop("control")


def test_training_mean_baseline_equals_numpy_per_fold(simulated, split, model):
    """Each fold's Mean baseline and its values, with NumPy alone, under several protocols."""
    result = score(
        simulated,
        {"m": model},
        protocols="mse,l2,mae,pearson_delta_ctrl,cosine_delta_ctrl",
        truth="all",
        split=split,
        figures=False,
    )
    centroids, control = _centroids(simulated)
    rows = result.results[result.results["source_name"] == "dataset_mean"].set_index(
        ["perturbation", "protocol"]
    )["value"]
    checked = 0
    for fold in split.folds:
        training = sorted(label for _, label in split.train[fold])
        mean = np.mean([centroids[p] for p in training], axis=0)
        for label in _fold_labels(split, fold):
            truth = centroids[label]
            expected = {
                "mse": np.mean((truth - mean) ** 2),
                "l2": np.sqrt(np.sum((truth - mean) ** 2)),
                "mae": np.mean(np.abs(truth - mean)),
                "pearson_delta_ctrl": np.corrcoef(truth - control, mean - control)[0, 1],
                "cosine_delta_ctrl": np.dot(truth - control, mean - control)
                / np.linalg.norm(truth - control)
                / np.linalg.norm(mean - control),
            }
            for protocol, value in expected.items():
                assert rows[(label, protocol)] == pytest.approx(value, rel=1e-9)
                checked += 1
    assert checked == 5 * len(_labels(simulated))
    # Without the split, the mean is of every other perturbation: a different value.
    plain = score(simulated, {"m": model}, protocols="mse", truth="all", figures=False)
    loo = plain.results[plain.results["source_name"] == "dataset_mean"].set_index("perturbation")
    label = sorted(_fold_labels(split, "0"))[0]
    assert loo.loc[label, "value"] != pytest.approx(rows[(label, "mse")], rel=1e-6)


def test_pooled_values_equal_each_fold_scored_alone(simulated, split, model):
    protocols = "mse,pearson_delta_ctrl,mse_top_k,rank_full,energy_pca"
    pooled = score(
        simulated,
        {"m": model},
        protocols=protocols,
        split=split,
        figures=False,
        min_perturbations=2,
    )
    assert set(pooled.results["fold"]) == set(split.folds)
    parts = []
    for fold in split.folds:
        alone = Split(test={fold: split.test[fold]}, train={fold: split.train[fold]})
        own = _rows_of(model, _fold_labels(split, fold))
        result = score(
            simulated,
            {"m": own},
            protocols=protocols,
            split=alone,
            figures=False,
            min_perturbations=2,
        )
        parts.append(result.results)
        # A fold's headline is the run of that fold alone.
        headline = result.leaderboard.headline.set_index("model")["score"]
        own_scores = pooled.fold_scores[pooled.fold_scores["fold"] == fold]
        np.testing.assert_array_equal(
            own_scores.set_index("model")["score"].reindex(headline.index).to_numpy(),
            headline.to_numpy(),
        )
    joined = pd.concat(parts).set_index(KEYS).sort_index()
    whole = pooled.results.set_index(KEYS).sort_index()
    assert whole.index.equals(joined.index)
    np.testing.assert_array_equal(whole["value"].to_numpy(), joined["value"].to_numpy())
    # Every source was scored: models, baselines and both controls.
    assert {"model", "baseline", "positive", "negative"} <= set(whole.index.get_level_values(3))
    fold_table = pooled.fold_scores
    assert set(fold_table["fold"]) == set(split.folds)
    summary = pooled.fold_summary.set_index("model")
    for name, own in fold_table.groupby("model"):
        finite = own["score"].dropna().to_numpy(dtype=float)
        assert summary.loc[name, "folds_scored"] == finite.size
        if finite.size:
            assert summary.loc[name, "fold_min"] == finite.min()
            assert summary.loc[name, "fold_max"] == finite.max()
    assert summary["folds_scored"].max() > 0


def test_criterion_matches_a_textbook_bootstrap_of_the_l2_ratio(simulated, split, model):
    result = score(
        simulated, {"m": model}, protocols="mse", truth="all", split=split, figures=False
    )
    centroids, control = _centroids(simulated)
    # 60 genes: the 1,000 most expressed in controls are all of them.
    dense = np.asarray(
        model.X.toarray() if hasattr(model.X, "toarray") else model.X, dtype=np.float64
    )
    predicted = model.obs["perturbation"].astype(str).to_numpy()
    ratios = []
    for label in _labels(simulated):
        fold = split.fold_of(("all", label))
        assert fold is not None
        training = sorted(p for _, p in split.train[fold])
        mean = np.mean([centroids[p] for p in training], axis=0)
        truth = centroids[label]
        ratios.append(
            np.linalg.norm(dense[predicted == label].mean(axis=0) - truth)
            / np.linalg.norm(mean - truth)
        )
    ratios_array = np.asarray(ratios)
    rng = np.random.default_rng(0)
    size = ratios_array.size
    means = [ratios_array[rng.integers(0, size, size)].mean() for _ in range(10_000)]
    low, high = np.percentile(means, [2.5, 97.5])
    row = result.criterion.set_index(["model", "protocol"]).loc[("m", "l2_heg1000")]
    assert row["mean_ratio"] == pytest.approx(ratios_array.mean(), rel=1e-9)
    assert row["ci_low"] == pytest.approx(low, rel=1e-9)
    assert row["ci_high"] == pytest.approx(high, rel=1e-9)
    assert bool(row["outperforms"]) == (high < 1)
    # mse is an error protocol too; the added L2 protocol is not ranked.
    assert set(result.criterion["protocol"]) == {"mse", "l2_heg1000"}
    assert "l2_heg1000" not in set(result.results["protocol"])
    summary = result.fold_summary.set_index("model")
    assert summary.loc["m", "mean_ratio_high"] == pytest.approx(high, rel=1e-9)


def test_per_fold_predictions_equal_one_file(simulated, split, model, tmp_path):
    one = score(simulated, {"m": model}, protocols="mse,rank_full", split=split, figures=False)
    per_fold = {fold: _rows_of(model, _fold_labels(split, fold)) for fold in split.folds}
    mapped = score(
        simulated, {"m": per_fold}, protocols="mse,rank_full", split=split, figures=False
    )
    folder = tmp_path / "m"
    folder.mkdir()
    for fold, part in per_fold.items():
        part.write_h5ad(folder / f"{fold}.h5ad")
    from_folder = score(
        simulated, {"m": folder}, protocols="mse,rank_full", split=split, figures=False
    )
    for other in (mapped, from_folder):
        pd.testing.assert_series_equal(one.results["value"], other.results["value"])


def test_refused_predictions(simulated, split, model):
    fold = split.folds[0]
    per_fold = {f: _rows_of(model, _fold_labels(split, f)) for f in split.folds}
    lacking = {f: p for f, p in per_fold.items() if f != fold}
    with pytest.raises(DatasetError, match=r"do not match the split's folds.*no file for fold"):
        score(simulated, {"m": lacking}, protocols="mse", split=split, figures=False)
    swapped = {**per_fold, fold: per_fold[split.folds[1]]}
    with pytest.raises(DatasetError, match=rf"file for fold '{fold}' predicts .*held out by fold"):
        score(simulated, {"m": swapped}, protocols="mse", split=split, figures=False)
    test = _fold_labels(split, fold)
    roles = Split(test={"test": split.test[fold]}, train={"test": split.train[fold]})
    with pytest.raises(DatasetError, match=r"no fold of the split holds out \(a training"):
        score(simulated, {"m": model}, protocols="mse", split=roles, figures=False)
    partial = _rows_of(model, set(sorted(test)[1:]))
    with pytest.raises(DatasetError, match=r"1 held-out perturbation\(s\) not predicted"):
        score(simulated, {"m": partial}, protocols="mse", split=roles, figures=False)
    with pytest.raises(SpecError, match="not scored under a split"):
        score(
            simulated,
            {"m": model},
            protocols="mse",
            truth="all",
            baselines=["cell_eval_mean"],
            split=split,
        )


def test_single_test_fold_scores_only_its_perturbations(simulated, split, model, tmp_path):
    fold = split.folds[1]
    roles = Split(test={"test": split.test[fold]}, train={"test": split.train[fold]})
    result = score(
        simulated,
        {"m": _rows_of(model, _fold_labels(split, fold))},
        protocols="mse,rank_full",
        split=roles,
        out=tmp_path / "run",
        figures=False,
    )
    assert set(result.results["perturbation"]) == _fold_labels(split, fold)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["options"]["split"]["sha256"] == roles.digest()
    assert record["options"]["split"]["folds"] == {"test": len(split.test[fold])}
    for name in ("fold_scores.csv", "leaderboard_folds.csv", "mean_ratio.csv"):
        assert (tmp_path / "run" / name).is_file()
    # The stored results re-derive to the same pooled leaderboard.
    again = report(tmp_path / "run", out=tmp_path / "again", figures=False)
    pd.testing.assert_frame_equal(again.leaderboard.headline, result.leaderboard.headline)


def test_additive_and_linear_use_training_perturbations_only(simulated, split, model):
    result = score(
        simulated, {"m": model}, protocols="mse", truth="all", split=split, figures=False
    )
    centroids, control = _centroids(simulated)
    additive = result.results[result.results["source_name"] == "additive"]
    additive = additive[additive["perturbation"].str.contains("+", regex=False)]
    assert len(additive)
    for row in additive.itertuples():
        fold = split.fold_of(("all", row.perturbation))
        singles = row.perturbation.split("+")
        trained = all(("all", s) in split.train[fold] for s in singles)
        if not trained:
            assert np.isnan(row.value) and "held out in this fold" in row.reason
        else:
            expected = control + sum(centroids[s] - control for s in singles)
            truth = centroids[row.perturbation]
            assert row.value == pytest.approx(np.mean((truth - expected) ** 2), rel=1e-9)
    # The fold's linear fit is the leave-one-out fit on data of only the fold's
    # training perturbations and the held-out one.
    linear = result.results[result.results["source_name"] == "linear"].set_index("perturbation")
    label = sorted(p for p in _fold_labels(split, "2") if "+" not in p)[0]
    kept = {p for _, p in split.train["2"]} | {label, "control"}
    subset = simulated[simulated.obs["perturbation"].astype(str).isin(kept).to_numpy()].copy()
    alone = score(
        subset,
        {"m": _rows_of(model, kept - {"control"})},
        protocols="mse",
        truth="all",
        figures=False,
    )
    rows = alone.results[alone.results["source_name"] == "linear"].set_index("perturbation")
    assert np.isfinite(linear.loc[label, "value"])
    assert linear.loc[label, "value"] == pytest.approx(rows.loc[label, "value"], rel=1e-9)


def test_run_without_split_keeps_its_tables(simulated, model, tmp_path):
    result = score(
        simulated, {"m": model}, protocols="mse", truth="all", out=tmp_path / "r", figures=False
    )
    assert "fold" not in result.results
    assert "split" not in result.info
    assert result.fold_scores.empty and result.criterion.empty
    assert not (tmp_path / "r" / "mean_ratio.csv").exists()


def test_error_ratio_interval_is_a_percentile_bootstrap():
    ratios = np.random.default_rng(4).lognormal(size=37)
    rng = np.random.default_rng(11)
    means = np.array([ratios[rng.integers(0, 37, 37)].mean() for _ in range(2500)])
    mean, low, high = error_ratio_interval(ratios, seed=11, resamples=2500)
    assert mean == ratios.mean()
    # The same resamples; their means differ only by summation order.
    assert (low, high) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])), rel=1e-12)
    assert all(np.isnan(error_ratio_interval(np.array([]), seed=0)))


def test_terminal_lines_name_the_models_the_criterion_passes(simulated, split, model):
    from scperteval.cli._score import split_lines

    result = score(
        simulated, {"m": model}, protocols="mse", truth="all", split=split, figures=False
    )
    lines = split_lines(result)
    sizes = ", ".join(f"{fold}: {len(split.test[fold])}" for fold in split.folds)
    assert lines[0] == f"split generated: {len(split.folds)} fold(s) ({sizes} held out)"
    summary = result.fold_summary
    passing = summary.loc[summary["outperforms_mean"].eq(True), "model"].tolist()
    assert passing == [
        m
        for m in summary["model"]
        if bool(summary.set_index("model").loc[m, "mean_ratio_high"] < 1)
    ]
    assert lines[1].endswith(": " + (", ".join(passing) if passing else "none"))


def test_criterion_table_on_hand_made_errors():
    from scperteval.scoring.mean_ratio import mean_ratio_table

    rows = []
    for label, base, good, flat in (
        ("a", 2.0, 1.0, 0.0),
        ("b", 4.0, 1.0, 3.0),
        ("c", 0.0, 1.0, 1.0),
    ):
        for kind, name, value in (
            ("baseline", "dataset_mean", base),
            ("model", "good", good),
            ("model", "empty", np.nan),
            ("baseline", "flat", flat),
        ):
            rows.append(("all", label, "l2", kind, name, value))
    results = pd.DataFrame(rows, columns=[*KEYS, "value"])
    table = mean_ratio_table(results, ["l2"], seed=3, resamples=200).set_index("model")
    # c has a zero baseline error: no ratio. good: 1/2 and 1/4.
    assert table.loc["good", "n"] == 2
    assert table.loc["good", "mean_ratio"] == pytest.approx(0.375)
    assert table.loc["good", "outperforms"] is True
    assert table.loc["flat", "mean_ratio"] == pytest.approx((0.0 + 0.75) / 2)
    assert table.loc["empty", "n"] == 0 and table.loc["empty", "outperforms"] is pd.NA


def test_fold_headlines_average_the_pooled_run_trusted_protocols(simulated, split, model):
    """Folds of fewer perturbations than the trust rule needs still have a headline."""
    protocols = "mse,pearson_delta_ctrl,mse_top_k,l2"
    pooled = score(simulated, {"m": model}, protocols=protocols, split=split, figures=False)
    trusted = list(pooled.leaderboard.trusted)
    assert trusted, "the pooled run trusts some protocol"
    per_fold = pooled.fold_scores.set_index(["fold", "model"])["score"]
    entries = pooled.results[pooled.results["source_name"] == "m"]
    for fold in split.folds:
        own = entries[entries["fold"] == fold]
        # Each fold holds 5 perturbations, fewer than the 10 the trust rule needs alone.
        assert own["perturbation"].nunique() < 10
        medians = [
            np.nanmedian(own.loc[own["protocol"] == p, "calibrated"].to_numpy(dtype=float))
            for p in trusted
        ]
        assert per_fold[(fold, "m")] == pytest.approx(np.median(medians), rel=1e-12)
