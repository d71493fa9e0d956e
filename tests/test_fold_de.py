"""DE under a split: each held-out perturbation against its fold's training cells.

Values are checked against scipy's tests on the cells themselves, and the DE-based
protocols (DEG weights, top-k DE genes, the interpolated duplicate) against NumPy
on those tests.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import pytest
from scipy import stats

from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.engine.engine import Engine
from scperteval.errors import SpecError
from scperteval.simulation import simulate
from scperteval.splits.split import Split
from scperteval.workflows.calibrate import calibrate
from scperteval.workflows.score import score

N_FOLDS = 4
SEED = 3


@pytest.fixture(scope="module")
def screen() -> ad.AnnData:
    return simulate(
        n_perturbations=16, n_genes=60, cells_per_perturbation=24, n_combinations=4, seed=5
    )


@pytest.fixture(scope="module")
def four_folds(screen: ad.AnnData) -> Split:
    labels = sorted(set(screen.obs["perturbation"].astype(str)) - {"control"})
    return Split.from_folds({("all", p): str(i % N_FOLDS) for i, p in enumerate(labels)}, seed=7)


def _engine(
    screen: ad.AnnData, split: Split, method: str = "t-test", covariate_key: str | None = None
) -> Engine:
    dataset = Dataset(screen, covariate_key=covariate_key)
    engine = Engine(Context(dataset, seed=SEED, de_method=method), truth="half")
    engine.use_split(split)
    return engine


def _dense(screen: ad.AnnData) -> np.ndarray:
    matrix = screen.X.toarray() if hasattr(screen.X, "toarray") else screen.X
    return np.asarray(matrix, dtype=np.float64)


def _training_cells(engine: Engine, split: Split, condition: int) -> np.ndarray:
    """Positions of the cells of the training perturbations of the condition's fold."""
    layout = engine.context.layout
    fold = engine.folds.fold_name(condition)
    group = layout.conditions[condition].covariate
    names = [(c.covariate, c.perturbation) for c in layout.conditions]
    training = [k for k, name in enumerate(names) if name in split.train[fold] and name[0] == group]
    return np.sort(np.concatenate([layout.positions(k) for k in training]))


def _scored(engine: Engine) -> list[int]:
    return [int(k) for k in engine.scored_conditions()]


def _truth_and_training(engine: Engine, split: Split, cells: np.ndarray):
    """Per held-out condition: its index, its truth cells and its fold's training cells."""
    layout = engine.context.layout
    for condition in _scored(engine):
        truth = cells[layout.positions(condition, "truth")]
        yield condition, truth, cells[_training_cells(engine, split, condition)]


def test_welch_de_is_against_the_fold_training_cells(screen, four_folds):
    engine = _engine(screen, four_folds)
    cells = _dense(screen)
    layout = engine.context.layout
    de = engine.truth_de()
    assert de.reference == "training"
    for condition in _scored(engine):
        truth = cells[layout.positions(condition, "truth")]
        reference = cells[_training_cells(engine, four_folds, condition)]
        expected = stats.ttest_ind(truth, reference, equal_var=False)
        tested = np.isfinite(expected.statistic)
        assert tested.sum() > 40
        np.testing.assert_allclose(
            de.statistic[condition][tested], expected.statistic[tested], rtol=1e-10
        )
        np.testing.assert_allclose(de.pvalue[condition][tested], expected.pvalue[tested], rtol=1e-9)
        adjusted = stats.false_discovery_control(de.pvalue[condition])
        np.testing.assert_allclose(de.pvalue_adj[condition], adjusted, rtol=1e-12)
        np.testing.assert_allclose(de.mean_reference[condition], reference.mean(axis=0), rtol=1e-12)
    # The reference is not the other perturbed cells: the unsplit DE differs.
    unsplit = Engine(engine.context, truth="half").truth_de()
    first = _scored(engine)[0]
    assert not np.allclose(unsplit.statistic[first], de.statistic[first])


def test_wilcoxon_de_is_against_the_fold_training_cells(screen, four_folds):
    engine = _engine(screen, four_folds, method="wilcoxon")
    de = engine.truth_de()
    for condition, truth, reference in _truth_and_training(engine, four_folds, _dense(screen)):
        expected = stats.mannwhitneyu(
            truth, reference, method="asymptotic", use_continuity=False, axis=0
        )
        tested = np.isfinite(expected.pvalue)
        np.testing.assert_allclose(
            de.pvalue[condition][tested], expected.pvalue[tested], rtol=1e-12, atol=1e-300
        )
        assert np.all(np.isfinite(de.pvalue_adj[condition]))


def test_de_protocols_use_the_training_de(screen, four_folds):
    """Interpolated duplicate, DEG weights and top-k genes from the training-fold tests."""
    result = calibrate(
        screen,
        protocols="mse_interpolated,weighted_mse,mse_top_k",
        split=four_folds,
        seed=SEED,
    )
    values = result.results.set_index(["perturbation", "protocol", "source_name"])["value"]
    engine = _engine(screen, four_folds)
    cells = _dense(screen)
    layout = engine.context.layout
    checked = 0
    for condition in _scored(engine):
        label = layout.conditions[condition].perturbation
        truth_cells = cells[layout.positions(condition, "truth")]
        duplicate_cells = cells[layout.positions(condition, "duplicate")]
        training = engine.training_conditions(condition)
        training_mean = np.mean(
            [cells[layout.positions(int(k))].mean(axis=0) for k in training], axis=0
        )
        reference = cells[_training_cells(engine, four_folds, condition)]
        truth, duplicate = truth_cells.mean(axis=0), duplicate_cells.mean(axis=0)

        duplicate_test = stats.ttest_ind(duplicate_cells, reference, equal_var=False)
        alpha = 1.0 - stats.false_discovery_control(duplicate_test.pvalue)
        interpolated = alpha * duplicate + (1.0 - alpha) * training_mean
        assert values[(label, "mse_interpolated", "interpolated_duplicate")] == pytest.approx(
            np.mean((truth - interpolated) ** 2), rel=1e-9
        )

        strength = np.abs(stats.ttest_ind(truth_cells, reference, equal_var=False).statistic)
        scaled = ((strength - strength.min()) / (strength.max() - strength.min())) ** 2
        weights = scaled / scaled.sum()
        assert values[(label, "weighted_mse", "dataset_mean")] == pytest.approx(
            np.sum(weights * (truth - training_mean) ** 2), rel=1e-9
        )

        top = np.argsort(-strength, kind="stable")[:50]
        assert values[(label, "mse_top_k", "technical_duplicate")] == pytest.approx(
            np.mean((truth[top] - duplicate[top]) ** 2), rel=1e-9
        )
        checked += 1
    assert checked == len(_scored(engine)) > 0


def test_de_table_with_a_split_is_refused_before_reading(screen, four_folds, tmp_path):
    # The table is never read: the options are refused first.
    path = str(tmp_path / "absent_de.csv")
    with pytest.raises(SpecError, match="DE table or the split"):
        score(screen, {"m": screen}, split=four_folds, de_tables=path, figures=False)
    with pytest.raises(SpecError, match="DE table or the split"):
        calibrate(screen, split=four_folds, de_tables=[path])


@pytest.mark.parametrize("method", ["t-test", "wilcoxon"])
def test_the_reference_stays_within_the_covariate_group(method):
    screen = simulate(n_perturbations=9, n_genes=40, cells_per_perturbation=20, n_covariates=2)
    pairs = screen.obs[["cell_line", "perturbation"]].astype(str).drop_duplicates()
    pairs = pairs[pairs["perturbation"] != "control"]
    names = sorted(zip(pairs["cell_line"], pairs["perturbation"], strict=True))
    split = Split.from_folds({name: str(i % 3) for i, name in enumerate(names)}, seed=1)
    engine = _engine(screen, split, method, covariate_key="cell_line")
    de = engine.truth_de()
    for condition, truth, reference in _truth_and_training(engine, split, _dense(screen)):
        if method == "t-test":
            expected = stats.ttest_ind(truth, reference, equal_var=False).pvalue
        else:
            expected = stats.mannwhitneyu(
                truth, reference, method="asymptotic", use_continuity=False, axis=0
            ).pvalue
        tested = np.isfinite(expected)
        np.testing.assert_allclose(de.pvalue[condition][tested], expected[tested], rtol=1e-9)
