"""The ``cell_eval`` suite: views against the control, and runs on generated data."""

from __future__ import annotations

import numpy as np
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
from scperteval.workflows.calibrate import calibrate
from scperteval.workflows.score import score


@pytest.fixture(scope="module")
def screen():
    from scperteval.simulation import simulate

    return simulate(
        n_perturbations=6,
        n_genes=40,
        cells_per_perturbation=24,
        n_covariates=1,
        effect_size=1.5,
        seed=5,
    )


@pytest.fixture(scope="module")
def engine(screen) -> Engine:
    return Engine(Context(load_dataset(screen)), truth="all")


def _dense(matrix) -> np.ndarray:
    return np.asarray(matrix.toarray() if sp.issparse(matrix) else matrix, dtype=np.float64)


def test_truth_de_against_control_is_scipys_wilcoxon_with_bh(engine: Engine) -> None:
    layout = engine.context.layout
    dataset = engine.context.dataset
    control = _dense(dataset.rows(layout.control_positions(0)))
    space = resolve_space(engine, "full", 0)
    reference = engine.context.de(method="wilcoxon", reference="control")
    for condition in range(layout.n_conditions):
        view = control_view(
            engine, "control_de", condition, engine.source("truth", condition), space, "truth"
        )
        cells = _dense(dataset.rows(engine.positions(condition)))
        pvalues = np.array(
            [
                stats.mannwhitneyu(
                    cells[:, g], control[:, g], method="asymptotic", use_continuity=False
                ).pvalue
                if np.ptp(np.r_[cells[:, g], control[:, g]]) > 0
                else 1.0
                for g in range(cells.shape[1])
            ]
        )
        fdr = stats.false_discovery_control(pvalues)
        np.testing.assert_allclose(view.fdr, fdr.astype(np.float32), rtol=1e-6)
        np.testing.assert_allclose(
            view.fdr, reference.pvalue_adj[condition].astype(np.float32), rtol=1e-6
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            lfc = np.log2(np.expm1(cells.mean(axis=0)) / np.expm1(control.mean(axis=0)))
        lfc[np.isnan(lfc)] = 0.0
        np.testing.assert_allclose(view.log2_fold_change, lfc.astype(np.float32), rtol=1e-6)


def test_energy_distance_to_control_is_the_v_statistic(engine: Engine) -> None:
    layout = engine.context.layout
    dataset = engine.context.dataset
    control = _dense(dataset.rows(layout.control_positions(0)))
    space = resolve_space(engine, "full", 0)
    for condition in (0, 3):
        cells = _dense(dataset.rows(engine.positions(condition)))
        expected = (
            2 * cdist(cells, control).mean()
            - cdist(cells, cells).mean()
            - cdist(control, control).mean()
        )
        value = control_view(
            engine, "control_edistance", condition, engine.source("truth", condition), space
        )
        assert value == pytest.approx(expected, rel=1e-9)


def test_a_centroid_source_has_no_de_against_the_control(engine: Engine) -> None:
    from scperteval.metrics import DegenerateInput

    space = resolve_space(engine, "full", 0)
    with pytest.raises(DegenerateInput, match="cells"):
        control_view(engine, "control_de", 0, engine.source("dataset_mean", 0), space)


def test_vcc2025_is_the_challenges_three_cell_eval_protocols() -> None:
    cell_eval = {p.name: p.describe() for p in load_suite("cell_eval")}
    vcc = load_suite("vcc2025")
    assert [p.name for p in vcc] == ["discrimination_score_l1", "mae", "overlap_at_N"]
    for protocol in vcc:
        assert protocol.describe() == cell_eval[protocol.name]


def test_suite_has_every_cell_eval_metric() -> None:
    names = {p.name for p in load_suite("cell_eval")}
    expected = {f"{m}_at_{n}" for m in ("overlap", "precision") for n in ("N", 50, 100, 200, 500)}
    expected |= {
        "de_spearman_sig",
        "de_direction_match",
        "de_spearman_lfc_sig",
        "de_sig_genes_recall",
        "de_nsig_counts_real",
        "de_nsig_counts_pred",
        "pr_auc",
        "roc_auc",
        "pearson_delta",
        "mse",
        "mae",
        "mse_delta",
        "mae_delta",
        "discrimination_score_l1",
        "discrimination_score_l2",
        "discrimination_score_cosine",
        "pearson_edistance",
        "clustering_agreement",
    }
    assert names == expected


def test_calibrated_run_separates_the_controls(screen) -> None:
    run = calibrate(screen, protocols="cell_eval", workers=1, progress=False)
    threaded = calibrate(screen, protocols="cell_eval", workers=2, progress=False)
    # Views computed ahead by other threads change no value.
    assert run.results.equals(threaded.results)
    values = run.results.pivot_table(
        index=["protocol", "perturbation"], columns="source", values="value"
    )
    assert run.results["reason"].eq("").all()
    for name in ("overlap_at_N", "pr_auc", "de_sig_genes_recall", "pearson_delta"):
        block = values.loc[name]
        assert (block["positive"] > block["negative"]).mean() >= 0.75


def test_a_model_predicting_the_truth_cells_scores_perfectly(screen) -> None:
    perturbed = screen[screen.obs["perturbation"] != "control"].copy()
    result = score(
        screen,
        {"copy": perturbed},
        protocols="cell_eval",
        truth="all",
        baselines=False,
        workers=1,
        figures=False,
        progress=False,
    )
    table = result.results
    model = table[table["source"] == "model"].set_index(["protocol", "perturbation"])["value"]
    for name in (
        "overlap_at_N",
        "precision_at_N",
        "overlap_at_50",
        "de_direction_match",
        "de_spearman_lfc_sig",
        "de_sig_genes_recall",
        "pearson_delta",
        "discrimination_score_l1",
        "pearson_edistance",
        "de_spearman_sig",
        "roc_auc",
        "pr_auc",
        "clustering_agreement",
    ):
        np.testing.assert_allclose(model.loc[name].to_numpy(), 1.0, rtol=1e-12, err_msg=name)
    for name in ("mae", "mse", "mae_delta", "mse_delta"):
        np.testing.assert_allclose(model.loc[name].to_numpy(), 0.0, atol=1e-12, err_msg=name)
    np.testing.assert_array_equal(
        model.loc["de_nsig_counts_pred"].to_numpy(), model.loc["de_nsig_counts_real"].to_numpy()
    )


def test_invalid_metric_options_fail_when_the_protocol_is_built() -> None:
    from scperteval.engine.protocol import Protocol
    from scperteval.errors import SpecError

    base = {"name": "x", "negative": "matched_perturbed_sample"}
    for metric, message in (
        ("cell_eval_overlap(k=0)", "k must be"),
        ("cell_eval_precision(k=2.5)", "k must be"),
        ("cell_eval_direction_match(alpha=1.5)", "alpha must"),
        ("cell_eval_nsig_count(side='all')", "side must"),
    ):
        with pytest.raises(SpecError, match=message):
            Protocol.from_mapping({**base, "metric": metric})
    assert Protocol.from_mapping({**base, "metric": "cell_eval_overlap(k=50)"}).name == "x"


def test_identical_cells_are_exactly_zero_apart(engine: Engine) -> None:
    from scperteval.engine.sources import SourceData

    space = resolve_space(engine, "full", 0)
    dataset = engine.context.dataset
    cell = _dense(dataset.rows(engine.positions(0)[:1]))
    values = []
    for copies in (3, 7, 20):
        rows = np.repeat(cell, copies, axis=0)
        source = SourceData(centroid=rows.mean(axis=0), rows=rows)
        values.append(control_view(engine, "control_edistance", 0, source, space))
    control = _dense(dataset.rows(engine.context.layout.control_positions(0)))
    expected = 2 * cdist(cell, control).mean() - cdist(control, control).mean()
    # The same cell repeated: the same distance whatever the count, to rounding.
    np.testing.assert_allclose(values, expected, rtol=1e-12)
    assert max(values) - min(values) <= 1e-12 * abs(expected)
