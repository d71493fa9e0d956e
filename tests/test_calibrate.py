"""``calibrate``: values independent of threads, order and company; checked by hand."""

from __future__ import annotations

import concurrent.futures as cf
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy import stats
from scipy.spatial.distance import cdist
from sklearn.metrics import r2_score, roc_auc_score

from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.engine.calibrators import Thresholds
from scperteval.engine.dispatch import Candidate, run_protocols
from scperteval.engine.engine import Engine
from scperteval.engine.failures import failure_counts, failure_record
from scperteval.engine.sources import SourceData
from scperteval.engine.suites import load_suite, resolve_protocols
from scperteval.simulation import simulate
from scperteval.workflows.calibrate import CalibrationResult, calibrate

SEED = 0
KEY = ["protocol", "covariate", "perturbation", "source", "source_name"]
RESULT_COLUMNS = ["covariate", "perturbation", "protocol", "source", "source_name", "value"]
CALIBRATION_COLUMNS = ["protocol", "covariate", "n", "drf_mean", "drf_median", "bds", "trusted"]


def flaky(gt, pred, ctx=None):
    """MSE, except that it fails on G10."""
    if ctx is not None and ctx.perturbation == "G10":
        raise RuntimeError("boom")
    return float(np.mean((np.asarray(gt) - np.asarray(pred)) ** 2))


USER_PROTOCOLS = [
    {"name": "mse_vs_additive", "metric": "mse", "negative": "additive"},
    {
        "name": "r2_delta_pert_mean_baseline",
        "metric": "r2",
        "centering": "perturbed",
        "negative": "dataset_mean",
    },
    {"name": "rank_expression", "metric": "rank"},
    {
        "name": "energy_top10",
        "metric": "energy_distance",
        "space": "top_k(k=10)",
        "negative": "all_perturbed_sample",
    },
    {"name": "flaky_mse", "metric": flaky, "better": "lower", "perfect": 0.0},
    {"name": "de_auroc_full", "metric": "de_auroc", "negative": "all_perturbed_sample"},
]
NAMED = [
    "pearson_delta_ctrl",
    "pearson_delta_pert",
    "r2_delta_pert",
    "mse",
    "mse_top_k=20",
    "weighted_mse",
    "weighted_pearson_delta_pert",
    "mse_perturbed_genes",
    "pearson_delta_ctrl_interpolated",
    "de_auroc",
    "de_topk_overlap(k=10)",
    "energy_pca(k=8)",
    "mmd_top_k=15",
    "nir",
    "pds",
]
SMALL = NAMED + USER_PROTOCOLS


@pytest.fixture(scope="module")
def sim():
    adata = simulate(
        n_perturbations=6,
        n_genes=60,
        cells_per_perturbation=40,
        n_covariates=2,
        n_combinations=2,
        seed=3,
    )
    x = adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)
    context = Context(Dataset(adata, covariate_key="cell_line"), seed=SEED)
    return SimpleNamespace(
        adata=adata,
        x=x.astype(np.float64),
        labels=adata.obs["perturbation"].astype(str).to_numpy(),
        groups=adata.obs["cell_line"].astype(str).to_numpy(),
        layout=context.layout,
        conditions=context.layout.conditions,
    )


def run(sim, protocols, **options):
    return calibrate(
        sim.adata, protocols=protocols, covariate_key="cell_line", seed=SEED, **options
    )


@pytest.fixture(scope="module")
def small(sim):
    return run(sim, SMALL)


@pytest.fixture(scope="module")
def default_run(sim):
    return run(sim, "default", workers=2)


def value(table, protocol, covariate, perturbation, source):
    rows = table[
        (table["protocol"] == protocol)
        & (table["covariate"] == covariate)
        & (table["perturbation"] == perturbation)
        & (table["source"] == source)
    ]
    assert len(rows) == 1
    return float(rows["value"].iloc[0])


def assert_identical(first: pd.DataFrame, second: pd.DataFrame):
    """Same rows, labels and reasons, and exactly equal values (NaN at the same places)."""
    assert list(first.columns) == list(second.columns)
    labels = [c for c in first.columns if c != "value"]
    pd.testing.assert_frame_equal(
        first[labels].reset_index(drop=True), second[labels].reset_index(drop=True)
    )
    a, b = first["value"].to_numpy(), second["value"].to_numpy()
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    assert np.array_equal(a, b, equal_nan=True)


# -------------------------------------------------------------- independence


def test_small_run_has_every_row(sim, small):
    table = small.results
    names = [p.name for p in resolve_protocols(SMALL)]
    assert sorted(table["protocol"].unique()) == sorted(names)
    assert len(table) == len(names) * len(sim.conditions) * 2
    assert set(table["source"]) == {"positive", "negative"}
    # Source names come from the protocols' controls.
    negatives = table[(table["protocol"] == "mse_vs_additive") & (table["source"] == "negative")]
    assert set(negatives["source_name"]) == {"additive"}
    # The run has NaN values, so the comparisons below also compare NaN positions.
    assert table["value"].isna().any()


@pytest.mark.parametrize("how", ["workers=4", "executor"])
def test_results_do_not_depend_on_threads(sim, small, how):
    if how == "executor":
        with cf.ThreadPoolExecutor(max_workers=3) as executor:
            other = run(sim, SMALL, executor=executor)
    else:
        other = run(sim, SMALL, workers=4)
    assert_identical(small.results, other.results)
    pd.testing.assert_frame_equal(small.calibration, other.calibration, check_exact=True)


def test_protocol_order_does_not_matter(sim, small):
    reversed_run = run(sim, list(reversed(SMALL)))
    assert_identical(small.results, reversed_run.results)
    pd.testing.assert_frame_equal(small.calibration, reversed_run.calibration, check_exact=True)


def test_a_protocol_alone_gives_its_values_in_the_default_suite(sim, default_run):
    suite = load_suite("default")
    chosen = {
        next(p.name for p in suite if p.representation == "population" and "pca" in p.space),
        next(p.name for p in suite if p.representation == "population" and "top_k" in p.space),
        next(p.name for p in suite if p.metric.name == "sinkhorn" and "pca" in p.space),
        next(p.name for p in suite if p.representation == "de"),
        next(p.name for p in suite if p.metric.name.startswith("weighted")),
        next(p.name for p in suite if p.centering == "perturbed"),
        next(p.name for p in suite if "interpolated" in p.positive),
        *(p.name for p in suite if p.scope == "dataset"),
    }
    table = default_run.results
    assert sorted(table["protocol"].unique()) == sorted(p.name for p in suite)
    for name in sorted(chosen):
        alone = run(sim, [name]).results
        inside = table[table["protocol"] == name].reset_index(drop=True)
        assert len(alone) == len(sim.conditions) * 2
        assert_identical(alone, inside)
        assert alone["value"].notna().all(), name


# ---------------------------------------------------------- values by hand


def cells(sim, k, half="all"):
    return sim.x[sim.layout.positions(k, half)]


def centroids(sim, k):
    c = sim.conditions[k]
    truth = cells(sim, k, "truth").mean(axis=0)
    duplicate = cells(sim, k, "duplicate").mean(axis=0)
    control = sim.x[(sim.groups == c.covariate) & (sim.labels == "control")].mean(axis=0)
    others = [j for j, d in enumerate(sim.conditions) if d.covariate == c.covariate and j != k]
    mean = np.mean([cells(sim, j).mean(axis=0) for j in others], axis=0)
    return truth, duplicate, control, mean


def rest_cells(sim, k):
    c = sim.conditions[k]
    mask = (sim.groups == c.covariate) & (sim.labels != "control") & (sim.labels != c.perturbation)
    return sim.x[mask]


def welch(target, reference):
    t, p = stats.ttest_ind(target, reference, axis=0, equal_var=False)
    return t, np.where(np.isnan(p), 1.0, p)


CASES = [("cell_line_0", "G10"), ("cell_line_1", "G1+G9")]


@pytest.mark.parametrize(("covariate", "perturbation"), CASES)
def test_centroid_values_by_hand(sim, small, covariate, perturbation):
    k = sim.layout.index_of(covariate, perturbation)
    truth, duplicate, control, mean = centroids(sim, k)
    table = small.results

    def check(protocol, source, expected):
        actual = value(table, protocol, covariate, perturbation, source)
        assert actual == pytest.approx(expected, rel=1e-9, abs=1e-12), (protocol, source)

    check("pearson_delta_ctrl", "positive", stats.pearsonr(truth - control, duplicate - control)[0])
    check("pearson_delta_ctrl", "negative", stats.pearsonr(truth - control, mean - control)[0])
    check("pearson_delta_pert", "negative", stats.pearsonr(truth - mean, control - mean)[0])
    check("mse", "positive", np.mean((truth - duplicate) ** 2))
    check("mse", "negative", np.mean((truth - mean) ** 2))
    check("r2_delta_pert", "positive", r2_score(truth - mean, duplicate - mean))
    check("r2_delta_pert", "negative", r2_score(truth - mean, control - mean))
    # DEG weights: |t| of the truth half vs the rest, min-max normalised, squared, sum 1.
    t, _ = welch(cells(sim, k, "truth"), rest_cells(sim, k))
    assert np.isfinite(t).all()
    s = np.abs(t)
    weights = ((s - s.min()) / (s.max() - s.min())) ** 2
    weights /= weights.sum()
    check("weighted_mse", "positive", np.sum(weights * (truth - duplicate) ** 2))
    check("weighted_mse", "negative", np.sum(weights * (truth - mean) ** 2))
    # top-k space from the same t statistics.
    top = np.argsort(-s)[:20]
    check("mse_top_k=20", "positive", np.mean((truth - duplicate)[top] ** 2))
    # The perturbation's own target gene(s).
    genes = [list(sim.adata.var_names).index(g) for g in perturbation.split("+")]
    check("mse_perturbed_genes", "negative", np.mean((truth - mean)[genes] ** 2))


@pytest.mark.parametrize(("covariate", "perturbation"), CASES)
def test_population_and_de_values_by_hand(sim, small, covariate, perturbation):
    k = sim.layout.index_of(covariate, perturbation)
    truth_cells = cells(sim, k, "truth")
    duplicate_cells = cells(sim, k, "duplicate")
    rest = rest_cells(sim, k)
    t_truth, p_truth = welch(truth_cells, rest)
    # Energy distance on the top 10 genes: 2 E|X-Y| - E|X-X'| - E|Y-Y'| (U-statistics).
    top = np.sort(np.argsort(-np.abs(t_truth))[:10])
    x, y = truth_cells[:, top], duplicate_cells[:, top]
    n, m = len(x), len(y)
    energy = (
        2 * cdist(x, y).mean()
        - cdist(x, x).sum() / (n * (n - 1))
        - cdist(y, y).sum() / (m * (m - 1))
    )
    actual = value(small.results, "energy_top10", covariate, perturbation, "positive")
    assert actual == pytest.approx(energy, rel=1e-9)
    # DE AUROC: the truth's DEGs (BH padj < 0.05) ranked by the duplicate's |t| vs the rest.
    degs = stats.false_discovery_control(p_truth, method="bh") < 0.05
    assert 0 < degs.sum() < degs.size
    t_duplicate, _ = welch(duplicate_cells, rest)
    expected = roc_auc_score(degs, np.abs(t_duplicate))
    actual = value(small.results, "de_auroc_full", covariate, perturbation, "positive")
    assert actual == pytest.approx(expected, rel=1e-9)


def test_rank_of_the_mean_baseline_by_hand(sim, small):
    for covariate in ("cell_line_0", "cell_line_1"):
        members = [k for k, c in enumerate(sim.conditions) if c.covariate == covariate]
        truths = np.array([centroids(sim, k)[0] for k in members])
        means = np.array([centroids(sim, k)[3] for k in members])
        d = cdist(means, truths, "sqeuclidean")  # d[i, j] = d(pred_i, truth_j)
        n = len(members)
        for j, k in enumerate(members):
            competitors = sum(d[i, j] <= d[j, j] for i in range(n) if i != j)
            actual = value(
                small.results,
                "rank_expression",
                covariate,
                sim.conditions[k].perturbation,
                "negative",
            )
            assert actual == pytest.approx(competitors / (n - 1), abs=1e-12)


def test_mean_baseline_r2_on_delta_pert_is_not_positive(sim, small):
    table = small.results
    rows = table[
        (table["protocol"] == "r2_delta_pert_mean_baseline") & (table["source"] == "negative")
    ]
    assert len(rows) == len(sim.conditions)
    for row in rows.itertuples():
        k = sim.layout.index_of(row.covariate, row.perturbation)
        truth, _, _, mean = centroids(sim, k)
        delta = truth - mean
        # The mean baseline's delta pert is exactly 0: R2 = 1 - sum(d^2) / SS = -n dbar^2 / SS.
        expected = -delta.size * delta.mean() ** 2 / np.sum((delta - delta.mean()) ** 2)
        assert expected <= 0
        assert row.value == pytest.approx(expected, rel=1e-9, abs=1e-15)
        assert row.value == pytest.approx(r2_score(delta, np.zeros_like(delta)), rel=1e-9)
        assert row.value <= 0


# ---------------------------------------------------------------- candidates


@pytest.fixture(scope="module")
def engine(sim):
    return Engine(Context(Dataset(sim.adata, covariate_key="cell_line"), seed=SEED))


def test_constant_prediction_is_worst_on_rank(sim, engine):
    protocols = resolve_protocols(
        [{"name": "rank_expression", "metric": "rank"}, {"name": "nir_expression", "metric": "nir"}]
    )
    constant = np.full(sim.x.shape[1], 0.7)
    candidates = [
        Candidate("model", "constant", lambda e, k: SourceData(centroid=constant)),
        Candidate("model", "oracle", lambda e, k: e.source("truth", k)),
    ]
    table = run_protocols(engine, protocols, candidates=candidates)
    assert len(table) == 2 * 2 * len(sim.conditions)

    def values(protocol, name):
        rows = table[(table["protocol"] == protocol) & (table["source_name"] == name)]
        assert (rows["source"] == "model").all()
        return rows["value"].to_numpy()

    # Every prediction ties with every other: the worst rank.
    np.testing.assert_array_equal(values("rank_expression", "constant"), 1.0)
    # NIR has no ties here (the truths differ): a constant prediction orders the
    # truths by their distance to it, so its values are those of chance, 0 .. 1.
    nir_values = values("nir_expression", "constant")
    for group in (nir_values[:8], nir_values[8:]):
        np.testing.assert_allclose(np.sort(group), np.arange(8) / 7, atol=1e-12)
    np.testing.assert_array_equal(values("rank_expression", "oracle"), 0.0)
    np.testing.assert_array_equal(values("nir_expression", "oracle"), 1.0)


def test_failures_are_nan_with_a_reason_and_the_run_continues(sim, small):
    table = small.results
    additive = table[(table["protocol"] == "mse_vs_additive") & (table["source"] == "negative")]
    singles = ~additive["perturbation"].str.contains("+", regex=False)
    assert additive.loc[singles, "value"].isna().all()
    assert additive.loc[singles, "reason"].str.contains("not a combination").all()
    assert np.isfinite(additive.loc[~singles, "value"]).all()
    assert (additive.loc[~singles, "reason"] == "").all()
    positives = table[(table["protocol"] == "mse_vs_additive") & (table["source"] == "positive")]
    assert np.isfinite(positives["value"]).all()
    # A metric raising on one perturbation: NaN and the error there, values elsewhere.
    flaky_rows = table[table["protocol"] == "flaky_mse"]
    failed = flaky_rows["perturbation"] == "G10"
    assert failed.sum() == 4
    assert flaky_rows.loc[failed, "value"].isna().all()
    assert (flaky_rows.loc[failed, "reason"] == "RuntimeError: boom").all()
    assert np.isfinite(flaky_rows.loc[~failed, "value"]).all()
    # Same values as the registered MSE where it did not fail.
    mse_rows = table[table["protocol"] == "mse"].reset_index(drop=True)
    ok = ~failed.to_numpy()
    np.testing.assert_array_equal(
        flaky_rows["value"].to_numpy()[ok], mse_rows["value"].to_numpy()[ok]
    )
    # Every other protocol is complete.
    others = table[~table["protocol"].isin(["mse_vs_additive", "flaky_mse"])]
    assert others["value"].notna().all()
    assert (others["reason"] == "").all()
    # Skipped perturbations are counted in the calibration.
    calibration = small.calibration.set_index(["protocol", "covariate"])
    assert calibration.loc[("mse_vs_additive", "all"), "n"] == 4
    assert calibration.loc[("mse_vs_additive", "all"), "n_skipped"] == 12
    assert calibration.loc[("flaky_mse", "all"), "n_skipped"] == 2
    assert small.n_failed == int(table["value"].isna().sum()) == 12 + 4
    assert "16 values are NaN" in small.summary()
    # Counted by protocol, candidate and reason, largest first.
    counts = failure_counts(table)
    assert counts["count"].sum() == 16
    flaky_counts = counts[counts["protocol"] == "flaky_mse"]
    assert set(flaky_counts["reason"]) == {"RuntimeError: boom"}
    assert flaky_counts["count"].sum() == 4
    assert counts["count"].is_monotonic_decreasing
    assert failure_record(table)["flaky_mse"] == {"RuntimeError: boom": 4}
    assert failure_counts(table.dropna(subset=["value"])).empty


def test_thresholds_decide_the_verdict(sim):
    strict = run(sim, ["mse"], thresholds=Thresholds(bds_min=1.0, drf_min=0.999))
    lenient = run(sim, ["mse"], thresholds=Thresholds(bds_min=0.0, drf_min=-1.0))
    row = strict.overall().iloc[0]
    assert row["drf_median"] < 0.999
    assert not row["trusted"]
    assert "DRF median" in row["reason"]
    assert lenient.trusted_protocols() == ["mse"]


# --------------------------------------------------------------------- files


def test_output_files(sim, tmp_path):
    protocols = [
        "pearson_delta_ctrl",
        "mse_top_k=20",
        {"name": "rank_expression", "metric": "rank"},
    ]
    result = run(sim, protocols, out=tmp_path)
    assert isinstance(result, CalibrationResult)
    results = pd.read_parquet(tmp_path / "results.parquet")
    assert set(RESULT_COLUMNS) <= set(results.columns)
    assert_identical(results, result.results)
    calibration = pd.read_csv(tmp_path / "calibration.csv")
    assert set(CALIBRATION_COLUMNS) <= set(calibration.columns)
    assert calibration["protocol"].tolist() == result.calibration["protocol"].tolist()
    np.testing.assert_allclose(
        calibration["drf_mean"].to_numpy(), result.calibration["drf_mean"].to_numpy(), rtol=1e-12
    )
    assert set(calibration["covariate"]) == {"cell_line_0", "cell_line_1", "all"}
    described = pd.read_csv(tmp_path / "protocols.csv")
    assert described["protocol"].tolist() == [
        "pearson_delta_ctrl",
        "mse_top_k=20",
        "rank_expression",
    ]
    run_json = json.loads((tmp_path / "run.json").read_text())
    assert run_json["command"] == "calibrate"
    assert run_json["options"]["protocols"] == described["protocol"].tolist()
    assert run_json["options"]["seed"] == SEED
    assert run_json["options"]["thresholds"] == Thresholds().as_dict()
    assert run_json["n_perturbations"] == len(sim.conditions)


# ----------------------------------------------------------------- real data


@pytest.mark.slow
def test_norman_subset(devel_path):
    import anndata as ad

    adata = ad.read_h5ad(devel_path)
    protocols = ["pearson_delta_ctrl", "mse_top_k=20", "de_auroc", "nir"]
    result = calibrate(
        adata,
        protocols=protocols,
        perturbation_key="condition",
        subset={"dataset": "norman19"},
        seed=1,
    )
    table = result.results
    keep = (adata.obs["dataset"] == "norman19").to_numpy()
    obs = adata.obs[keep]
    perturbations = sorted(set(obs["condition"].astype(str)) - {"control"})
    assert sorted(table["perturbation"].unique()) == perturbations
    assert len(table) == len(protocols) * len(perturbations) * 2
    assert table["value"].notna().all()
    # One perturbation by hand, on the subset's cells (positions from the layout).
    x = adata.X[keep]
    x = x.toarray() if sp.issparse(x) else np.asarray(x)
    labels = obs["condition"].astype(str).to_numpy()
    layout = Context(
        Dataset(adata, perturbation_key="condition", subset={"dataset": "norman19"}), seed=1
    ).layout
    name = perturbations[0]
    k = layout.index_of(layout.covariates[0], name)
    truth = x[layout.positions(k, "truth")].mean(axis=0)
    duplicate = x[layout.positions(k, "duplicate")].mean(axis=0)
    control = x[labels == "control"].mean(axis=0)
    expected = stats.pearsonr(truth - control, duplicate - control)[0]
    rows = table[(table["protocol"] == "pearson_delta_ctrl") & (table["perturbation"] == name)]
    positive = rows.loc[rows["source"] == "positive", "value"].iloc[0]
    assert positive == pytest.approx(expected, rel=1e-9)
    assert set(result.calibration["protocol"]) == set(protocols)


def test_adjusted_pvalues_alone_equal_the_de_tables_and_keep_no_table():
    import scperteval
    from scperteval.context import Context
    from scperteval.data.dataset import Dataset

    adata = scperteval.simulate(n_perturbations=5, n_genes=40, cells_per_perturbation=30, seed=4)
    for method in ("t-test", "wilcoxon"):
        context = Context(Dataset(adata), seed=2, de_method=method)
        alone = context.de_adjusted_pvalues(half="duplicate")
        assert context.de_origin(half="duplicate") is None  # no table kept
        assert context.de_adjusted_pvalues(half="duplicate") is alone  # kept, once
        table = context.de(half="duplicate")
        np.testing.assert_array_equal(alone, table.pvalue_adj)
        # Once the table is there, its values are used.
        assert context.de_adjusted_pvalues(half="duplicate") is table.pvalue_adj
