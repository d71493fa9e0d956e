"""Sources: the truth, the controls and the baselines, checked against numpy on the cells."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.engine.engine import Engine
from scperteval.engine.sources import SOURCES
from scperteval.metrics import DegenerateInput
from scperteval.simulation import simulate

SEED = 5
TESTED = {
    "truth",
    "technical_duplicate",
    "interpolated_duplicate",
    "dataset_mean",
    "global_mean",
    "control_mean",
    "all_perturbed_sample",
    "matched_perturbed_sample",
    "control_cells",
    "additive",
}


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-12)


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
    labels = adata.obs["perturbation"].astype(str).to_numpy()
    groups = adata.obs["cell_line"].astype(str).to_numpy()

    def engine(**options):
        dataset = Dataset(adata, covariate_key="cell_line")
        return Engine(Context(dataset, seed=SEED), **options)

    eng = engine()
    conditions = eng.context.layout.conditions
    return SimpleNamespace(
        adata=adata,
        x=x.astype(np.float64),
        labels=labels,
        groups=groups,
        engine=eng,
        make_engine=engine,
        conditions=conditions,
        genes=list(adata.var_names),
    )


def cells_of(sim, k):
    """Positions of condition k's cells, from the obs columns."""
    c = sim.conditions[k]
    return np.flatnonzero((sim.labels == c.perturbation) & (sim.groups == c.covariate))


def others_in_group(sim, k):
    """Indices of the other conditions of k's covariate group."""
    c = sim.conditions[k]
    return [j for j, d in enumerate(sim.conditions) if d.covariate == c.covariate and j != k]


def other_perturbed_cells(sim, k):
    c = sim.conditions[k]
    mask = (sim.groups == c.covariate) & (sim.labels != "control") & (sim.labels != c.perturbation)
    return np.flatnonzero(mask)


def control_cells_of(sim, k):
    c = sim.conditions[k]
    return np.flatnonzero((sim.groups == c.covariate) & (sim.labels == "control"))


def halves(sim, k):
    layout = sim.engine.context.layout
    return layout.positions(k, "truth"), layout.positions(k, "duplicate")


def test_every_registered_source_is_tested_here():
    assert set(SOURCES.names()) == TESTED


def test_halves_split_each_perturbation(sim):
    assert len(sim.conditions) == 16
    for k in range(len(sim.conditions)):
        truth, duplicate = halves(sim, k)
        own = cells_of(sim, k)
        assert np.intersect1d(truth, duplicate).size == 0
        np.testing.assert_array_equal(np.union1d(truth, duplicate), own)
        assert truth.size == own.size // 2


@pytest.mark.parametrize("name, half", [("truth", 0), ("technical_duplicate", 1)])
def test_half_sources_are_the_means_of_their_cells(sim, name, half):
    for k in range(len(sim.conditions)):
        positions = halves(sim, k)[half]
        data = sim.engine.source(name, k)
        np.testing.assert_array_equal(data.positions, positions)
        cells = sim.x[positions]
        close(data.centroid, cells.mean(axis=0))
        assert data.moments.n[0] == positions.size
        close(data.moments.mean[0], cells.mean(axis=0))
        close(data.moments.variance()[0], cells.var(axis=0, ddof=1))


def test_truth_all_uses_every_cell_and_has_no_duplicate(sim):
    engine = sim.make_engine(truth="all")
    k = 3
    own = cells_of(sim, k)
    data = engine.source("truth", k)
    np.testing.assert_array_equal(data.positions, own)
    close(data.centroid, sim.x[own].mean(axis=0))
    for name in ("technical_duplicate", "interpolated_duplicate"):
        with pytest.raises(DegenerateInput):
            engine.source(name, k)


def test_dataset_mean_is_the_leave_one_out_mean_of_centroids(sim):
    for k in range(len(sim.conditions)):
        others = others_in_group(sim, k)
        assert len(others) == 7
        centroids = [sim.x[cells_of(sim, j)].mean(axis=0) for j in others]
        data = sim.engine.source("dataset_mean", k)
        close(data.centroid, np.mean(centroids, axis=0))
        assert data.positions is None and data.rows is None


def test_control_mean(sim):
    for k in range(len(sim.conditions)):
        close(
            sim.engine.source("control_mean", k).centroid,
            sim.x[control_cells_of(sim, k)].mean(axis=0),
        )


def test_global_mean_is_the_mean_of_the_other_perturbed_cells(sim):
    for k in range(len(sim.conditions)):
        close(
            sim.engine.source("global_mean", k).centroid,
            sim.x[other_perturbed_cells(sim, k)].mean(axis=0),
        )


def test_interpolated_duplicate_shrinks_by_adjusted_p_value(sim):
    for k in (0, 4, 9):
        _, duplicate = halves(sim, k)
        rest = other_perturbed_cells(sim, k)
        _, pvalue = stats.ttest_ind(sim.x[duplicate], sim.x[rest], axis=0, equal_var=False)
        # Documented rule: a gene constant and equal in both groups has p = 1.
        pvalue = np.where(np.isnan(pvalue), 1.0, pvalue)
        alpha = 1.0 - stats.false_discovery_control(pvalue, method="bh")
        others = others_in_group(sim, k)
        mean = np.mean([sim.x[cells_of(sim, j)].mean(axis=0) for j in others], axis=0)
        expected = alpha * sim.x[duplicate].mean(axis=0) + (1.0 - alpha) * mean
        np.testing.assert_allclose(
            sim.engine.source("interpolated_duplicate", k).centroid, expected, rtol=1e-7, atol=1e-9
        )
        # The interpolation is a real mix here: some genes are shrunk, some are not.
        assert (alpha < 0.5).any() and (alpha > 0.5).any()


@pytest.mark.parametrize("cap", [50, 100_000])
def test_all_perturbed_sample(sim, cap):
    engine = sim.make_engine(sample_cells=cap)
    again = sim.make_engine(sample_cells=cap)
    samples = {}
    for k in range(len(sim.conditions)):
        data = engine.source("all_perturbed_sample", k)
        positions = data.positions
        samples[k] = positions
        own = cells_of(sim, k)
        assert np.intersect1d(positions, own).size == 0
        assert np.isin(positions, other_perturbed_cells(sim, k)).all()
        assert positions.size <= cap
        if cap >= sim.x.shape[0]:
            np.testing.assert_array_equal(positions, other_perturbed_cells(sim, k))
        np.testing.assert_array_equal(again.source("all_perturbed_sample", k).positions, positions)
        cells = sim.x[np.sort(positions)]
        assert data.moments.n[0] == positions.size
        close(data.centroid, cells.mean(axis=0))
        close(data.moments.mean[0], cells.mean(axis=0))
        close(data.moments.variance()[0], cells.var(axis=0, ddof=1))
        rest = engine.context.rest_stats().select([k])
        if cap >= sim.x.shape[0]:
            # The whole group: the very statistics of the DE reference, so that a DE
            # view of this control has statistics of exactly 0, not rounding noise.
            np.testing.assert_array_equal(data.moments.mean, rest.mean)
            np.testing.assert_array_equal(data.moments.m2, rest.m2)
        else:
            assert data.moments.n[0] < rest.n[0]
    # One sample per covariate group: two perturbations' samples differ only by
    # each other's cells.
    for a, b in ((0, 5), (9, 14)):
        np.testing.assert_array_equal(
            np.setdiff1d(samples[a], cells_of(sim, b)), np.setdiff1d(samples[b], cells_of(sim, a))
        )
    # The cap is the size of the group's shared sample (the union of the
    # perturbations' samples, since each only lacks its own cells).
    for group in ("cell_line_0", "cell_line_1"):
        members = [k for k, c in enumerate(sim.conditions) if c.covariate == group]
        shared = np.unique(np.concatenate([samples[k] for k in members]))
        pool = np.flatnonzero((sim.groups == group) & (sim.labels != "control"))
        assert shared.size == min(cap, pool.size)


def test_all_perturbed_sample_depends_on_the_seed(sim):
    dataset = Dataset(sim.adata, covariate_key="cell_line")
    one = Engine(Context(dataset, seed=1), sample_cells=50)
    two = Engine(Context(dataset, seed=2), sample_cells=50)
    first = one.source("all_perturbed_sample", 0).positions
    second = two.source("all_perturbed_sample", 0).positions
    assert not np.array_equal(first, second)


def test_matched_perturbed_sample(sim):
    engine = sim.make_engine(sample_cells=200)
    again = sim.make_engine(sample_cells=200)
    for k in range(len(sim.conditions)):
        _, duplicate = halves(sim, k)
        data = engine.source("matched_perturbed_sample", k)
        pool = engine.source("all_perturbed_sample", k).positions
        assert data.positions.size == duplicate.size
        assert np.isin(data.positions, pool).all()
        np.testing.assert_array_equal(
            again.source("matched_perturbed_sample", k).positions, data.positions
        )
        cells = sim.x[np.sort(data.positions)]
        close(data.centroid, cells.mean(axis=0))
        close(data.moments.variance()[0], cells.var(axis=0, ddof=1))


@pytest.mark.parametrize("cap", [30, 100_000])
def test_control_cells(sim, cap):
    engine = sim.make_engine(sample_cells=cap)
    for k in (0, 8):
        data = engine.source("control_cells", k)
        controls = control_cells_of(sim, k)
        assert np.isin(data.positions, controls).all()
        assert data.positions.size == min(cap, controls.size)
        close(data.centroid, sim.x[data.positions].mean(axis=0))
        close(data.moments.variance()[0], sim.x[data.positions].var(axis=0, ddof=1))


def test_additive_baseline(sim):
    combinations = [k for k, c in enumerate(sim.conditions) if "+" in c.perturbation]
    assert len(combinations) == 4
    for k in combinations:
        c = sim.conditions[k]
        control = sim.x[control_cells_of(sim, k)].mean(axis=0)
        expected = control.copy()
        for single in c.perturbation.split("+"):
            cells = np.flatnonzero((sim.labels == single) & (sim.groups == c.covariate))
            expected += sim.x[cells].mean(axis=0) - control
        close(sim.engine.source("additive", k).centroid, expected)


def test_additive_is_undefined_for_singles(sim):
    singles = [k for k, c in enumerate(sim.conditions) if "+" not in c.perturbation]
    for k in singles:
        with pytest.raises(DegenerateInput, match="not a combination"):
            sim.engine.source("additive", k)


def test_additive_needs_its_singles():
    adata = simulate(n_perturbations=4, n_genes=20, cells_per_perturbation=12, n_combinations=1)
    combination = next(p for p in adata.obs["perturbation"].unique() if "+" in p)
    single = combination.split("+")[0]
    adata = adata[adata.obs["perturbation"] != single].copy()
    engine = Engine(Context(Dataset(adata), seed=0))
    k = engine.context.layout.index_of(engine.covariates[0], combination)
    with pytest.raises(DegenerateInput, match=single):
        engine.source("additive", k)
