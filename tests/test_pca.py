"""Principal axes from Gram matrices equal those of a full SVD and of scipy's eigh.

The Gram matrix's leading eigenpairs by band reduction equal LAPACK's symmetric solver.
"""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp

from scperteval.engine import _pca
from scperteval.engine._pca import leading_eigenpairs, principal_axes
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
    monkeypatch.setattr(_pca, "SMALL_SIDE", 40)
    monkeypatch.setattr(_pca, "BLOCK_BYTES", 8 * 4096)  # several blocks per sample
    # The Gram matrices' eigenpairs by band reduction, with several panels.
    monkeypatch.setattr(_pca, "DIRECT_ORDER", 0)
    monkeypatch.setattr(_pca, "BAND_WIDTH", 16)


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


@pytest.mark.parametrize("shape", [(500, 200), (200, 500)], ids=["genes<cells", "genes>cells"])
def test_banded_solver_equals_scipys_eigh(small_side, shape):
    dense = expression_like(*shape, seed=shape[1])
    axes, offset = principal_axes(dense, 12)
    expected_axes, expected_offset = principal_axes(dense, 12, eigensolver="eigh")
    np.testing.assert_array_equal(offset, expected_offset)
    # Both signed by their largest loading: equal up to sign is equal here.
    np.testing.assert_allclose(axes, expected_axes, atol=1e-10)
    projected = (dense - offset) @ axes
    expected = (dense - offset) @ expected_axes
    assert np.abs(projected - expected).max() <= 1e-10 * np.abs(expected).max()


def test_unknown_eigensolver_is_refused():
    with pytest.raises(ValueError, match="eigensolver"):
        principal_axes(np.ones((3, 2)), 1, eigensolver="lanczos")  # type: ignore[arg-type]


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
    axes, offset = principal_axes(dense, 6)
    np.testing.assert_allclose(offset, dense.mean(axis=0), rtol=1e-14, atol=1e-15)
    # The axes beyond the rank are arbitrary: the reference SVD is taken of the
    # sample centred on the same bits (the mean is summed by blocks of rows).
    _, _, vt = np.linalg.svd(dense - offset, full_matrices=False)
    expected_axes = vt[:6].T
    signs = np.sign(expected_axes[np.argmax(np.abs(expected_axes), axis=0), np.arange(6)])
    np.testing.assert_array_equal(axes, expected_axes * signs)


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
            patch.setattr(_pca, "GRAM_TILE", 64)
            fits.append(principal_axes(sample, 10, threads=Threads(kernel_threads)))
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

    axes, offset = principal_axes(_pca.SampleRows(sample.shape, read), 8)
    expected_axes, expected_offset = svd_reference(dense, 8)
    np.testing.assert_allclose(offset, expected_offset, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(axes, expected_axes, atol=1e-10)
    if shape[1] < shape[0]:
        # The gene Gram route reads blocks only, never the whole sample.
        assert max(asked) < shape[0] and sum(asked) == 2 * shape[0]


@pytest.mark.parametrize("shape", [(400, 150), (150, 400)], ids=["genes<cells", "genes>cells"])
def test_gram_matrix_in_small_pages_gives_the_same_axes(small_side, shape, monkeypatch):
    sample = sp.csr_matrix(expression_like(*shape, seed=9))
    monkeypatch.setattr(_pca, "SMALL_PAGES_BYTES", 1 << 62)
    from_numpy = principal_axes(sample, 8)
    monkeypatch.setattr(_pca, "SMALL_PAGES_BYTES", 0)
    mapped = _pca._lower_half_matrix(150)
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
    expected = _pca._dense_rows(block.tocsc(), 0, 120, np.zeros(80), threads)  # scipy's route
    np.testing.assert_array_equal(_pca._dense_rows(block, 0, 120, np.zeros(80), threads), expected)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_csr_rows_written_into_a_reused_buffer_on_threads_equal_scipys(threads):
    rng = np.random.default_rng(7)
    matrix = sp.random(250, 40, density=0.3, random_state=3, format="csr", dtype=np.float32)
    offset = rng.normal(size=40)
    buffer = np.full((100, 40), np.nan)  # garbage from an earlier block
    for start in range(0, 250, 100):
        stop = min(start + 100, 250)
        expected = matrix[start:stop].astype(np.float64).toarray() - offset
        found = _pca._dense_rows(matrix, start, stop, offset, Threads(threads), buffer)
        assert np.shares_memory(found, buffer)
        np.testing.assert_array_equal(found, expected)


EPS = np.finfo(np.float64).eps


@pytest.fixture
def small_bands(monkeypatch):
    """Narrow bands, so that small matrices take many panels."""
    monkeypatch.setattr(_pca, "BAND_WIDTH", 8)
    monkeypatch.setattr(_pca, "DIRECT_ORDER", 0)


def lower_only(symmetric):
    """What the solver is given: the lower triangle, garbage above it."""
    stored = np.asfortranarray(np.tril(symmetric))
    stored[np.triu_indices_from(stored, 1)] = np.nan
    return stored


def gram_of(n_rows, order, seed, decay):
    rng = np.random.default_rng(seed)
    factor = rng.normal(size=(n_rows, order)) * np.geomspace(1.0, decay, order)
    return factor.T @ factor


def reference(symmetric, k):
    values, vectors = np.linalg.eigh(symmetric)
    return values[::-1][:k], vectors[:, ::-1][:, :k]


def aligned(vectors, expected):
    return vectors * np.sign(np.sum(vectors * expected, axis=0))


def check_eigenpairs(symmetric, values, vectors, k):
    scale = np.abs(symmetric).sum(axis=0).max()
    expected_values, _ = reference(symmetric, k)
    np.testing.assert_allclose(values, expected_values, rtol=0, atol=20 * EPS * scale)
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(k), atol=1e-13)
    residual = symmetric @ vectors - vectors * values
    assert np.abs(residual).max() <= 50 * EPS * scale


@pytest.mark.parametrize("order", [19, 37, 64, 101, 160])
def test_clear_spectrum_equals_lapack(small_bands, order):
    # Decaying spectrum: every gap is wide, so the vectors themselves are fixed.
    symmetric = gram_of(3 * order, order, seed=order, decay=0.05)
    k = min(10, order)
    values, vectors = leading_eigenpairs(lower_only(symmetric), k)
    check_eigenpairs(symmetric, values, vectors, k)
    _, expected_vectors = reference(symmetric, k)
    np.testing.assert_allclose(aligned(vectors, expected_vectors), expected_vectors, atol=1e-11)


def test_flat_spectrum_spans_lapacks_subspace(small_bands):
    # Noise-like data: eigenvalues a fraction of a percent apart, as in large
    # synthetic screens; the k-dimensional subspace is what the projections use.
    symmetric = gram_of(400, 150, seed=2, decay=1.0)
    values, vectors = leading_eigenpairs(lower_only(symmetric), 20)
    check_eigenpairs(symmetric, values, vectors, 20)
    _, expected_vectors = reference(symmetric, 20)
    gap = np.diff(np.linalg.eigvalsh(symmetric)[::-1][19:21])[0]
    projector_error = np.abs(vectors @ vectors.T - expected_vectors @ expected_vectors.T).max()
    assert projector_error <= 1e3 * EPS * np.abs(symmetric).max() / abs(gap)


def test_default_width_on_a_gram_matrix_of_many_panels():
    symmetric = gram_of(1500, 1300, seed=11, decay=0.2)
    values, vectors = leading_eigenpairs(lower_only(symmetric), 30)
    check_eigenpairs(symmetric, values, vectors, 30)
    _, expected_vectors = reference(symmetric, 30)
    np.testing.assert_allclose(aligned(vectors, expected_vectors), expected_vectors, atol=1e-11)


def test_repeated_eigenvalues_get_orthonormal_vectors_of_their_eigenspace(small_bands):
    rng = np.random.default_rng(5)
    basis, _ = np.linalg.qr(rng.normal(size=(90, 90)))
    spectrum = np.concatenate([[9.0, 7.0, 7.0, 7.0, 4.0, 4.0], rng.uniform(0, 2, size=84)])
    symmetric = (basis * spectrum) @ basis.T
    symmetric = (symmetric + symmetric.T) / 2
    values, vectors = leading_eigenpairs(lower_only(symmetric), 6)
    check_eigenpairs(symmetric, values, vectors, 6)
    triple = vectors[:, 1:4]
    expected_triple = basis[:, 1:4]
    np.testing.assert_allclose(triple @ triple.T, expected_triple @ expected_triple.T, atol=1e-12)


def test_low_rank_matrix_has_zero_trailing_eigenvalues(small_bands):
    rng = np.random.default_rng(9)
    factor = rng.normal(size=(3, 70))
    symmetric = factor.T @ factor
    values, vectors = leading_eigenpairs(lower_only(symmetric), 5)
    check_eigenpairs(symmetric, values, vectors, 5)
    assert np.all(np.abs(values[3:]) <= 50 * EPS * np.abs(symmetric).sum(axis=0).max())


def test_zero_matrix(small_bands):
    values, vectors = leading_eigenpairs(np.zeros((40, 40), order="F"), 3)
    np.testing.assert_array_equal(values, np.zeros(3))
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(3), atol=1e-14)


def test_banded_solver_fallback_gives_the_same_eigenpairs(small_bands, monkeypatch):
    symmetric = gram_of(200, 80, seed=4, decay=0.05)
    monkeypatch.setattr(_pca, "_inverse_iteration", lambda band, values: None)
    values, vectors = leading_eigenpairs(lower_only(symmetric), 7)
    check_eigenpairs(symmetric, values, vectors, 7)
    _, expected_vectors = reference(symmetric, 7)
    np.testing.assert_allclose(aligned(vectors, expected_vectors), expected_vectors, atol=1e-11)


def test_inaccurate_vectors_are_refused(small_bands):
    symmetric = gram_of(200, 80, seed=4, decay=0.05)
    band_matrix = lower_only(symmetric)
    _pca._reduce_to_band(band_matrix, 8)
    band = _pca._lower_band(band_matrix, 8)
    values = np.linalg.eigvalsh(symmetric)[::-1][:4]
    assert _pca._inverse_iteration(band, values) is not None
    assert _pca._inverse_iteration(band, values * (1 + 1e-6)) is None


def test_same_bits_for_any_number_of_blas_threads(small_bands):
    from threadpoolctl import threadpool_limits

    symmetric = gram_of(300, 120, seed=8, decay=0.3)
    results = []
    for threads in (1, 2, 3):
        with threadpool_limits(threads):
            results.append(leading_eigenpairs(lower_only(symmetric), 12))
    for values, vectors in results[1:]:
        np.testing.assert_array_equal(values, results[0][0])
        np.testing.assert_array_equal(vectors, results[0][1])


def test_band_reduction_is_an_orthogonal_similarity(small_bands):
    symmetric = gram_of(90, 60, seed=3, decay=0.5)
    reduced = lower_only(symmetric)
    panels = _pca._reduce_to_band(reduced, 8)
    band = _pca._lower_band(reduced, 8)
    full_band = np.zeros_like(symmetric)
    for offset in range(9):
        full_band += np.diag(band[offset, : 60 - offset], -offset)
        if offset:
            full_band += np.diag(band[offset, : 60 - offset], offset)
    transform = np.eye(60)
    _pca._apply_panels(reduced, panels, transform)
    np.testing.assert_allclose(transform.T @ transform, np.eye(60), atol=1e-13)
    np.testing.assert_allclose(transform @ full_band @ transform.T, symmetric, atol=1e-11)
    np.testing.assert_allclose(sla.eigvalsh(full_band), np.linalg.eigvalsh(symmetric), atol=1e-11)


@pytest.mark.parametrize(
    ("matrix", "k"),
    [
        (np.zeros((3, 4), order="F"), 1),
        (np.zeros((4, 4), order="F"), 0),
        (np.zeros((4, 4), order="F"), 5),
        (np.zeros((4, 4), dtype=np.float32, order="F"), 2),
        (np.zeros((4, 4), order="C") + np.arange(4), 2),
    ],
    ids=["not square", "k=0", "k>n", "float32", "C order"],
)
def test_bad_arguments(matrix, k):
    with pytest.raises(ValueError):
        leading_eigenpairs(matrix, k)
