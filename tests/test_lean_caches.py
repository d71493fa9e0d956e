"""Derived data kept lean: each shortcut gives the very values of the direct computation.

The run caches less (raw p-values, fold changes, leave-one-out mean tables, copies
of sampled rows, per-view adjusted p-values); every test compares the shortcut
with the computation it replaces, bit for bit.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp

import scperteval
from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.engine.engine import Engine
from scperteval.engine.sources import SourceData
from scperteval.engine.spaces import resolve_space
from scperteval.engine.views import _de_table_holding, _de_view
from scperteval.simulation import simulate
from scperteval.stats.diffexp import log_fold_change, welch_between, welch_statistic_between
from scperteval.stats.groups import GroupStats
from scperteval.stats.multiple_testing import benjamini_hochberg


@pytest.fixture(scope="module")
def adata():
    return simulate(
        n_perturbations=6,
        n_genes=60,
        cells_per_perturbation=40,
        n_covariates=2,
        n_combinations=2,
        seed=11,
    )


def make_engine(adata, de_method="t-test", **options):
    dataset = Dataset(adata, covariate_key="cell_line")
    return Engine(Context(dataset, seed=3, de_method=de_method), **options)


@pytest.mark.parametrize("method", ["t-test", "t-test_overestim_var"])
@pytest.mark.parametrize("half", ["truth", "duplicate", "all"])
def test_deferred_pvalues_and_fold_changes_are_the_direct_ones(adata, method, half):
    context = make_engine(adata, de_method=method).context
    result = context.de(reference="rest", half=half)
    target, reference = context.condition_stats(half), context.rest_stats()
    statistic, pvalue = welch_between(target, reference, method == "t-test_overestim_var")
    np.testing.assert_array_equal(result.statistic, statistic)
    np.testing.assert_array_equal(result.pvalue_adj, benjamini_hochberg(pvalue))
    np.testing.assert_array_equal(result.pvalue, pvalue)
    expected_lfc = log_fold_change(target.mean, reference.mean)
    np.testing.assert_array_equal(result.log_fold_change, expected_lfc)
    # The table written from a result carries the same columns.
    frame = result.to_frame()
    np.testing.assert_array_equal(frame["pvalue"].to_numpy(), pvalue.ravel())
    np.testing.assert_array_equal(frame["log_fold_change"].to_numpy(), expected_lfc.ravel())


def test_a_result_with_deferred_columns_pickles_with_its_values(adata):
    result = make_engine(adata).context.de(reference="rest", half="truth")
    copy = pickle.loads(pickle.dumps(result))
    np.testing.assert_array_equal(copy.pvalue, result.pvalue)
    np.testing.assert_array_equal(copy.log_fold_change, result.log_fold_change)
    assert "t-test" in repr(copy) and "truth" in repr(copy)


def test_wilcoxon_keeps_its_raw_pvalues(adata):
    result = make_engine(adata, de_method="wilcoxon").context.de(reference="rest", half="truth")
    assert isinstance(result._pvalue, np.ndarray)
    np.testing.assert_array_equal(result.pvalue_adj, benjamini_hochberg(result.pvalue))


def test_adjusting_in_place_gives_the_same_values_in_the_same_array():
    rng = np.random.default_rng(0)
    pvalues = rng.uniform(size=(7, 300))
    pvalues[:, :20] = pvalues[:, :1]  # ties
    pvalues[0, 5] = 0.0
    pvalues[1, 7] = 1.0
    expected = benjamini_hochberg(pvalues)
    work = pvalues.copy()
    adjusted = benjamini_hochberg(work, overwrite=True)
    assert np.shares_memory(adjusted, work)
    np.testing.assert_array_equal(adjusted, expected)
    # Without overwrite the input is untouched.
    again = pvalues.copy()
    benjamini_hochberg(again)
    np.testing.assert_array_equal(again, pvalues)


@pytest.mark.parametrize("method", ["t-test", "t-test_overestim_var"])
@pytest.mark.parametrize("source_name", ["truth", "technical_duplicate"])
def test_de_views_of_halves_are_rows_of_the_de_tables(adata, method, source_name):
    engine = make_engine(adata, de_method=method)
    overestimate = method == "t-test_overestim_var"
    context = engine.context
    space = resolve_space(engine, "full", 0)
    # The duplicate's table is read once computed (interpolated_duplicate needs it).
    context.de(reference="rest", half="duplicate")
    for condition in range(context.layout.n_conditions):
        source = engine.source(source_name, condition)
        assert source.half is not None
        view = _de_view(engine, condition, source, space, cache_key=source_name)
        # The same source without its half tag is tested from its moments directly.
        untagged = SourceData(centroid=source.centroid, moments=source.moments)
        direct = _de_view(engine, condition, untagged, space)
        rest = context.rest_stats().group(condition)
        expected = welch_statistic_between(source.moments, rest, overestimate)[0]
        np.testing.assert_array_equal(view.statistic, expected)
        np.testing.assert_array_equal(direct.statistic, expected)
        np.testing.assert_array_equal(view.pvalue_adj, direct.pvalue_adj)


def test_de_origin_tells_computed_read_and_pending_tables_apart(adata, tmp_path):
    from scperteval.stats.de_tables import read_de_table

    engine = make_engine(adata)
    context = engine.context
    assert context.de_origin(reference="rest", half="truth") is None
    table = context.de(reference="rest", half="truth")
    assert context.de_origin(reference="rest", half="truth") == "computed"
    assert context.de_origin(method="wilcoxon", reference="rest", half="truth") is None
    # A table given by the user stands for the DE, but the views test the cells.
    scperteval.de(adata, covariate_key="cell_line", half="truth", seed=3, out=tmp_path / "de")
    other = make_engine(adata)
    layout = other.context.layout
    read = read_de_table(tmp_path / "de", layout.conditions, adata.var_names, "control", 3)
    other.context.use_de_table(read)
    assert other.context.de_origin(reference="rest", half="truth") == "table"
    source = other.source("truth", 0)
    assert _de_table_holding(other, source) is None
    assert _de_table_holding(engine, engine.source("truth", 0)) is table


def test_sample_moments_without_copying_rows_equal_those_of_the_copied_rows(adata):
    engine = make_engine(adata)
    dataset = engine.context.dataset
    assert dataset.resident_csr() is not None
    rng = np.random.default_rng(4)
    for size in (1, 2, 37, dataset.n_cells // 2, dataset.n_cells):
        positions = rng.choice(dataset.n_cells, size, replace=False)
        rows = dataset.rows(np.sort(positions))
        expected = GroupStats.from_chunk(rows, np.zeros(rows.shape[0], dtype=np.int64), 1)
        found = engine.moments_of(positions)
        np.testing.assert_array_equal(found.n, expected.n)
        np.testing.assert_array_equal(found.mean, expected.mean)
        np.testing.assert_array_equal(found.m2, expected.m2)


def test_no_resident_csr_for_dense_normalised_or_subset_data(adata):
    dense = adata.copy()
    dense.X = np.asarray(adata.X.toarray())
    assert Dataset(dense, covariate_key="cell_line").resident_csr() is None
    counts = adata.copy()
    counts.X = sp.csr_matrix(np.round(np.expm1(adata.X.toarray())))
    assert Dataset(counts, covariate_key="cell_line", normalize=True).resident_csr() is None
    some = Dataset(adata, covariate_key="cell_line", subset={"cell_line": "cell_line_0"})
    assert some.resident_csr() is None
    assert sp.issparse(Dataset(adata, covariate_key="cell_line").resident_csr())


def test_dataset_mean_rows_are_the_vectorised_leave_one_out_means(adata):
    engine = make_engine(adata)
    layout = engine.context.layout
    centroids = engine.context.centroids("all")
    covariates = layout.condition_covariate
    totals = np.zeros((len(layout.covariates), centroids.shape[1]))
    np.add.at(totals, covariates, centroids)
    counts = np.bincount(covariates).astype(np.float64)[covariates] - 1.0
    expected = (totals[covariates] - centroids) / counts[:, None]
    for k in range(layout.n_conditions):
        np.testing.assert_array_equal(engine.dataset_mean(k), expected[k])
    # The same as the plain mean of the other centroids, to rounding.
    others = [j for j in range(layout.n_conditions) if covariates[j] == covariates[0] and j]
    np.testing.assert_allclose(engine.dataset_mean(0), centroids[others].mean(axis=0), rtol=1e-12)


def test_row_selections_are_read_in_place_by_the_welch_kernel(adata):
    stats = make_engine(adata).context.group_stats
    every_other = stats.select(slice(0, 12, 2))
    _, mean, m2 = every_other.contiguous_arrays(strided_rows=True)
    assert np.shares_memory(mean, stats.mean) and np.shares_memory(m2, stats.m2)
    copied = GroupStats(
        n=every_other.n.copy(), mean=every_other.mean.copy(), m2=every_other.m2.copy()
    )
    reference = stats.select(slice(1, 13, 2))
    for overestimate in (False, True):
        found = welch_between(every_other, reference, overestimate)
        expected = welch_between(copied, reference, overestimate)
        np.testing.assert_array_equal(found[0], expected[0])
        np.testing.assert_array_equal(found[1], expected[1])


def test_population_values_from_rows_read_in_place_equal_those_of_copied_rows(adata, monkeypatch):
    protocols = "energy_pca,mmd_top_k,sinkhorn_pca"
    options = {"covariate_key": "cell_line", "seed": 3, "progress": False}
    in_place = scperteval.calibrate(adata, protocols=protocols, **options).results
    monkeypatch.setattr(Dataset, "resident_csr", lambda self: None)
    copied = scperteval.calibrate(adata, protocols=protocols, **options).results
    assert len(in_place) > 0 and np.isfinite(in_place["value"]).any()
    np.testing.assert_array_equal(in_place["value"].to_numpy(), copied["value"].to_numpy())
