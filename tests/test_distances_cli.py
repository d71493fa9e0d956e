"""``scperteval distances``: tables and figures, on generated data and the real Norman subset."""

from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from sklearn.decomposition import PCA
from sklearn.metrics import pairwise_distances

from scperteval.cli import main
from scperteval.distances import bootstrap, pairwise, permutation_test

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from scperteval.simulation import simulate

    adata = simulate(
        n_perturbations=5, n_genes=40, cells_per_perturbation=20, n_covariates=2, seed=2
    )
    path = tmp_path_factory.mktemp("distances_cli") / "small.h5ad"
    adata.write_h5ad(path)
    return path, adata


def test_pairwise_table_and_heatmap(small, tmp_path, capsys) -> None:
    path, adata = small
    out = tmp_path / "out"
    code = main(
        ["distances", str(path), "--groupby", "perturbation", "--space", "pca(k=5)"]
        + ["--metric", "mmd(kernel='linear')", "--out", str(out)]
    )
    assert code == 0
    assert "pairwise mmd" in capsys.readouterr().out
    table = pd.read_csv(out / "distances.csv", index_col=0)
    expected = pairwise(adata, "perturbation", "mmd(kernel='linear')", space="pca(k=5)")
    np.testing.assert_allclose(table.to_numpy(), expected.to_numpy(), rtol=1e-12)
    assert list(table.index) == [str(c) for c in expected.columns]
    assert (out / "heatmap.png").read_bytes().startswith(PNG_MAGIC)
    assert json.loads((out / "run.json").read_text())["command"] == "distances"


def test_permutation_table_in_parquet_per_covariate(small, tmp_path) -> None:
    path, adata = small
    out = tmp_path / "out"
    arguments = ["distances", str(path), "--groupby", "perturbation", "--reference", "control"]
    arguments += ["--covariate-key", "cell_line", "--space", "pca(k=4)", "--permutations", "30"]
    arguments += ["--seed", "5", "--format", "parquet", "--no-figure", "--out", str(out)]
    arguments += ["--bootstrap", "12", "--confidence", "0.8"]
    assert main(arguments) == 0
    table = pd.read_parquet(out / "distances.parquet")
    expected = permutation_test(
        adata,
        "perturbation",
        "control",
        n_permutations=30,
        seed=5,
        covariate_key="cell_line",
        space="pca(k=4)",
    ).reset_index()
    intervals = bootstrap(
        adata,
        "perturbation",
        "control",
        n_bootstrap=12,
        seed=5,
        confidence=0.8,
        covariate_key="cell_line",
        space="pca(k=4)",
    )
    pd.testing.assert_frame_equal(table[expected.columns], expected, check_dtype=False)
    np.testing.assert_allclose(table["bootstrap_low"], intervals["low"].to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(table["bootstrap_high"], intervals["high"].to_numpy(), rtol=1e-12)
    assert not (out / "distances.png").exists()


def test_norman_subset_against_sklearn(devel_path, devel_adata, tmp_path) -> None:
    out = tmp_path / "norman"
    arguments = ["distances", str(devel_path), "--groupby", "condition"]
    arguments += ["--subset", "dataset=norman19", "--reference", "control"]
    arguments += ["--metric", "energy_distance", "--out", str(out)]
    assert main(arguments) == 0
    table = pd.read_csv(out / "distances.csv").set_index("condition")["energy_distance to control"]
    norman = devel_adata[devel_adata.obs["dataset"] == "norman19"]
    assert len(table) == norman.obs["condition"].nunique()
    assert table.loc["control"] == 0.0
    # The default space is the first 50 principal components of the subset's cells;
    # scikit-learn's full SVD spans the same axes (signs do not change distances).
    dense = np.asarray(norman.X.toarray() if hasattr(norman.X, "toarray") else norman.X)
    embedded = PCA(n_components=50, svd_solver="full").fit_transform(dense)
    labels = norman.obs["condition"].astype(str).to_numpy()
    control = embedded[labels == "control"]
    for group in ("KLF1", "SGK1+TBX3", "MAP2K6"):
        cells = embedded[labels == group]
        n, m = len(cells), len(control)
        expected = (
            2 * pairwise_distances(cells, control).mean()
            - pairwise_distances(cells).sum() / (n * (n - 1))
            - pairwise_distances(control).sum() / (m * (m - 1))
        )
        assert table.loc[group] == pytest.approx(expected, rel=1e-6), group
    assert (out / "distances.png").read_bytes().startswith(PNG_MAGIC)


def test_norman_pairwise_is_symmetric_with_zero_diagonal(devel_adata) -> None:
    norman = devel_adata[devel_adata.obs["dataset"] == "norman19"].copy()
    groups = ["control", "KLF1", "CBL+CNN1", "MAP4K3"]
    table = pairwise(norman, "condition", "edistance", groups=groups, space="pca(k=20)")
    values = table.to_numpy()
    np.testing.assert_array_equal(values, values.T)
    np.testing.assert_array_equal(np.diag(values), 0.0)
    # A strong combination is farther from the controls than a weak single.
    assert table.loc["CBL+CNN1", "control"] > table.loc["MAP4K3", "control"]
    assert isinstance(norman, ad.AnnData)
