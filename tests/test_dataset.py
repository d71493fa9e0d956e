"""Dataset validation messages, reading options, normalisation and backed streaming."""

from __future__ import annotations

import re

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from scperteval.context import Context
from scperteval.data.dataset import Condition, Dataset, normalize_log1p
from scperteval.errors import DatasetError, ScpertevalError

PERT = "perturbation"
COV = "cell_line"


def stacked(dataset: Dataset, chunk_cells: int | None = None) -> np.ndarray:
    blocks = [block for _, block in dataset.iter_chunks(chunk_cells)]
    return np.vstack([b.toarray() if sp.issparse(b) else np.asarray(b) for b in blocks])


def dense(matrix) -> np.ndarray:
    return np.asarray(matrix.toarray() if sp.issparse(matrix) else matrix, dtype=np.float64)


def toy(values, labels, covariates=None, genes=None) -> ad.AnnData:
    values = np.asarray(values, dtype=np.float64)
    obs = pd.DataFrame({PERT: labels}, index=[f"cell{i}" for i in range(len(labels))])
    if covariates is not None:
        obs[COV] = covariates
    genes = genes or [f"g{j}" for j in range(values.shape[1])]
    return ad.AnnData(X=values, obs=obs, var=pd.DataFrame(index=genes))


@pytest.fixture
def sim_path(sim_adata, tmp_path):
    path = tmp_path / "generated.h5ad"
    sim_adata.write_h5ad(path)
    return path


# -------------------------------------------------------------- bad inputs
def raises(match: str):
    return pytest.raises(DatasetError, match=match)


def test_missing_perturbation_column(sim_path):
    message = (
        f"{re.escape(str(sim_path))}: perturbation column 'guide' not found in obs; "
        "available columns: 'perturbation', 'cell_line', 'target_gene'"
    )
    with raises(message):
        Dataset(sim_path, perturbation_key="guide")


def test_missing_covariate_column(sim_adata):
    with raises(
        "^AnnData: covariate column 'cell_type' not found in obs; available columns: "
        "'perturbation', 'cell_line', 'target_gene'$"
    ):
        Dataset(sim_adata, covariate_key="cell_type")


def test_control_label_absent(sim_path):
    with raises(
        f"{re.escape(str(sim_path))}: control label 'ctrl' not found in column 'perturbation'; "
        r"labels that look like controls: 'control' \(--control-label\); "
        r"other labels: 'G1', 'G1\+G9', 'G10', "
    ):
        Dataset(sim_path, control_label="ctrl")


def test_control_absent_in_one_covariate_group(sim_adata):
    obs = sim_adata.obs
    drop = (obs[PERT] == "control").to_numpy() & (obs[COV] == "cell_line_1").to_numpy()
    adata = sim_adata[~drop].copy()
    with raises(
        "^AnnData: control label 'control' absent from covariate group 'cell_line_1' of column "
        "'cell_line'; every group needs control cells$"
    ):
        Dataset(adata, covariate_key=COV)
    # Without the covariate the same cells are fine.
    assert Dataset(adata).n_cells == adata.n_obs


def test_no_perturbation_left_after_min_cells(sim_adata):
    with raises(
        r"^AnnData: no perturbation in column 'perturbation' has at least min_cells=61 cells; "
        r"counts: G1 \(60\), G1\+G9 \(60\)"
    ):
        Dataset(sim_adata, min_cells=61)
    with raises("min_cells must be at least 2, got 1"):
        Dataset(sim_adata, min_cells=1)
    only_controls = sim_adata[(sim_adata.obs[PERT] == "control").to_numpy()].copy()
    with raises(r"counts: \(no perturbed cells\)"):
        Dataset(only_controls)


def test_perturbations_below_min_cells_are_left_out(sim_adata):
    dataset = Dataset(sim_adata, covariate_key=COV, min_cells=4)
    assert dataset.dropped == []
    obs = sim_adata.obs
    few = np.flatnonzero((obs[PERT] == "G10").to_numpy() & (obs[COV] == "cell_line_0").to_numpy())
    adata = sim_adata[np.setdiff1d(np.arange(sim_adata.n_obs), few[3:])].copy()
    dataset = Dataset(adata, covariate_key=COV, min_cells=4)
    assert dataset.dropped == [(Condition("cell_line_0", "G10"), 3)]
    assert "G10" not in dataset.perturbations("cell_line_0")
    assert "G10" in dataset.perturbations("cell_line_1")
    assert dataset.describe().endswith("1 left out (< 4 cells)")


@pytest.mark.parametrize(
    ("bad", "shown"), [(np.nan, "'nan'"), (np.inf, "'inf'"), (-np.inf, "'-inf'")]
)
@pytest.mark.parametrize("sparse", [True, False])
def test_non_finite_values(sim_adata, bad, shown, sparse):
    x = dense(sim_adata.X)
    x[5, 7] = bad
    sim_adata.X = sp.csr_matrix(x) if sparse else x
    with raises(
        f"^AnnData: X contains 1 non-finite value\\(s\\) \\(e.g. {re.escape(shown)}\\); "
        "remove or impute them$"
    ):
        Dataset(sim_adata)


def test_non_finite_values_in_layer(sim_adata):
    x = dense(sim_adata.X)
    x[[1, 2], [0, 3]] = np.nan
    sim_adata.layers["lognorm"] = sp.csr_matrix(x)
    with raises(r"^AnnData: layer 'lognorm' contains 2 non-finite value\(s\) \(e.g. 'nan'\)"):
        Dataset(sim_adata, layer="lognorm")


@pytest.mark.parametrize("sparse", [True, False])
def test_negative_values(sim_adata, sparse):
    x = dense(sim_adata.X)
    x[3, 2] = -0.5
    sim_adata.X = sp.csr_matrix(x) if sparse else x
    with raises(
        r"^AnnData: X contains negative values \(minimum -0.5\); expected log-normalised "
        r"expression \(normalize_total \+ log1p\), not scaled or centred data$"
    ):
        Dataset(sim_adata)


def test_raw_counts_in_layer_rejected(sim_adata):
    with raises(
        r"^AnnData: layer 'counts' looks like raw counts \(integer values up to \d+\); pass "
        r"normalize=True \(CLI: --normalize\) to apply normalize_total\(1e4\) and log1p$"
    ):
        Dataset(sim_adata, layer="counts")
    # Small integers (e.g. binary data) are not mistaken for counts.
    adata = toy(np.tile([[0.0, 1.0], [1.0, 2.0]], (4, 1)), ["control", "A"] * 4)
    assert Dataset(adata, min_cells=2).n_cells == 8


def test_raw_counts_file_rejected_then_normalised(counts_path, counts_adata):
    with raises(
        f"^{re.escape(str(counts_path))}: X looks like raw counts \\(integer values up to 271\\); "
        "pass normalize=True"
    ):
        Dataset(counts_path, perturbation_key="perturbation")
    dataset = Dataset(
        counts_path, perturbation_key="perturbation", normalize=True, chunk_cells=1000
    )
    assert dataset.n_cells == 7500 and len(dataset.conditions) == 40

    import scanpy as sc

    expected = counts_adata
    expected.X = expected.X.astype(np.float64)
    sc.pp.normalize_total(expected, target_sum=1e4)
    sc.pp.log1p(expected)
    normalised = sp.vstack([block for _, block in dataset.iter_chunks()]).tocsr()
    normalised.sort_indices()
    scanpy_x = sp.csr_matrix(expected.X)
    scanpy_x.sort_indices()
    np.testing.assert_array_equal(normalised.indptr, scanpy_x.indptr)
    np.testing.assert_array_equal(normalised.indices, scanpy_x.indices)
    np.testing.assert_allclose(normalised.data, scanpy_x.data, rtol=1e-13, atol=0)
    rows = np.array([3, 10, 4000, 7499])
    np.testing.assert_allclose(dense(dataset.rows(rows)), expected.X[rows].toarray(), rtol=1e-13)

    # Statistics of the normalised data equal those of scanpy's output.
    context = Context(dataset)
    k = context.layout.index_of("all", dataset.conditions[0].perturbation)
    cells = dataset.perturbation_labels == dataset.conditions[0].perturbation
    values = expected.X[np.flatnonzero(cells)].toarray()
    np.testing.assert_allclose(context.centroids()[k], values.mean(axis=0), rtol=1e-12, atol=1e-15)


def test_normalize_log1p_dense_sparse_and_empty_rows():
    counts = np.array([[1.0, 3.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, 4.0]])
    expected = np.log1p(counts / np.maximum(counts.sum(axis=1, keepdims=True), 1) * 1e4)
    np.testing.assert_allclose(normalize_log1p(counts), expected, rtol=1e-15)
    np.testing.assert_allclose(normalize_log1p(sp.csr_matrix(counts)).toarray(), expected)
    assert normalize_log1p(sp.csr_matrix(counts)).nnz == 5


@pytest.mark.filterwarnings("ignore:Variable names are not unique")
def test_duplicate_gene_names():
    adata = toy(np.full((6, 3), 0.5), ["control", "A"] * 3, genes=["g0", "TP53", "TP53"])
    with raises(
        r"^AnnData: duplicate gene names in var_names: 'TP53' \(make them unique, "
        r"e.g. adata.var_names_make_unique\(\)\)$"
    ):
        Dataset(adata, min_cells=2)


def test_empty_dataset(sim_adata):
    with raises(r"^AnnData: empty dataset \(0 cells x 60 genes\)$"):
        Dataset(sim_adata[:0].copy())
    with raises(r"^AnnData: empty dataset \(600 cells x 0 genes\)$"):
        Dataset(sim_adata[:, :0].copy())


def test_unreadable_file(tmp_path):
    path = tmp_path / "garbage.h5ad"
    path.write_bytes(b"\x00not an hdf5 file\xff" * 64)
    with raises(f"^{re.escape(str(path))}: cannot read as .h5ad \\("):
        Dataset(path)


def test_missing_file(tmp_path):
    path = tmp_path / "absent.h5ad"
    with raises(f"^{re.escape(str(path))}: file not found$"):
        Dataset(str(path))


def test_not_a_dataset():
    with raises("expected an AnnData or a path to an .h5ad file, got int"):
        Dataset(42)


def test_missing_layer(sim_adata, sim_path):
    with raises("^AnnData: layer 'lognorm' not found; available layers: 'counts'$"):
        Dataset(sim_adata, layer="lognorm")
    del sim_adata.layers["counts"]
    with raises(r"available layers: \(none\)$"):
        Dataset(sim_adata, layer="lognorm")
    with raises(f"^{re.escape(str(sim_path))}: layer 'x' not found"):
        Dataset(sim_path, layer="x")


def test_errors_are_value_errors():
    assert issubclass(DatasetError, ValueError) and issubclass(DatasetError, ScpertevalError)


# --------------------------------------------------------------- reading
def test_layer_reading(sim_adata):
    lognorm = sim_adata.X.copy()
    swapped = sim_adata.copy()
    swapped.layers["lognorm"] = lognorm
    swapped.X = sim_adata.layers["counts"].copy()  # raw counts in X are not read
    from_layer = Dataset(swapped, layer="lognorm", covariate_key=COV)
    from_x = Dataset(sim_adata, covariate_key=COV)
    np.testing.assert_array_equal(stacked(from_layer), dense(lognorm))
    first, second = Context(from_layer), Context(from_x)
    np.testing.assert_array_equal(first.group_stats.mean, second.group_stats.mean)
    np.testing.assert_array_equal(first.de().statistic, second.de().statistic)
    # Counts layer with normalize=True equals scanpy-style normalisation of the counts.
    normalised = Dataset(sim_adata, layer="counts", normalize=True, chunk_cells=50)
    np.testing.assert_allclose(
        stacked(normalised), normalize_log1p(dense(sim_adata.layers["counts"])), rtol=1e-12
    )


def test_subset_option(devel_adata):
    subset = {"dataset": "norman19"}
    dataset = Dataset(
        devel_adata, perturbation_key="condition", covariate_key="cell_type", subset=subset
    )
    mask = (devel_adata.obs["dataset"] == "norman19").to_numpy()
    assert dataset.n_cells == mask.sum() == 3375
    assert dataset.covariates == ["k562"]
    np.testing.assert_array_equal(dataset.cell_index, np.flatnonzero(mask))
    np.testing.assert_array_equal(stacked(dataset, 1000), dense(devel_adata.X[mask]))
    copy = Dataset(
        devel_adata[mask].copy(), perturbation_key="condition", covariate_key="cell_type"
    )
    result, expected = Context(dataset).de(), Context(copy).de()
    assert result.conditions == expected.conditions
    np.testing.assert_allclose(result.statistic, expected.statistic, rtol=1e-12, atol=1e-12)
    # A list of accepted values, and one-line errors naming column and values.
    lines = Dataset(
        devel_adata,
        perturbation_key="condition",
        covariate_key="cell_type",
        subset={"cell_type": ["A172", "U87MG"]},
    )
    assert lines.covariates == ["A172", "U87MG"]
    with raises(
        "^AnnData: subset value\\(s\\) 'HeLa' not found in column 'cell_type'; available: "
        "'A172', 'T98G', 'U87MG', 'k562'$"
    ):
        Dataset(devel_adata, perturbation_key="condition", subset={"cell_type": "HeLa"})
    with raises("^AnnData: subset column 'batch' not found in obs; available columns: 'ncounts'"):
        Dataset(devel_adata, perturbation_key="condition", subset={"batch": "1"})


def test_combinations_recognised(sim_adata):
    assert Condition("k562", "A+B").components == ("A", "B")
    assert Condition("k562", "A+B").is_combination
    assert Condition("k562", "A").components == ("A",)
    assert not Condition("k562", "A").is_combination
    generated = Dataset(sim_adata, covariate_key=COV).combinations()
    assert sorted((c.covariate, c.components) for c in generated) == [
        ("cell_line_0", ("G1", "G9")),
        ("cell_line_0", ("G17", "G32")),
        ("cell_line_1", ("G1", "G9")),
        ("cell_line_1", ("G17", "G32")),
    ]


def test_combinations_in_real_data(devel_adata):
    dataset = Dataset(devel_adata, perturbation_key="condition", covariate_key="cell_type")
    labels = devel_adata.obs["condition"].astype(str)
    expected = sorted(set(labels[labels.str.contains("+", regex=False)]))
    found = dataset.combinations()
    assert sorted(c.perturbation for c in found) == expected and len(expected) >= 10
    assert all(c.covariate == "k562" for c in found)
    for condition in found:
        first, second = condition.perturbation.split("+")
        assert condition.components == (first, second)


def test_iter_chunks_and_rows(sim_adata):
    dataset = Dataset(sim_adata, covariate_key=COV, chunk_cells=77)
    chunks = list(dataset.iter_chunks())
    assert [p.start for p, _ in chunks] == list(range(0, 600, 77))
    assert all(sp.isspmatrix_csr(block) or sp.issparse(block) for _, block in chunks)
    np.testing.assert_array_equal(stacked(dataset), dense(sim_adata.X))
    rows = np.array([0, 5, 6, 599])
    np.testing.assert_array_equal(dense(dataset.rows(rows)), dense(sim_adata.X[rows]))
    assert dataset.n_genes == 60 and list(dataset.var_names[:2]) == ["G0", "G1"]
    assert dataset.describe() == (
        "AnnData: 600 cells x 60 genes, 16 perturbations in 2 covariate group(s)"
    )


# ----------------------------------------------------------------- backed
@pytest.mark.parametrize("sparse", [True, False])
def test_backed_equals_in_memory(sim_adata, tmp_path, sparse):
    if not sparse:
        sim_adata.X = dense(sim_adata.X)
    path = tmp_path / "backed.h5ad"
    sim_adata.write_h5ad(path)
    in_memory = Context(Dataset(sim_adata, covariate_key=COV), seed=4)
    backed_dataset = Dataset(path, covariate_key=COV, backed=True, chunk_cells=37)
    assert backed_dataset.is_backed
    backed = Context(backed_dataset, seed=4)
    np.testing.assert_array_equal(backed.group_stats.n, in_memory.group_stats.n)
    np.testing.assert_allclose(
        backed.group_stats.mean, in_memory.group_stats.mean, rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        backed.group_stats.variance(), in_memory.group_stats.variance(), rtol=1e-10, atol=1e-14
    )
    for method, reference in [
        ("t-test", "rest"),
        ("t-test_overestim_var", "control"),
        ("wilcoxon", "control"),
    ]:
        first = backed.de(method=method, reference=reference)
        second = in_memory.de(method=method, reference=reference)
        np.testing.assert_allclose(first.statistic, second.statistic, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(first.pvalue, second.pvalue, rtol=1e-9, atol=1e-12)

    # Backed with a subset reads non-contiguous rows.
    keep = ["control", "G9", "G1+G9"]
    subset_backed = Context(
        Dataset(path, covariate_key=COV, backed=True, chunk_cells=50, subset={PERT: keep})
    )
    mask = sim_adata.obs[PERT].isin(keep).to_numpy()
    subset_memory = Context(Dataset(sim_adata[mask].copy(), covariate_key=COV))
    np.testing.assert_allclose(
        subset_backed.de().statistic, subset_memory.de().statistic, rtol=1e-9, atol=1e-12
    )


def test_load_dataset_takes_the_reading_options_once(sim_adata):
    from scperteval.data.load import DATASET_OPTIONS, load_dataset

    dataset = load_dataset(sim_adata, perturbation_key="perturbation", min_cells=3, pool=True)
    assert dataset.min_cells == 3
    # The options are those of Dataset itself, in its order, then whether to pool screens.
    import inspect

    assert DATASET_OPTIONS == (*tuple(inspect.signature(Dataset).parameters)[1:], "pool")
    assert load_dataset(dataset, pool=True) is dataset
    assert load_dataset(dataset, min_cells=3, pool=True) is dataset


def test_load_dataset_refuses_unknown_and_conflicting_options(sim_adata):
    from scperteval.data.load import load_dataset
    from scperteval.errors import SpecError

    with pytest.raises(TypeError, match="option 'perturbaton_key'.*'perturbation_key'"):
        load_dataset(sim_adata, perturbaton_key="perturbation")  # type: ignore[call-arg]
    dataset = Dataset(sim_adata)
    with pytest.raises(SpecError, match="min_cells=10 differs from the open Dataset's 4"):
        load_dataset(dataset, min_cells=10)


def test_entry_points_reject_a_misspelt_dataset_option(sim_adata):
    import scperteval

    with pytest.raises(TypeError, match="did you mean 'covariate_key'"):
        scperteval.calibrate(sim_adata, "mse", covariate_kye="cell_line")  # type: ignore[call-arg]


def test_missing_perturbation_column_names_the_column_with_the_control_label(sim_adata):
    sim_adata.obs = sim_adata.obs.rename(columns={"perturbation": "guide_target"})
    with raises(r"column 'guide_target' holds the control label 'control'"):
        Dataset(sim_adata, perturbation_key="condition")
    sim_adata.obs["guide_target"] = (
        sim_adata.obs["guide_target"].astype(str).replace({"control": "non-targeting"})
    )
    with raises(r"column 'guide_target' holds labels that look like controls: 'non-targeting'"):
        Dataset(sim_adata, perturbation_key="condition")
