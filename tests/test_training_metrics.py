"""PerturbationMetrics: the benchmark's protocols as a torchmetrics metric.

Values are checked against ``scperteval.score`` on the same predictions (the reference
pipeline), against the NumPy metric functions and scipy on toy inputs, and against
properties of the state: any batch split, order or merge gives one pass's values.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
torchmetrics = pytest.importorskip("torchmetrics")

from scipy import stats  # noqa: E402

import scperteval  # noqa: E402
from scperteval import metrics  # noqa: E402
from scperteval.context import Context  # noqa: E402
from scperteval.data.load import load_dataset  # noqa: E402
from scperteval.errors import SpecError  # noqa: E402
from scperteval.simulation import simulate_predictions  # noqa: E402
from scperteval.torch_backend import PerturbationMetrics  # noqa: E402

CENTROID = [
    "pearson_delta_ctrl",
    "pearson_delta_pert",
    "pearson_delta_ctrl_top_k",
    "pearson_delta_ctrl_heg",
    "r2_delta_ctrl",
    "r2_delta_pert",
    "cosine_delta_ctrl",
    "mse",
    "mse_top_k",
    "mae",
    "l2",
    "mse_perturbed_genes",
    "weighted_mse",
    "weighted_pearson_delta_pert",
    "weighted_r2_delta_pert",
    "weighted_r2_delta_ctrl",
]
DATASET = ["rank_full", "transpose_rank", "nir", "rank_pca", "pds"]
PROTOCOLS = ",".join(CENTROID + DATASET)
COVARIATE = "cell_line"
MODELS = ("noisy", "collapsed", "control")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _dense(matrix: object) -> np.ndarray:
    return np.asarray(matrix.toarray() if hasattr(matrix, "toarray") else matrix)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def setup(_sim_adata):
    adata = _sim_adata
    predictions = {
        "noisy": simulate_predictions(adata, "scaled_effect", scale=0.6, noise=0.6, seed=1),
        "collapsed": simulate_predictions(adata, "mode_collapse", seed=2),
        "control": simulate_predictions(adata, "control", seed=3),
    }
    result = scperteval.score(
        adata,
        predictions,
        protocols=PROTOCOLS,
        truth="all",
        baselines=False,
        progress=False,
        workers=1,
        covariate_key=COVARIATE,
    )
    dataset = load_dataset(adata, covariate_key=COVARIATE)
    return {
        "adata": adata,
        "predictions": predictions,
        "table": result.results,
        "context": Context(dataset),
        "key": dataset.perturbation_key,
    }


def _labels(prediction, key: str) -> tuple[np.ndarray, np.ndarray]:
    obs = prediction.obs
    return obs[key].astype(str).to_numpy(), obs[COVARIATE].astype(str).to_numpy()


def _metric(setup, protocols: str = PROTOCOLS, **kwargs) -> PerturbationMetrics:
    return PerturbationMetrics.from_context(setup["context"], protocols, **kwargs)


def _fill(metric, setup, model: str, dtype=torch.float64, device: str = "cpu") -> None:
    prediction = setup["predictions"][model]
    labels, covariates = _labels(prediction, setup["key"])
    values = torch.as_tensor(_dense(prediction.X), dtype=dtype, device=device)
    metric.update(values, labels, covariates)


def _reference(setup, model: str, protocol: str) -> pd.Series:
    table = setup["table"]
    rows = table[(table["protocol"] == protocol) & (table["source_name"] == model)]
    return rows.set_index(["covariate", "perturbation"])["value"]


def _assert_matches(found: dict, setup, model: str, rtol: float) -> None:
    assert list(found) == CENTROID + DATASET
    for name, result in found.items():
        expected = _reference(setup, model, name).reindex(result.values.index)
        np.testing.assert_allclose(
            result.values.to_numpy(), expected.to_numpy(), rtol=rtol, atol=0, err_msg=name
        )
        finite = expected.to_numpy()[np.isfinite(expected.to_numpy())]
        assert result.aggregate == pytest.approx(float(np.median(finite)), rel=rtol), name


@pytest.mark.parametrize("model", MODELS)
def test_float64_values_equal_score_with_all_truth_cells(setup, model: str) -> None:
    metric = _metric(setup)
    _fill(metric, setup, model)
    _assert_matches(metric.compute(), setup, model, rtol=1e-9)


def test_float32_values_equal_score_to_single_precision(setup) -> None:
    metric = _metric(setup, precision="float32")
    _fill(metric, setup, "noisy", dtype=torch.float32)
    found = metric.compute()
    # score reads the same float32 numbers: compare on the rounded predictions.
    rounded = {"noisy": setup["predictions"]["noisy"].copy()}
    rounded["noisy"].X = _dense(rounded["noisy"].X).astype(np.float32)
    table = scperteval.score(
        setup["adata"],
        rounded,
        protocols=PROTOCOLS,
        truth="all",
        baselines=False,
        progress=False,
        workers=1,
        covariate_key=COVARIATE,
    ).results
    for name, result in found.items():
        rows = table[table["protocol"] == name].set_index(["covariate", "perturbation"])["value"]
        expected = rows.reindex(result.values.index).to_numpy()
        np.testing.assert_allclose(result.values.to_numpy(), expected, rtol=1e-5, atol=1e-7)


def test_degenerate_models_get_nan_with_the_score_reasons(setup) -> None:
    # The collapsed model predicts one vector per group: ranks are all tied (value 1).
    metric = _metric(setup)
    _fill(metric, setup, "collapsed")
    found = metric.compute()
    assert (found["rank_full"].values == 1.0).all()
    # The control model's deltas are not exactly zero (a sample of controls), so the
    # values are defined; NaN patterns match score's in every case (checked above).
    metric.reset()
    _fill(metric, setup, "control")
    assert np.isfinite(metric.compute()["pearson_delta_ctrl"].values).all()


def test_any_batch_split_order_and_merge_equal_one_pass(setup) -> None:
    prediction = setup["predictions"]["noisy"]
    labels, covariates = _labels(prediction, setup["key"])
    values = torch.as_tensor(_dense(prediction.X), dtype=torch.float64)
    whole = _metric(setup)
    whole.update(values, labels, covariates)
    expected = whole.compute()
    rng = np.random.default_rng(0)
    order = rng.permutation(values.shape[0])
    cuts = np.sort(rng.choice(np.arange(1, values.shape[0]), size=7, replace=False))
    first, second = _metric(setup), _metric(setup)
    for number, part in enumerate(np.split(order, cuts)):
        target = first if number % 2 else second
        target.update(values[part], labels[part], covariates[part])
    first.merge_state(second)
    found = first.compute()
    for name in expected:
        np.testing.assert_allclose(
            found[name].values.to_numpy(), expected[name].values.to_numpy(), rtol=1e-12, atol=0
        )


def test_nan_values_and_unlabelled_rows_are_left_out_of_sums_and_counts(setup) -> None:
    prediction = setup["predictions"]["noisy"]
    labels, covariates = _labels(prediction, setup["key"])
    values = _dense(prediction.X).astype(np.float64)
    rng = np.random.default_rng(1)
    holes = values.copy()
    holes[rng.random(values.shape) < 0.1] = np.nan
    # Each gene keeps at least one value in each condition, so every mean is defined.
    frame = pd.DataFrame(holes).assign(c=covariates, p=labels)
    means = frame.groupby(["c", "p"], sort=False).mean()  # pandas skips NaN: nanmean
    assert np.isfinite(means.to_numpy()).all()
    junk = rng.normal(size=(5, values.shape[1]))
    metric = _metric(setup)
    metric.update(
        torch.as_tensor(np.vstack([holes, junk])),
        list(labels) + [None, float("nan"), None, pd.NA, "control"],
        list(covariates) + [covariates[0]] * 5,
    )
    pseudobulk = _metric(setup)
    pseudobulk.update(
        torch.as_tensor(means.to_numpy()),
        means.index.get_level_values("p").tolist(),
        means.index.get_level_values("c").tolist(),
    )
    found, expected = metric.compute(), pseudobulk.compute()
    for name in expected:
        np.testing.assert_allclose(
            found[name].values.to_numpy(), expected[name].values.to_numpy(), rtol=1e-12, atol=0
        )


def test_missing_perturbation_and_empty_epoch_give_nan_with_reasons(setup) -> None:
    prediction = setup["predictions"]["noisy"]
    labels, covariates = _labels(prediction, setup["key"])
    absent = (covariates[0], labels[0])
    keep = ~((covariates == absent[0]) & (labels == absent[1]))
    metric = _metric(setup)
    metric.update(torch.as_tensor(_dense(prediction.X)[keep]), labels[keep], covariates[keep])
    found = metric.compute()
    mse = found["mse"]
    assert math.isnan(mse.values[absent]) and "no predictions" in mse.reasons[absent]
    assert np.isfinite(mse.values.drop(absent)).all()
    # A dataset-scope protocol needs every perturbation of the group.
    rank = found["rank_full"]
    group = rank.values.xs(absent[0], level="covariate")
    assert group.isna().all()
    assert np.isfinite(rank.values.drop(absent[0], level="covariate")).all()
    empty = _metric(setup)
    with pytest.warns(UserWarning):
        nothing = empty.compute()
    assert all(r.values.isna().all() and math.isnan(r.aggregate) for r in nothing.values())


def test_constant_prediction_is_nan_for_correlations(setup) -> None:
    metric = _metric(setup, "pearson_delta_ctrl,cosine_delta_ctrl,mse")
    plan = metric.plan
    # Predicting the control mean exactly: every delta is zero.
    metric.update(
        torch.as_tensor(plan.references["control"]), list(plan.perturbations), list(plan.covariates)
    )
    found = metric.compute()
    assert found["pearson_delta_ctrl"].values.isna().all()
    assert set(found["cosine_delta_ctrl"].reasons) == {"metric undefined on these inputs"}
    expected = ((plan.truth - plan.references["control"]) ** 2).mean(axis=1)
    np.testing.assert_allclose(found["mse"].values.to_numpy(), expected, rtol=1e-12)


def test_inside_a_metric_collection_with_prefix(setup) -> None:
    collection = torchmetrics.MetricCollection(
        {"bench": _metric(setup, "mse,rank_full")}, prefix="val/"
    )
    _fill(collection["bench"], setup, "noisy")
    found = collection.compute()
    assert sorted(found) == ["val/mse", "val/rank_full"]
    expected = _reference(setup, "noisy", "mse").reindex(found["val/mse"].values.index)
    np.testing.assert_allclose(found["val/mse"].values.to_numpy(), expected.to_numpy(), rtol=1e-9)


def test_calibrated_values_equal_score_with_truth_halves(setup) -> None:
    protocols = "pearson_delta_ctrl,weighted_mse,nir"
    result = scperteval.score(
        setup["adata"],
        {"noisy": setup["predictions"]["noisy"]},
        protocols=protocols,
        baselines=False,
        progress=False,
        workers=1,
        covariate_key=COVARIATE,
    )
    table = result.results[result.results["source"] == "model"]
    metric = _metric(setup, protocols, truth="half")
    _fill(metric, setup, "noisy")
    for name, found in metric.compute().items():
        rows = table[table["protocol"] == name].set_index(["covariate", "perturbation"])
        rows = rows.reindex(found.values.index)
        np.testing.assert_allclose(found.values.to_numpy(), rows["value"].to_numpy(), rtol=1e-9)
        assert found.calibrated is not None
        np.testing.assert_allclose(
            found.calibrated.to_numpy(), rows["calibrated"].to_numpy(), rtol=1e-9
        )


def test_projection_spaces_equal_score(setup) -> None:
    protocols = [
        {"name": "mse_pca", "metric": "mse", "space": "pca(k=5)"},
        {"name": "pearson_pca", "metric": "pearson", "space": "pca(k=5)", "centering": "control"},
        {"name": "weighted_mse_pca", "metric": "weighted_mse", "space": "pca(k=5)"},
    ]
    prediction = {"noisy": setup["predictions"]["noisy"]}
    table = scperteval.score(
        setup["adata"],
        prediction,
        protocols=protocols,
        truth="all",
        baselines=False,
        progress=False,
        workers=1,
        covariate_key=COVARIATE,
    ).results
    metric = _metric(setup, protocols)
    _fill(metric, setup, "noisy")
    found = metric.compute()
    for name, result in found.items():
        rows = table[table["protocol"] == name].set_index(["covariate", "perturbation"])
        expected = rows["value"].reindex(result.values.index).to_numpy()
        np.testing.assert_allclose(result.values.to_numpy(), expected, rtol=1e-9, err_msg=name)
    # DEG weights live on genes: NaN with the reason score gives, for every perturbation.
    assert found["weighted_mse_pca"].values.isna().all()
    assert all("projection" in reason for reason in found["weighted_mse_pca"].reasons)
    assert np.isfinite(found["mse_pca"].values).all()


def test_predicted_columns_in_another_order(setup) -> None:
    prediction = setup["predictions"]["noisy"]
    labels, covariates = _labels(prediction, setup["key"])
    values = _dense(prediction.X)
    genes = list(setup["context"].genes)
    order = np.random.default_rng(2).permutation(len(genes))
    metric = _metric(setup, "mse,pds", columns=[genes[i] for i in order] + ["extra"])
    extra = np.zeros((values.shape[0], 1))
    metric.update(torch.as_tensor(np.hstack([values[:, order], extra])), labels, covariates)
    for name, found in metric.compute().items():
        expected = _reference(setup, "noisy", name).reindex(found.values.index)
        np.testing.assert_allclose(found.values.to_numpy(), expected.to_numpy(), rtol=1e-9)


def test_explicit_tensors_on_a_toy_equal_scipy_and_the_numpy_metrics() -> None:
    rng = np.random.default_rng(4)
    truth = rng.normal(size=(4, 6))
    control = rng.normal(size=6)
    weights = rng.random((4, 6))
    labels = ["A", "B", "A+B", "C"]
    genes = ["A", "B", "C", "D", "E", "F"]
    metric = PerturbationMetrics.from_tensors(
        torch.as_tensor(truth),
        labels,
        genes,
        "pearson_delta_ctrl,r2_delta_pert,weighted_mse,mae,nir,pds",
        control=control,
        weights=weights,
    )
    pred = truth + rng.normal(scale=0.5, size=truth.shape)
    # Two cells per perturbation whose mean is ``pred``.
    spread = rng.normal(size=truth.shape)
    metric.update(torch.as_tensor(np.vstack([pred + spread, pred - spread])), labels * 2)
    found = metric.compute()
    for k in range(4):
        r, _ = stats.pearsonr(truth[k] - control, pred[k] - control)
        assert found["pearson_delta_ctrl"].values.iloc[k] == pytest.approx(r, rel=1e-12)
        loo = np.delete(truth, k, axis=0).mean(axis=0)
        expected = (
            1
            - ((truth[k] - pred[k]) ** 2).sum()
            / (((truth[k] - loo) - (truth[k] - loo).mean()) ** 2).sum()
        )
        assert found["r2_delta_pert"].values.iloc[k] == pytest.approx(expected, rel=1e-12)
        w = weights[k]
        assert found["weighted_mse"].values.iloc[k] == pytest.approx(
            (w * (truth[k] - pred[k]) ** 2).sum() / w.sum(), rel=1e-12
        )
        assert found["mae"].values.iloc[k] == pytest.approx(
            np.abs(truth[k] - pred[k]).mean(), rel=1e-12
        )
    # NIR by counting: other truths strictly farther than the own one.
    d = ((pred[:, None, :] - truth[None, :, :]) ** 2).sum(axis=2)
    nir = [(d[i] > d[i, i]).sum() / 3 for i in range(4)]
    np.testing.assert_allclose(found["nir"].values.to_numpy(), nir, rtol=1e-12)
    context = metrics.DatasetContext(
        perturbations=tuple(labels),
        features=tuple(genes),
        target_features=((0,), (1,), (0, 1), (2,)),
    )
    expected_pds = metrics.pds(truth - control, pred - control, context)
    np.testing.assert_allclose(found["pds"].values.to_numpy(), expected_pds, rtol=1e-12)


def test_unsupported_protocols_and_bad_batches_raise_spec_errors(setup) -> None:
    with pytest.raises(SpecError, match="not computed during training"):
        _metric(setup, "energy_top_k")
    with pytest.raises(SpecError, match="truth must be"):
        _metric(setup, "mse", truth="duplicate")
    metric = _metric(setup, "mse")
    genes = len(metric.genes)
    with pytest.raises(SpecError, match="unknown perturbation"):
        metric.update(torch.zeros(1, genes), ["no_such_perturbation"])
    with pytest.raises(SpecError, match="covariate groups"):
        metric.update(torch.zeros(1, genes), [metric.plan.perturbations[0]])
    with pytest.raises(SpecError, match="genes"):
        metric.update(torch.zeros(1, genes + 1), [metric.plan.perturbations[0]], ["x"])
    with pytest.raises(SpecError, match="full"):
        PerturbationMetrics.from_tensors(np.zeros((2, 3)), ["a", "b"], ["x", "y", "z"], "mse_top_k")


@CUDA
def test_cuda_values_equal_cpu_values(setup) -> None:
    for precision, dtype, rtol in (
        ("float64", torch.float64, 1e-9),
        ("float32", torch.float32, 1e-5),
    ):
        metric = _metric(setup, precision=precision).to("cuda")
        _fill(metric, setup, "noisy", dtype=dtype, device="cuda")
        found = metric.compute()
        assert metric.sums.device.type == "cuda"
        for name, result in found.items():
            expected = _reference(setup, "noisy", name).reindex(result.values.index)
            np.testing.assert_allclose(
                result.values.to_numpy(), expected.to_numpy(), rtol=rtol, atol=1e-7, err_msg=name
            )
