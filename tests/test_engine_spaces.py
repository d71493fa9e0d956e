"""Feature spaces: gene selections and the PCA projection, against numpy and scipy."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.engine.engine import Engine
from scperteval.engine.spaces import (
    SPACES,
    parse_cells_space,
    resolve_space,
    space_is_per_condition,
)
from scperteval.errors import SpecError
from scperteval.metrics import DegenerateInput
from scperteval.simulation import simulate
from scperteval.workflows.calibrate import calibrate

SEED = 2


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
    dataset = Dataset(adata, covariate_key="cell_line")
    engine = Engine(Context(dataset, seed=SEED))
    return SimpleNamespace(
        adata=adata,
        x=x.astype(np.float64),
        labels=adata.obs["perturbation"].astype(str).to_numpy(),
        groups=adata.obs["cell_line"].astype(str).to_numpy(),
        engine=engine,
        conditions=engine.context.layout.conditions,
        genes=np.asarray(adata.var_names),
    )


def top_indices(scores, k):
    """The k largest scores, checking that the cut-off is not a tie."""
    order = np.argsort(-scores, kind="stable")
    assert scores[order[k - 1]] > scores[order[k]], "tie at the cut-off: pick another k"
    return np.sort(order[:k])


def truth_t(sim, k):
    """Welch t of k's truth half vs the other perturbed cells of its group (scipy)."""
    c = sim.conditions[k]
    truth = sim.engine.context.layout.positions(k, "truth")
    rest = (sim.groups == c.covariate) & (sim.labels != "control") & (sim.labels != c.perturbation)
    t, p = stats.ttest_ind(sim.x[truth], sim.x[rest], axis=0, equal_var=False)
    return t, p


def group_cells(sim, covariate):
    return np.flatnonzero(sim.groups == covariate)


def test_full_space_is_every_gene(sim):
    space = resolve_space(sim.engine, "full", 0)
    np.testing.assert_array_equal(space.genes, np.arange(60))
    np.testing.assert_array_equal(space.names, sim.genes)


@pytest.mark.parametrize("k_genes", [5, 20])
def test_top_k_picks_the_largest_truth_t(sim, k_genes):
    for k in (0, 4, 11):
        t, _ = truth_t(sim, k)
        space = resolve_space(sim.engine, f"top_k(k={k_genes})", k)
        expected = top_indices(np.abs(t), k_genes)
        np.testing.assert_array_equal(space.genes, expected)
        np.testing.assert_array_equal(space.names, sim.genes[expected])


def test_top_k_larger_than_the_genes_is_every_gene(sim):
    np.testing.assert_array_equal(resolve_space(sim.engine, "top_k(k=500)", 0).genes, np.arange(60))


@pytest.mark.parametrize("spec", ["top_k(k=0)", "hvg(k=-1)", "pca(k=0)"])
def test_space_size_must_be_positive(sim, spec):
    with pytest.raises(SpecError, match="at least 1"):
        resolve_space(sim.engine, spec, 0)


def test_degs_padj_is_the_truth_bh_set(sim):
    for k in (0, 9):
        _, p = truth_t(sim, k)
        padj = stats.false_discovery_control(np.where(np.isnan(p), 1.0, p), method="bh")
        space = resolve_space(sim.engine, "degs_padj(alpha=0.05)", k)
        expected = np.flatnonzero(padj < 0.05)
        assert 0 < expected.size < 60
        np.testing.assert_array_equal(space.genes, expected)


def test_heg_picks_the_highest_control_means(sim):
    for k, covariate in ((0, "cell_line_0"), (8, "cell_line_1")):
        controls = (sim.groups == covariate) & (sim.labels == "control")
        expected = top_indices(sim.x[controls].mean(axis=0), 10)
        np.testing.assert_array_equal(resolve_space(sim.engine, "heg(k=10)", k).genes, expected)


def test_hvg_picks_the_most_variable_genes_of_the_group(sim):
    for k, covariate in ((0, "cell_line_0"), (8, "cell_line_1")):
        variance = sim.x[group_cells(sim, covariate)].var(axis=0)
        expected = top_indices(variance, 12)
        space = resolve_space(sim.engine, "hvg(k=12)", k)
        np.testing.assert_array_equal(space.genes, expected)
    # The choice depends on the covariate group, not on the perturbation.
    np.testing.assert_array_equal(
        resolve_space(sim.engine, "hvg(k=12)", 1).genes,
        resolve_space(sim.engine, "hvg(k=12)", 7).genes,
    )


def test_perturbed_genes_are_the_targets(sim):
    index = {name: i for i, name in enumerate(sim.genes)}
    for k, condition in enumerate(sim.conditions):
        targets = sorted(index[g] for g in condition.perturbation.split("+"))
        space = resolve_space(sim.engine, "perturbed_genes", k)
        assert sorted(space.genes.tolist()) == targets


def test_perturbed_genes_not_measured_is_degenerate():
    adata = simulate(n_perturbations=3, n_genes=20, cells_per_perturbation=10, seed=1)
    target = next(p for p in adata.obs["perturbation"].unique() if p != "control")
    adata = adata[:, adata.var_names != target].copy()
    engine = Engine(Context(Dataset(adata), seed=0))
    k = engine.context.layout.index_of(engine.covariates[0], target)
    with pytest.raises(DegenerateInput, match="not measured"):
        resolve_space(engine, "perturbed_genes", k)


def test_union_and_intersection(sim):
    k = 4
    top = set(resolve_space(sim.engine, "top_k(k=10)", k).genes.tolist())
    heg = set(resolve_space(sim.engine, "heg(k=15)", k).genes.tolist())
    hvg = set(resolve_space(sim.engine, "hvg(k=30)", k).genes.tolist())
    union = resolve_space(sim.engine, "top_k(k=10) | heg(k=15)", k)
    assert union.genes.tolist() == sorted(top | heg)
    assert len(top | heg) > max(len(top), len(heg))
    three = resolve_space(sim.engine, "top_k(k=10) | heg(k=15) | perturbed_genes", k)
    targets = set(resolve_space(sim.engine, "perturbed_genes", k).genes.tolist())
    assert three.genes.tolist() == sorted(top | heg | targets)
    both = resolve_space(sim.engine, "top_k(k=10) & hvg(k=30)", k)
    assert both.genes.tolist() == sorted(top & hvg)
    assert 0 < len(top & hvg) < len(top)
    np.testing.assert_array_equal(both.names, sim.genes[both.genes])


def test_combination_rules(sim):
    with pytest.raises(SpecError, match="only gene selections"):
        resolve_space(sim.engine, "top_k(k=5) | pca(k=3)", 0)
    with pytest.raises(SpecError, match="mix"):
        resolve_space(sim.engine, "top_k(k=5) | heg(k=5) & hvg(k=5)", 0)
    # Disjoint selections: the most expressed control gene is not the target of G1.
    controls = (sim.groups == "cell_line_0") & (sim.labels == "control")
    assert sim.conditions[0].perturbation == "G1"
    assert sim.genes[np.argmax(sim.x[controls].mean(axis=0))] != "G1"
    with pytest.raises(DegenerateInput, match="empty"):
        resolve_space(sim.engine, "heg(k=1) & perturbed_genes", 0)


def test_per_condition_flags():
    assert space_is_per_condition("top_k(k=3)")
    assert space_is_per_condition("hvg(k=3) | degs_padj")
    assert space_is_per_condition("perturbed_genes")
    assert not space_is_per_condition("full")
    assert not space_is_per_condition("hvg(k=5) & heg(k=4)")
    assert not space_is_per_condition("pca(k=5)")
    with pytest.raises(SpecError, match="valid names"):
        space_is_per_condition("topk")


# ----------------------------------------------------------------------- PCA


def test_pca_fit(sim):
    n_components = 6
    for k, covariate in ((0, "cell_line_0"), (8, "cell_line_1")):
        space = resolve_space(sim.engine, f"pca(k={n_components})", k)
        cells = sim.x[group_cells(sim, covariate)]
        assert space.genes is None
        assert space.names.tolist() == [f"PC{i + 1}" for i in range(n_components)]
        components = space.components
        assert components.shape == (60, n_components)
        np.testing.assert_allclose(components.T @ components, np.eye(n_components), atol=1e-10)
        np.testing.assert_allclose(space.offset, cells.mean(axis=0), rtol=1e-10, atol=1e-12)
        # The span is the top eigenvectors of the covariance of the group's cells.
        eigenvalues, eigenvectors = np.linalg.eigh(np.cov(cells, rowvar=False))
        top = eigenvectors[:, ::-1][:, :n_components]
        assert eigenvalues[::-1][n_components - 1] > 1.01 * eigenvalues[::-1][n_components]
        np.testing.assert_allclose(components @ components.T, top @ top.T, atol=1e-8)
        # Components in order of explained variance.
        explained = ((cells - cells.mean(axis=0)) @ components).var(axis=0)
        assert np.all(np.diff(explained) < 0)


def test_pca_projection_is_linear(sim):
    k = 2
    space = resolve_space(sim.engine, "pca(k=5)", k)
    cells = sim.x[sim.engine.context.layout.positions(k, "all")]
    centroid = cells.mean(axis=0)
    projected = space.matrix(sp.csr_matrix(cells))
    np.testing.assert_allclose(space.vector(centroid), projected.mean(axis=0), atol=1e-10)
    np.testing.assert_allclose(
        projected, (cells - space.offset) @ space.components, rtol=1e-10, atol=1e-10
    )
    # A delta is projected without the offset.
    control = sim.x[(sim.groups == "cell_line_0") & (sim.labels == "control")].mean(axis=0)
    np.testing.assert_allclose(
        space.vector(centroid - control, is_delta=True),
        space.vector(centroid) - space.vector(control),
        atol=1e-10,
    )


def test_pca_is_deterministic_per_seed(sim):
    def fit(seed):
        dataset = Dataset(sim.adata, covariate_key="cell_line")
        engine = Engine(Context(dataset, seed=seed), pca_cells=150)
        return resolve_space(engine, "pca(k=4)", 0)

    first, again, other = fit(11), fit(11), fit(12)
    np.testing.assert_array_equal(first.components, again.components)
    np.testing.assert_array_equal(first.offset, again.offset)
    # pca_cells below the group's size: the seed picks the cells of the fit.
    assert not np.array_equal(first.offset, other.offset)
    # Signs are fixed: the largest loading of each component is positive.
    rows = np.argmax(np.abs(first.components), axis=0)
    assert np.all(first.components[rows, np.arange(4)] > 0)


def test_every_registered_space_resolves(sim):
    for name in SPACES.names():
        space = resolve_space(sim.engine, name, 1)
        assert space.size >= 1


# ---------------------------------------------------------- empty DEG spaces


def test_empty_degs_space_is_nan_with_reason(sim):
    alpha = 1e-12
    protocol = {"name": "mse_strict_degs", "metric": "mse", "space": f"degs_padj(alpha={alpha})"}
    result = calibrate(sim.adata, protocols=[protocol], covariate_key="cell_line", seed=SEED)
    table = result.results
    empty, kept = 0, 0
    for k, condition in enumerate(sim.conditions):
        _, p = truth_t(sim, k)
        padj = stats.false_discovery_control(np.where(np.isnan(p), 1.0, p), method="bh")
        rows = table[
            (table["covariate"] == condition.covariate)
            & (table["perturbation"] == condition.perturbation)
        ]
        assert len(rows) == 2
        if padj.min() > 10 * alpha:
            empty += 1
            assert rows["value"].isna().all()
            assert rows["reason"].str.contains("adjusted p-value").all()
        elif padj.min() < alpha / 10:
            kept += 1
            assert np.isfinite(rows["value"]).all()
            assert (rows["reason"] == "").all()
    assert empty > 0 and kept > 0
    # Both kinds are in the calibration: NaN perturbations are skipped and counted.
    overall = result.calibration.set_index("covariate").loc["all"]
    assert overall["n_skipped"] >= empty
    assert overall["n"] + overall["n_skipped"] == len(sim.conditions)


def test_top_scores_are_the_head_of_a_full_sort_with_ties_in_gene_order():
    from scperteval.engine.spaces import top_indices

    def by_full_sort(scores, k):
        keys = -np.nan_to_num(scores, nan=-np.inf)
        order = sorted(range(scores.size), key=lambda gene: (keys[gene], gene))
        return np.array(sorted(order[:k]), dtype=np.int64)

    rng = np.random.default_rng(5)
    for trial in range(400):
        size = int(rng.integers(1, 40))
        scores = rng.integers(-2, 3, size).astype(np.float64)
        for value, share in ((np.nan, 0.2), (np.inf, 0.1), (-np.inf, 0.1), (-0.0, 0.2)):
            if trial % 2:
                scores[rng.random(size) < share] = value
        for k in range(size + 2):
            np.testing.assert_array_equal(top_indices(scores, k), by_full_sort(scores, k))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("full", ("full", {})),
        ("hvg", ("hvg", {"k": 2000})),
        ("hvg(k=3)", ("hvg", {"k": 3})),
        ("pca", ("pca", {"k": 50})),
        (" pca(k=7) ", ("pca", {"k": 7})),
    ],
)
def test_spaces_fitted_from_cells_parse_with_the_registered_defaults(spec, expected):
    assert parse_cells_space(spec) == expected
    # The same spec names the same registered space for the protocols.
    assert SPACES.resolve(spec).name == expected[0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tsne", "unknown space"),
        ("pca(k=0)", "at least 1"),
        ("hvg(n=3)", "no option 'n'"),
        ("top_k(k=5)", "truth or controls"),
        ("degs_padj", "truth or controls"),
    ],
)
def test_spaces_that_need_more_than_cells_are_refused(spec, message):
    with pytest.raises(SpecError, match=message):
        parse_cells_space(spec)
