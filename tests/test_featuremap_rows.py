"""Cells mapped to a space straight from the rows of a CSR matrix in memory."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scperteval.engine.featuremap import FeatureMap


def random_csr(dtype, seed=0, shape=(60, 40), density=0.3):
    rng = np.random.default_rng(seed)
    matrix = sp.random(*shape, density=density, format="csr", random_state=rng, dtype=np.float64)
    matrix.data = (matrix.data * 7.0).astype(dtype)
    return matrix


def projection(seed=1, n_genes=40, width=5, offset=True):
    rng = np.random.default_rng(seed)
    components = np.asfortranarray(rng.standard_normal((n_genes, width)))
    return FeatureMap(
        label="pca",
        names=np.array([f"PC{i + 1}" for i in range(width)]),
        components=components,
        offset=rng.standard_normal(n_genes) if offset else None,
    )


def selection(genes):
    genes = np.asarray(genes)
    return FeatureMap(label="genes", names=genes.astype(str), genes=genes)


ROWS = [np.arange(60), np.array([3, 7, 7, 59, 0]), np.array([], dtype=np.int64)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("offset", [True, False])
def test_projection_of_rows_is_scipys_product_bit_for_bit(dtype, rows, offset):
    matrix = random_csr(dtype)
    space = projection(offset=offset)
    expected = space.matrix(matrix[rows])
    np.testing.assert_array_equal(space.matrix_of_rows(matrix, rows), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("genes", [[0, 5, 39], [39, 2, 17, 3], [4], [7, 7, 9]])
def test_selection_of_rows_is_scipys_selection(dtype, rows, genes):
    matrix = random_csr(dtype, seed=2)
    space = selection(genes)
    got = space.matrix_of_rows(matrix, rows)
    np.testing.assert_array_equal(got, space.matrix(matrix[rows]))
    assert got.dtype == np.float64


def test_repeated_and_unsorted_columns_are_summed_as_scipy_does():
    # Row 0 stores column 2 twice; row 1 is unsorted; float32 sums round in float32.
    data = np.array([0.1, 0.2, 1e-8, 3.0, 1.0], dtype=np.float32)
    indices = np.array([2, 2, 5, 4, 1], dtype=np.int32)
    indptr = np.array([0, 3, 5])
    matrix = sp.csr_matrix((data, indices, indptr), shape=(2, 6))
    for space in (selection([1, 2, 4]), projection(n_genes=6, width=3)):
        np.testing.assert_array_equal(
            space.matrix_of_rows(matrix, np.array([0, 1])), space.matrix(matrix)
        )


def test_selection_of_columns_past_the_last_selected_gene():
    matrix = random_csr(np.float32, seed=3, shape=(10, 500), density=0.5)
    space = selection([0, 1])
    rows = np.arange(10)
    np.testing.assert_array_equal(space.matrix_of_rows(matrix, rows), space.matrix(matrix))


@pytest.mark.parametrize(
    "names",
    [
        np.array(["GENE1", "GENE2", "MT-CO1"], dtype=object),
        np.array(["GENE1", "GENE2", "MT-CO1"]),
        np.array([1, "GENE2", 3.5], dtype=object),
        np.array([np.str_("A"), "B"], dtype=object),
        np.array([], dtype=object),
    ],
)
def test_feature_names_are_plain_strings(names):
    space = FeatureMap(label="selection", names=names, genes=np.arange(names.shape[0]))
    expected = tuple(str(value) for value in names)
    assert space.feature_names == expected
    assert all(type(name) is str for name in space.feature_names)
