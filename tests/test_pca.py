"""Principal axes from Gram matrices equal those of a full SVD."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import scipy.sparse as sp

from scperteval.engine import eigen, pca
from scperteval.engine.pca import principal_axes
from scperteval.kernels.threads import Threads


def svd_reference(dense, k):
    """The textbook fit: full SVD of the centred sample, largest loading positive."""
    centred = dense - dense.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    axes = vt[:k].T
    signs = np.sign(axes[np.argmax(np.abs(axes), axis=0), np.arange(axes.shape[1])])
    return axes * signs, dense.mean(axis=0)


def expression_like(n_cells, n_genes, seed, density=0.3):
    """Sparse non-negative data with a spectrum whose leading gaps are clear."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(n_cells, 12)) * np.geomspace(6.0, 1.5, 12)
    loadings = rng.normal(size=(12, n_genes))
    signal = np.abs(scores @ loadings + rng.normal(scale=0.3, size=(n_cells, n_genes)))
    signal[rng.random(signal.shape) > density] = 0.0
    return signal


@pytest.fixture
def small_side(monkeypatch):
    monkeypatch.setattr(pca, "SMALL_SIDE", 40)
    monkeypatch.setattr(pca, "BLOCK_BYTES", 8 * 4096)  # several blocks per sample
    # The Gram matrices' eigenpairs by band reduction, with several panels.
    monkeypatch.setattr(eigen, "DIRECT_ORDER", 0)
    monkeypatch.setattr(eigen, "BAND_WIDTH", 16)


@pytest.mark.parametrize("shape", [(400, 150), (150, 400)], ids=["genes<cells", "genes>cells"])
@pytest.mark.parametrize("sparse", [True, False])
def test_gram_routes_equal_full_svd(small_side, shape, sparse):
    dense = expression_like(*shape, seed=shape[0])
    sample = sp.csr_matrix(dense.astype(np.float32)) if sparse else dense
    reference_input = dense.astype(np.float32).astype(np.float64) if sparse else dense
    axes, offset = principal_axes(sample, 8)
    expected_axes, expected_offset = svd_reference(reference_input, 8)
    np.testing.assert_allclose(offset, expected_offset, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(axes, expected_axes, atol=1e-10)
    np.testing.assert_allclose(axes.T @ axes, np.eye(8), atol=1e-12)


def test_projected_distances_equal_full_svd(small_side):
    dense = expression_like(300, 120, seed=5)
    axes, offset = principal_axes(dense, 10)
    expected_axes, _ = svd_reference(dense, 10)
    projected = (dense - offset) @ axes
    expected = (dense - offset) @ expected_axes
    distances = np.linalg.norm(projected[:, None] - projected[None], axis=-1)
    expected_distances = np.linalg.norm(expected[:, None] - expected[None], axis=-1)
    assert np.abs(distances - expected_distances).max() <= 1e-10 * expected_distances.max()


def test_rank_deficient_sample_falls_back_to_svd(small_side):
    rng = np.random.default_rng(3)
    dense = rng.normal(size=(200, 3)) @ rng.normal(size=(3, 90))  # rank 3 after centring
    axes, _ = principal_axes(dense, 6)
    expected_axes, _ = svd_reference(dense, 6)
    np.testing.assert_array_equal(axes, expected_axes)


def test_fewer_axes_than_asked_when_the_sample_is_small():
    dense = expression_like(7, 30, seed=1)
    axes, _ = principal_axes(dense, 50)
    assert axes.shape == (30, 7)
    expected_axes, _ = svd_reference(dense, 7)
    np.testing.assert_allclose(axes[:, :6], expected_axes[:, :6], atol=1e-12)


@pytest.mark.parametrize("shape", [(700, 300), (300, 700)])
def test_axes_do_not_depend_on_blas_or_kernel_threads(small_side, shape):
    # Gram tiles narrower than the sample, so several tiles share each range.
    from threadpoolctl import threadpool_limits

    sample = expression_like(*shape, seed=4)
    fits = []
    for blas_threads, kernel_threads in ((1, 1), (2, 2), (2, 1), (1, 3)):
        with threadpool_limits(blas_threads), pytest.MonkeyPatch.context() as patch:
            patch.setattr(pca, "GRAM_TILE", 64)
            fits.append(principal_axes(sample, 10, Threads(kernel_threads)))
    for axes, offset in fits[1:]:
        np.testing.assert_array_equal(axes, fits[0][0])
        np.testing.assert_array_equal(offset, fits[0][1])
    expected, _ = svd_reference(sample, 10)
    np.testing.assert_allclose(fits[0][0], expected, atol=1e-10)


@pytest.mark.parametrize("shape", [(400, 150), (150, 400)], ids=["genes<cells", "genes>cells"])
def test_sample_read_by_blocks_gives_the_same_axes(small_side, shape):
    dense = expression_like(*shape, seed=7)
    sample = sp.csr_matrix(dense)
    asked = []

    def read(start, stop):
        asked.append(stop - start)
        return sample[start:stop]

    axes, offset = principal_axes(pca.SampleRows(sample.shape, read), 8)
    expected_axes, expected_offset = svd_reference(dense, 8)
    np.testing.assert_allclose(offset, expected_offset, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(axes, expected_axes, atol=1e-10)
    if shape[1] < shape[0]:
        # The gene Gram route reads blocks only, never the whole sample.
        assert max(asked) < shape[0] and sum(asked) == 2 * shape[0]


@pytest.mark.parametrize("shape", [(400, 150), (150, 400)], ids=["genes<cells", "genes>cells"])
def test_gram_matrix_in_small_pages_gives_the_same_axes(small_side, shape, monkeypatch):
    sample = sp.csr_matrix(expression_like(*shape, seed=9))
    monkeypatch.setattr(pca, "SMALL_PAGES_BYTES", 1 << 62)
    from_numpy = principal_axes(sample, 8)
    monkeypatch.setattr(pca, "SMALL_PAGES_BYTES", 0)
    mapped = pca._lower_half_matrix(150)
    assert mapped.flags.f_contiguous and mapped.flags.writeable and not mapped.any()
    owner = mapped
    while isinstance(owner, np.ndarray):
        owner = owner.base
    assert isinstance(owner.obj, mmap.mmap)  # its own mapping, not numpy's memory
    from_mapping = principal_axes(sample, 8)
    np.testing.assert_array_equal(from_mapping[0], from_numpy[0])
    np.testing.assert_array_equal(from_mapping[1], from_numpy[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_csr_rows_written_densely_equal_scipys_float64_dense_rows(dtype):
    from scperteval.kernels.sparse_rows import add_csr_rows

    rng = np.random.default_rng(5)
    # Unsorted columns with repeats, whose values scipy sums in storage order.
    indptr = np.array([0, 3, 3, 7, 9])
    indices = np.array([4, 1, 4, 0, 5, 0, 2, 3, 3])
    values = rng.normal(scale=50.0, size=indices.size).astype(dtype)
    matrix = sp.csr_matrix((values, indices, indptr), shape=(4, 6))
    assert not matrix.has_canonical_format
    dense = np.zeros(matrix.shape)
    add_csr_rows(matrix.indptr, matrix.indices, matrix.data, dense)
    np.testing.assert_array_equal(dense, matrix.astype(np.float64).toarray())
    # And the rows of a block cut from a larger matrix, as the fit reads them.
    big = sp.random(300, 80, density=0.2, random_state=2, format="csr", dtype=np.float64)
    block = big.astype(dtype)[100:220]
    threads = Threads()
    expected = pca._dense_rows(block.tocsc(), 0, 120, np.zeros(80), threads)  # scipy's route
    np.testing.assert_array_equal(pca._dense_rows(block, 0, 120, np.zeros(80), threads), expected)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_csr_rows_written_into_a_reused_buffer_on_threads_equal_scipys(threads):
    rng = np.random.default_rng(7)
    matrix = sp.random(250, 40, density=0.3, random_state=3, format="csr", dtype=np.float32)
    offset = rng.normal(size=40)
    buffer = np.full((100, 40), np.nan)  # garbage from an earlier block
    for start in range(0, 250, 100):
        stop = min(start + 100, 250)
        expected = matrix[start:stop].astype(np.float64).toarray() - offset
        found = pca._dense_rows(matrix, start, stop, offset, Threads(threads), buffer)
        assert np.shares_memory(found, buffer)
        np.testing.assert_array_equal(found, expected)
