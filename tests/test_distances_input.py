"""The distances read the same cells from an AnnData, an ``.h5ad`` path and a Dataset."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from scperteval.data.dataset import Dataset
from scperteval.distances import bootstrap, onesided, pairwise, permutation_test
from scperteval.errors import DatasetError, SpecError
from scperteval.simulation import simulate


@pytest.fixture(scope="module")
def screen(tmp_path_factory):
    adata = simulate(
        n_perturbations=4, n_genes=30, cells_per_perturbation=15, n_covariates=2, seed=8
    )
    adata.obsm["X_pca"] = np.random.default_rng(3).normal(size=(adata.n_obs, 4))
    path = tmp_path_factory.mktemp("distances_input") / "screen.h5ad"
    adata.write_h5ad(path)
    return ad.read_h5ad(path), path


def _forms(screen, **dataset_options):
    """The same data as an AnnData, a path read into memory, a path left on disk, a Dataset."""
    adata, path = screen
    return {
        "AnnData": adata,
        "path": str(path),
        "path left on disk": ("backed", str(path)),
        "Dataset": Dataset(path, **dataset_options),
    }


def _call(function, data, *args, **options):
    if isinstance(data, tuple):
        return function(data[1], *args, backed=True, **options)
    return function(data, *args, **options)


@pytest.mark.parametrize(
    "space", [{"space": "pca(k=5)"}, {"space": "hvg(k=10)"}, {}, {"obsm_key": "X_pca"}]
)
def test_pairwise_is_the_same_from_every_form(screen, space):
    forms = _forms(screen, covariate_key="cell_line")
    expected = pairwise(screen[0], "perturbation", "edistance", covariate_key="cell_line", **space)
    for name, data in forms.items():
        options = {} if name == "Dataset" else {"covariate_key": "cell_line"}
        found = _call(pairwise, data, "perturbation", "edistance", **options, **space)
        pd.testing.assert_frame_equal(found, expected, check_exact=True, obj=name)


def test_the_tests_and_intervals_are_the_same_from_a_dataset(screen):
    adata, path = screen
    dataset = Dataset(path, subset={"cell_line": "cell_line_1"})
    options = {"space": "pca(k=5)", "seed": 2}
    pd.testing.assert_series_equal(
        onesided(dataset, "perturbation", "control", "mmd", space="pca(k=5)"),
        onesided(
            adata,
            "perturbation",
            "control",
            "mmd",
            space="pca(k=5)",
            subset={"cell_line": "cell_line_1"},
        ),
        check_exact=True,
    )
    for function, count in ((permutation_test, "n_permutations"), (bootstrap, "n_bootstrap")):
        found = function(dataset, "perturbation", "control", **options, **{count: 20})
        expected = function(
            str(path),
            "perturbation",
            "control",
            subset={"cell_line": "cell_line_1"},
            **options,
            **{count: 20},
        )
        pd.testing.assert_frame_equal(found, expected, check_exact=True)


def test_normalised_counts_are_the_log1p_of_counts_per_ten_thousand(screen):
    adata, path = screen
    counts = adata.layers["counts"].toarray().astype(np.float64)
    by_hand = np.log1p(counts / counts.sum(axis=1, keepdims=True) * 1e4)
    normalised = ad.AnnData(X=sp.csr_matrix(by_hand), obs=adata.obs)
    expected = pairwise(normalised, "perturbation", "euclidean", space="full")
    from_path = pairwise(path, "perturbation", "euclidean", layer="counts", normalize=True)
    pd.testing.assert_frame_equal(from_path, expected, check_exact=False, rtol=1e-12)
    dataset = Dataset(path, layer="counts", normalize=True)
    from_dataset = pairwise(dataset, "perturbation", "euclidean")
    pd.testing.assert_frame_equal(from_dataset, from_path, check_exact=True)
    # Normalised values by default are fitted a PCA, not the stored embedding.
    default = pairwise(path, "perturbation", layer="counts", normalize=True, space="pca(k=50)")
    pd.testing.assert_frame_equal(
        pairwise(dataset, "perturbation", space="pca(k=50)"), default, check_exact=True
    )


def test_options_that_contradict_the_dataset_or_the_data_are_refused(screen):
    adata, path = screen
    dataset = Dataset(path, covariate_key="cell_line")
    with pytest.raises(SpecError, match="layer=.counts. differs from the Dataset"):
        pairwise(dataset, "perturbation", layer="counts")
    with pytest.raises(SpecError, match="differs from the Dataset"):
        onesided(dataset, "perturbation", "control", covariate_key="target_gene")
    with pytest.raises(SpecError, match="not to an obsm embedding"):
        pairwise(adata, "perturbation", obsm_key="X_pca", normalize=True)
    with pytest.raises(DatasetError, match="expected an AnnData or a path"):
        pairwise(adata.X, "perturbation")
    with pytest.raises(DatasetError, match="file not found"):
        pairwise(path.parent / "absent.h5ad", "perturbation")
