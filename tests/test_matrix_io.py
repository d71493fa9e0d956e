"""Reading rows of an in-memory CSR matrix without copying them."""

import numpy as np
import pytest
import scipy.sparse as sp

from scperteval.data.matrix_io import csr_row_view


@pytest.mark.parametrize(("start", "stop"), [(0, 10), (37, 61), (90, 100), (0, 100), (50, 50)])
def test_row_view_equals_slice_and_shares_memory(start: int, stop: int) -> None:
    matrix = sp.random(100, 30, density=0.3, format="csr", dtype=np.float32, random_state=1)
    view = csr_row_view(matrix, start, stop)
    expected = matrix[start:stop]
    view.copy().check_format(full_check=True)  # checking the view itself would copy it
    assert view.shape == expected.shape
    assert view.dtype == matrix.dtype
    np.testing.assert_array_equal(view.toarray(), expected.toarray())
    if view.nnz:
        # A small slice of a large matrix is still a view (scipy's constructor copies it).
        assert np.shares_memory(view.data, matrix.data)
        assert np.shares_memory(view.indices, matrix.indices)


def test_row_view_keeps_index_dtype() -> None:
    matrix = sp.random(40, 8, density=0.5, format="csr", random_state=2)
    matrix.indptr = matrix.indptr.astype(np.int64)
    matrix.indices = matrix.indices.astype(np.int64)
    view = csr_row_view(matrix, 5, 9)
    assert view.indptr.dtype == np.int64
    assert view.indptr[0] == 0
    np.testing.assert_array_equal(view.toarray(), matrix[5:9].toarray())
