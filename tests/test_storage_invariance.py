"""The same numbers stored differently give the same results, bit for bit.

Dense or sparse (CSR, CSC), with stored zeros or unsorted row indices, float32
values held as float32 or float64, in memory or read from a backed ``.h5ad``:
every protocol of the default suite gives the same bits, and statistics equal in
exact arithmetic (a Welch ``|t|`` of exactly 1) rank as ties, in gene order.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from scperteval.data.dataset import normalize_log1p
from scperteval.engine import _pca
from scperteval.engine.spaces import top_indices
from scperteval.simulation import simulate
from scperteval.stats.diffexp import welch_statistic_between
from scperteval.stats.groups import GroupStats
from scperteval.stats.ranking import ranking_keys
from scperteval.workflows.calibrate import calibrate

SAMPLE = 120  # below the perturbed cells: the population sample is a scattered subset


def _with_stored_zeros(matrix: np.ndarray, seed: int) -> sp.csr_matrix:
    """CSR of ``matrix`` that also stores a zero at about a fifth of its zero entries."""
    rng = np.random.default_rng(seed)
    stored = (matrix != 0) | (rng.random(matrix.shape) < 0.2)
    rows, columns = np.nonzero(stored)
    csr = sp.csr_matrix((matrix[rows, columns], (rows, columns)), shape=matrix.shape)
    assert csr.nnz > np.count_nonzero(matrix)
    return csr


def _with_unsorted_rows(matrix: np.ndarray) -> sp.csr_matrix:
    """CSR of ``matrix`` with every row's columns stored in reverse order."""
    csr = sp.csr_matrix(matrix)
    indices = csr.indices.copy()
    data = csr.data.copy()
    for row in range(csr.shape[0]):
        span = slice(csr.indptr[row], csr.indptr[row + 1])
        indices[span] = indices[span][::-1]
        data[span] = data[span][::-1]
    unsorted = sp.csr_matrix((data, indices, csr.indptr.copy()), shape=csr.shape)
    unsorted.has_sorted_indices = False
    assert np.any(np.diff(unsorted.indices[unsorted.indptr[0] : unsorted.indptr[1]]) < 0)
    return unsorted


def _storages(values: np.ndarray) -> dict[str, object]:
    """The float32 ``values`` in every storage checked."""
    assert values.dtype == np.float32
    return {
        "csr": sp.csr_matrix(values),
        "dense": values.copy(),
        "dense_fortran": np.asfortranarray(values),
        "csc": sp.csc_matrix(values),
        "csr_stored_zeros": _with_stored_zeros(values, 1),
        "csr_unsorted": _with_unsorted_rows(values),
        "csr_float64": sp.csr_matrix(values.astype(np.float64)),
        "dense_float64": values.astype(np.float64),
    }


def _results(data, suite: str = "default", **options) -> tuple[pd.DataFrame, pd.DataFrame]:
    result = calibrate(data, suite, sample_cells=SAMPLE, seed=3, **options)
    order = ["covariate", "perturbation", "protocol", "source"]
    results = result.results.sort_values(order).reset_index(drop=True)
    return results, result.calibration.reset_index(drop=True)


def _assert_same_bits(reference: pd.DataFrame, other: pd.DataFrame, where: str) -> None:
    assert list(reference.columns) == list(other.columns), where
    assert len(reference) == len(other), where
    for column in reference.columns:
        left, right = reference[column].to_numpy(), other[column].to_numpy()
        if left.dtype.kind == "f":
            same = np.array_equal(left, right, equal_nan=True)
            if not same:
                differ = ~((left == right) | (np.isnan(left) & np.isnan(right)))
                rows = reference.loc[differ, [c for c in ("protocol", "perturbation")]]
                raise AssertionError(
                    f"{where}: column {column!r} differs in {int(differ.sum())} rows, "
                    f"e.g. {rows.head(3).to_dict('records')}"
                )
        else:
            assert pd.Series(left).equals(pd.Series(right)), f"{where}: column {column!r}"


def _log_expression(seed: int) -> ad.AnnData:
    adata = simulate(n_perturbations=6, n_genes=60, cells_per_perturbation=30, seed=seed)
    counts = np.asarray(adata.X.toarray() if sp.issparse(adata.X) else adata.X, dtype=np.float64)
    totals = np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    adata.X = np.log1p(counts / totals * 1e4).astype(np.float32)
    return adata


def _tied_screen() -> ad.AnnData:
    """Genes detected in exactly one cell of the whole screen.

    The truth DE of a perturbation compares its cells with the other perturbed
    cells. For a gene detected in one cell of either side only, the Welch ``|t|``
    is exactly 1 in exact arithmetic (``mean = x / n``, ``var / n = x**2 / n**2``)
    whatever the detected value ``x``; computed, it lands on 1 give or take an ulp,
    differently for each value and storage. Two hundred such genes next to a few
    clearly changed ones put every perturbation's top-50 boundary among the ties.
    """
    rng = np.random.default_rng(7)
    n_control, n_cells, n_perturbations = 80, 40, 4
    n_expressed, n_single = 20, 200
    n_genes = n_expressed + n_single
    labels = ["control"] * n_control
    blocks = [rng.lognormal(0.5, 0.3, (n_control, n_genes))]
    for p in range(n_perturbations):
        labels += [f"P{p}"] * n_cells
        block = rng.lognormal(0.5, 0.3, (n_cells, n_genes))
        block[:, p * 3 : p * 3 + 5] += 2.0  # changed genes, |t| well above 1
        blocks.append(block)
    values = np.vstack(blocks)
    values[:, n_expressed:] = 0.0
    perturbed = np.arange(n_control, values.shape[0])
    for gene in range(n_expressed, n_genes):
        values[rng.choice(perturbed), gene] = rng.uniform(0.2, 5.0)
    obs = pd.DataFrame({"perturbation": labels}, index=[f"c{i}" for i in range(len(labels))])
    var = pd.DataFrame(index=[f"g{j}" for j in range(n_genes)])
    return ad.AnnData(X=np.log1p(values).astype(np.float32), obs=obs, var=var)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    adata = _log_expression(seed=4)
    path = tmp_path_factory.mktemp("storage") / "screen.h5ad"
    written = adata.copy()
    written.X = sp.csr_matrix(adata.X)
    written.write_h5ad(path)
    return adata, path


@pytest.fixture(scope="module")
def reference(simulated):
    adata, _ = simulated
    stored = adata.copy()
    stored.X = sp.csr_matrix(adata.X)
    return _results(stored)


@pytest.mark.parametrize(
    "storage",
    ["dense", "dense_fortran", "csc", "csr_stored_zeros", "csr_unsorted", "csr_float64"],
)
def test_default_suite_is_the_same_bits_in_every_storage(simulated, reference, storage):
    adata, _ = simulated
    stored = adata.copy()
    stored.X = _storages(np.asarray(adata.X))[storage]
    results, calibration = _results(stored)
    _assert_same_bits(reference[0], results, storage)
    _assert_same_bits(reference[1], calibration, f"{storage} calibration")


def test_cell_eval_suite_is_the_same_bits_dense_and_csr(simulated):
    adata, _ = simulated
    runs = {}
    for storage in ("csr", "dense"):
        stored = adata.copy()
        stored.X = _storages(np.asarray(adata.X))[storage]
        runs[storage] = _results(stored, "cell_eval")
    assert {"overlap_at_N", "roc_auc"} <= set(runs["csr"][0]["protocol"])
    _assert_same_bits(runs["csr"][0], runs["dense"][0], "cell_eval dense")
    _assert_same_bits(runs["csr"][1], runs["dense"][1], "cell_eval dense calibration")


@pytest.mark.parametrize("backed", [True, False])
def test_default_suite_from_an_h5ad_file_is_the_same_bits(simulated, reference, backed):
    _, path = simulated
    results, calibration = _results(str(path), backed=backed)
    _assert_same_bits(reference[0], results, f"h5ad backed={backed}")
    _assert_same_bits(reference[1], calibration, f"h5ad backed={backed} calibration")


def test_exact_ties_rank_in_gene_order_in_every_storage():
    adata = _tied_screen()
    values = np.asarray(adata.X)
    runs = {}
    for storage, matrix in _storages(values).items():
        stored = adata.copy()
        stored.X = matrix
        runs[storage] = _results(stored)
    reference = runs.pop("csr")
    assert reference[0]["protocol"].eq("mse_top_k").any()
    for storage, (results, calibration) in runs.items():
        _assert_same_bits(reference[0], results, storage)
        _assert_same_bits(reference[1], calibration, f"{storage} calibration")


def test_a_welch_t_of_exactly_one_ties_and_goes_in_gene_order():
    adata = _tied_screen()
    labels = adata.obs["perturbation"].to_numpy()
    codes = np.where(labels == "P0", 0, 1)
    codes[labels == "control"] = -1  # P0 against the other perturbed cells
    for storage, matrix in _storages(np.asarray(adata.X)).items():
        stats = GroupStats.from_chunk(matrix, codes, 2)
        statistic = np.abs(welch_statistic_between(stats.select([0]), stats.select([1]))[0])
        detected = np.asarray((adata.X != 0).sum(axis=0)).ravel() == 1
        single = np.flatnonzero(detected & np.isfinite(statistic))
        assert single.size > 100
        # Computed, |t| is off 1 by rounding; ranked, every one of them is exactly 1.
        np.testing.assert_allclose(statistic[single], 1.0, rtol=1e-14)
        assert np.all(ranking_keys(statistic[single]) == 1.0), storage
        above = np.flatnonzero(ranking_keys(statistic) > 1.0)
        assert 0 < above.size < 50
        expected = np.sort(np.concatenate([above, single[: 50 - above.size]]))
        assert top_indices(statistic, 50).tolist() == expected.tolist(), storage


def test_group_moments_depend_on_the_numbers_only():
    values = np.asarray(_tied_screen().X[:200])
    codes = np.repeat(np.arange(5), 40)
    codes[::7] = -1  # rows of no group are skipped
    stats = {
        name: GroupStats.from_chunk(matrix, codes, 5) for name, matrix in _storages(values).items()
    }
    reference = stats.pop("csr")
    for name, other in stats.items():
        assert np.array_equal(reference.mean, other.mean), name
        assert np.array_equal(reference.m2, other.m2), name
    # The values themselves: a textbook two-pass computation, to rounding.
    kept = values[codes >= 0].astype(np.float64)
    groups = codes[codes >= 0]
    for group in range(5):
        rows = kept[groups == group]
        np.testing.assert_allclose(reference.mean[group], rows.mean(axis=0), rtol=1e-13)
        np.testing.assert_allclose(
            reference.m2[group], ((rows - rows.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-12
        )


def test_principal_axes_depend_on_the_numbers_only(monkeypatch):
    # The Gram routes are taken from this many genes or cells on: both are checked.
    monkeypatch.setattr(_pca, "SMALL_SIDE", 20)
    values = np.asarray(_log_expression(seed=9).X)
    # Fewer genes than cells (the genes' Gram matrix), then more (the cells').
    for sample in (np.ascontiguousarray(values[:150, :40]), np.ascontiguousarray(values[:30])):
        axes = {name: _pca.principal_axes(matrix, 5) for name, matrix in _storages(sample).items()}
        components, offset = axes.pop("csr")
        for name, (other_components, other_offset) in axes.items():
            assert np.array_equal(components, other_components), (sample.shape, name)
            assert np.array_equal(offset, other_offset), (sample.shape, name)
        np.testing.assert_allclose(offset, np.asarray(sample, dtype=np.float64).mean(axis=0))


def test_ranking_keys_tie_scores_equal_in_exact_arithmetic():
    # |t| = 1 rounded three ways, then a value 1e-9 below: ties, then a real difference.
    scores = np.array([0.5, 1.0000000000000002, 0.9999999999999999, 1.0, 1.0 - 1e-9, 2.0])
    assert np.array_equal(np.unique(ranking_keys(scores[1:4])), [1.0])
    assert ranking_keys(scores)[4] < 1.0
    # Ties go in gene order: the first two of the three ones, whatever their last bits.
    assert top_indices(scores, 3).tolist() == [1, 2, 5]
    reordered = scores.copy()
    reordered[[1, 2, 3]] = [1.0, 1.0, 0.9999999999999999]
    assert top_indices(reordered, 3).tolist() == [1, 2, 5]
    assert np.array_equal(
        ranking_keys(np.array([np.nan, np.inf, -np.inf, -0.0])),
        np.array([np.nan, np.inf, -np.inf, 0.0]),
        equal_nan=True,
    )


def test_normalisation_depends_on_the_numbers_only():
    adata = simulate(n_perturbations=3, n_genes=300, cells_per_perturbation=20, seed=2)
    counts = np.asarray(adata.X.toarray() if sp.issparse(adata.X) else adata.X, dtype=np.float32)
    # float32 values over a wide range of magnitudes: float64 sums of them round,
    # so the order of a row's sum shows in its last bits.
    rng = np.random.default_rng(5)
    scales = np.exp2(rng.integers(-24, 24, counts.shape)) * rng.uniform(1, 2, counts.shape)
    values = (counts * scales).astype(np.float32)
    normalised = {}
    for name, matrix in _storages(values).items():
        block = normalize_log1p(matrix)
        normalised[name] = block.toarray() if sp.issparse(block) else np.asarray(block)
    reference = normalised.pop("csr")
    for name, other in normalised.items():
        assert np.array_equal(reference, other), name
    totals = values.astype(np.float64).sum(axis=1, keepdims=True)
    expected = np.log1p(values / np.where(totals > 0, totals, 1.0) * 1e4)
    np.testing.assert_allclose(reference, expected, rtol=1e-12)
