"""Deltas against a model's own predicted control (``control="predicted"``), as cell-eval."""

from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy import stats
from scipy.spatial.distance import cdist

from scperteval.context import Context
from scperteval.data.load import load_dataset
from scperteval.engine.control_views import control_view
from scperteval.engine.engine import Engine
from scperteval.engine.spaces import resolve_space
from scperteval.engine.suites import load_suite
from scperteval.errors import DatasetError, SpecError
from scperteval.scoring.predictions import load_predictions
from scperteval.workflows.score import score

PROTOCOLS = ("pearson_delta", "mae_delta", "mae", "discrimination_score_l1", "pearson_edistance")


@pytest.fixture(scope="module")
def screen() -> ad.AnnData:
    from scperteval.simulation import simulate

    return simulate(
        n_perturbations=6, n_genes=30, cells_per_perturbation=16, effect_size=1.5, seed=7
    )


def _dense(matrix) -> np.ndarray:
    return np.asarray(matrix.toarray() if sp.issparse(matrix) else matrix, dtype=np.float64)


def _labels(adata: ad.AnnData) -> np.ndarray:
    return adata.obs["perturbation"].astype(str).to_numpy()


def _model(screen: ad.AnnData, shift: float) -> ad.AnnData:
    """Truth cells plus noise; the control cells raised by ``shift`` on the first 10 genes."""
    rng = np.random.default_rng(4)
    cells = _dense(screen.X)
    values = np.clip(cells + rng.normal(0.0, 0.3, cells.shape), 0.0, None)
    control = _labels(screen) == "control"
    values[np.ix_(control, np.arange(10))] += shift
    return ad.AnnData(values, obs=screen.obs.copy(), var=screen.var.copy())


def _values(screen, model, control: str) -> pd.DataFrame:
    chosen = [p for p in load_suite("cell_eval") if p.name in PROTOCOLS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = score(
            screen,
            {"m": model},
            protocols=chosen,
            truth="all",
            control=control,
            baselines=False,
            workers=1,
            progress=False,
            figures=False,
        )
    return result.results.pivot_table(index="perturbation", columns="protocol", values="value")


def _energy(x: np.ndarray, y: np.ndarray) -> float:
    return 2 * cdist(x, y).mean() - cdist(x, x).mean() - cdist(y, y).mean()


def test_deltas_are_taken_against_the_models_own_control(screen):
    model = _model(screen, shift=0.8)
    values = _values(screen, model, "predicted")
    labels = _labels(screen)
    truth, pred = _dense(screen.X), _dense(model.X)
    control_truth = truth[labels == "control"].mean(axis=0)
    control_pred = pred[labels == "control"].mean(axis=0)
    perturbations = list(values.index)
    truth_deltas = np.array(
        [truth[labels == p].mean(axis=0) - control_truth for p in perturbations]
    )
    pred_deltas = np.array([pred[labels == p].mean(axis=0) - control_pred for p in perturbations])
    genes = np.asarray(screen.var_names)
    energies = np.array(
        [
            [_energy(x[labels == p], x[labels == "control"]) for p in perturbations]
            for x in (truth, pred)
        ]
    )
    for i, p in enumerate(perturbations):
        row = values.loc[p]
        assert row["pearson_delta"] == pytest.approx(
            stats.pearsonr(pred_deltas[i], truth_deltas[i])[0], rel=1e-10
        )
        assert row["mae_delta"] == pytest.approx(
            np.abs(pred_deltas[i] - truth_deltas[i]).mean(), rel=1e-10
        )
        assert row["mae"] == pytest.approx(
            np.abs(pred[labels == p].mean(axis=0) - truth[labels == p].mean(axis=0)).mean(),
            rel=1e-10,
        )
        kept = genes != p  # the target gene is left out
        distances = np.abs(truth_deltas[:, kept] - pred_deltas[i, kept]).sum(axis=1)
        closer = int((distances < distances[i]).sum())
        assert row["discrimination_score_l1"] == pytest.approx(1 - closer / len(perturbations))
        assert row["pearson_edistance"] == pytest.approx(
            stats.pearsonr(energies[0], energies[1])[0], rel=1e-9
        )


def test_de_is_taken_against_the_predicted_control_cells(screen):
    model = _model(screen, shift=0.8)
    dataset = load_dataset(screen)
    engine = Engine(Context(dataset), truth="all")
    (prediction,) = load_predictions(
        {"m": model}, dataset, engine.context.layout, control="predicted"
    )
    labels = _labels(screen)
    pred = _dense(model.X)
    control = pred[labels == "control"]
    space = resolve_space(engine, "full", 0)
    for condition in (0, 3):
        perturbation = engine.context.layout.conditions[condition].perturbation
        cells = pred[labels == perturbation]
        view = control_view(
            engine, "control_de", condition, prediction.source(engine, condition), space, ("m",)
        )
        pvalues = np.array(
            [
                stats.mannwhitneyu(
                    cells[:, g], control[:, g], method="asymptotic", use_continuity=False
                ).pvalue
                for g in range(cells.shape[1])
            ]
        )
        expected = stats.false_discovery_control(pvalues)
        np.testing.assert_allclose(view.fdr, expected.astype(np.float32), rtol=1e-6)
        with np.errstate(divide="ignore", invalid="ignore"):
            lfc = np.log2(np.expm1(cells.mean(axis=0)) / np.expm1(control.mean(axis=0)))
        lfc[np.isnan(lfc)] = 0.0
        np.testing.assert_allclose(view.log2_fold_change, lfc.astype(np.float32), rtol=1e-6)


def test_with_the_measured_control_copied_in_both_modes_agree(screen):
    model = _model(screen, shift=0.0)
    model.X[_labels(screen) == "control"] = _dense(screen.X)[_labels(screen) == "control"]
    measured = _values(screen, model, "measured")
    predicted = _values(screen, model, "predicted")
    pd.testing.assert_frame_equal(measured, predicted, rtol=1e-12)
    moved = _values(screen, _model(screen, shift=0.8), "predicted")
    assert not np.allclose(moved["pearson_delta"], predicted["pearson_delta"])
    # Expression itself does not depend on the control.
    np.testing.assert_allclose(moved["mae"], predicted["mae"], rtol=1e-12)


def _score(screen, models, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return score(screen, models, protocols="mae", baselines=False, progress=False, **options)


def test_refused_for_a_calibrated_run_and_an_unknown_mode(screen):
    with pytest.raises(SpecError, match="--truth all"):
        _score(screen, {"m": _model(screen, 0.0)}, control="predicted")
    with pytest.raises(SpecError, match="control must be"):
        _score(screen, {"m": _model(screen, 0.0)}, truth="all", control="mine")


def test_refused_for_a_model_without_predicted_control_cells(screen):
    model = _model(screen, 0.0)
    model = model[_labels(model) != "control"].copy()
    with pytest.raises(DatasetError, match="no predicted control cells"):
        _score(screen, {"m": model}, truth="all", control="predicted")


def test_every_covariate_group_needs_its_predicted_control():
    from scperteval.simulation import simulate

    truth = simulate(n_perturbations=3, n_genes=12, cells_per_perturbation=8, n_covariates=2)
    covariate = truth.obs["cell_line"].astype(str).to_numpy()
    lacking = sorted(set(covariate))[1]
    keep = ~((_labels(truth) == "control") & (covariate == lacking))
    model = truth[keep].copy()
    with pytest.raises(DatasetError, match=f"covariate group.*{lacking}"):
        _score(truth, {"m": model}, truth="all", control="predicted", covariate_key="cell_line")


def test_runs_of_the_two_modes_do_not_merge(screen, tmp_path):
    from scperteval.workflows.report import report

    model = _model(screen, 0.8)
    for control in ("measured", "predicted"):
        _score(
            screen,
            {f"m_{control}": model},
            truth="all",
            control=control,
            out=tmp_path / control,
            figures=False,
        )
    with pytest.raises(DatasetError, match="different control"):
        report([tmp_path / "measured", tmp_path / "predicted"], out=tmp_path / "merged")
