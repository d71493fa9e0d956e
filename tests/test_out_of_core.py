"""Backed ``.h5ad`` files: the same results as in memory, reading only the rows needed."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from scperteval.cli import main
from scperteval.data.dataset import Dataset
from scperteval.data.ondisk import GAP_ROWS, DiskCSR
from scperteval.errors import DatasetError
from scperteval.simulation import simulate
from scperteval.workflows.calibrate import calibrate

CHUNK = 97  # not a divisor of any group size: chunks cut through perturbations
SAMPLE = 150  # below the perturbed cells of a cell line: the sample is a scattered subset
PROTOCOLS = [
    "pearson_delta_ctrl",  # centroid, control-centred
    "pearson_delta_ctrl_interpolated",  # duplicate DE p-values
    "mse_top_k",  # truth DE space
    "weighted_mse",  # DEG weights
    "de_auroc",  # DE views, all-perturbed sample as negative
    "de_topk_overlap",
    "rank_full",  # dataset scope
    "rank_pca",  # PCA fit on cells read from the file
    "pds",
    "energy_top_k",  # population: cells of the truth, duplicate and sample
]


@pytest.fixture(scope="module")
def screen(tmp_path_factory):
    """A simulated screen in memory and the same screen written to an ``.h5ad`` file."""
    adata = simulate(
        n_perturbations=8, n_genes=50, cells_per_perturbation=40, n_covariates=2, seed=11
    )
    adata.X = sp.csr_matrix(adata.X, dtype=np.float32)
    path = tmp_path_factory.mktemp("ooc") / "screen.h5ad"
    adata.write_h5ad(path)
    return adata, path


def _calibrated(data, **options):
    result = calibrate(
        data,
        protocols=PROTOCOLS,
        covariate_key="cell_line",
        chunk_cells=CHUNK,
        sample_cells=SAMPLE,
        seed=5,
        **options,
    )
    order = ["covariate", "perturbation", "protocol", "source"]
    return result.results.sort_values(order).reset_index(drop=True), result.calibration


class _ReadLog:
    """Every read of an HDF5 dataset of the file: its path and number of elements."""

    def __init__(self, monkeypatch):
        self.reads: list[tuple[str, int]] = []
        original = h5py.Dataset.__getitem__

        def spy(dataset, selection):
            values = original(dataset, selection)
            self.reads.append((dataset.name, int(np.size(values))))
            return values

        monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)

    def sizes(self, name: str) -> list[int]:
        return [size for path, size in self.reads if path == name]


def test_backed_calibration_equals_in_memory(screen, monkeypatch):
    adata, path = screen
    in_memory, calibration_in_memory = _calibrated(adata)
    log = _ReadLog(monkeypatch)
    backed, calibration_backed = _calibrated(str(path), backed=True)
    assert set(backed["protocol"]) == set(PROTOCOLS)
    assert backed["value"].notna().any()
    pd.testing.assert_frame_equal(backed, in_memory, check_exact=True)
    pd.testing.assert_frame_equal(calibration_backed, calibration_in_memory, check_exact=True)

    # No read of the values covers more cells than one chunk holds, and the raw
    # counts layer, which this run does not use, is never read.
    indptr = adata.X.indptr
    largest_chunk = max(indptr[i + CHUNK] - indptr[i] for i in range(adata.n_obs - CHUNK + 1))
    data_reads = log.sizes("/X/data")
    assert data_reads and max(data_reads) <= largest_chunk < adata.X.nnz
    assert not [name for name, _ in log.reads if name.startswith("/layers/")]


def test_backed_rows_reads_only_the_rows_asked_for(screen):
    adata, path = screen
    dataset = Dataset(path, covariate_key="cell_line", backed=True)
    matrix = dataset.matrix()
    assert isinstance(matrix, DiskCSR) and dataset.is_backed
    far = 3 * GAP_ROWS
    positions = np.array([5, 6, 6 + far, 6 + 2 * far, 300])
    reads_before, rows_before = matrix.n_reads, matrix.rows_read  # the validation pass
    rows = dataset.rows(positions)
    np.testing.assert_array_equal(rows.toarray(), adata.X[positions].toarray())
    # Rows 5 and 6 in one slice, each other row alone.
    assert (matrix.n_reads - reads_before, matrix.rows_read - rows_before) == (4, 5)
    shuffled = positions[[3, 0, 4, 1, 2]]
    np.testing.assert_array_equal(dataset.rows(shuffled).toarray(), adata.X[shuffled].toarray())


def test_backed_layer_is_read_from_disk(screen):
    adata, path = screen
    backed = Dataset(path, covariate_key="cell_line", layer="counts", normalize=True, backed=True)
    loaded = Dataset(adata, covariate_key="cell_line", layer="counts", normalize=True)
    assert isinstance(backed.matrix(), DiskCSR)
    # Annotations only in memory: the layer is the file's group, read by rows.
    assert isinstance(backed.adata.layers["counts"], h5py.Group)
    positions = np.array([0, 17, 18, 500])
    np.testing.assert_array_equal(
        backed.rows(positions).toarray(), loaded.rows(positions).toarray()
    )


def test_backed_dense_matrix(screen, tmp_path):
    adata, _ = screen
    dense = adata.copy()
    dense.X = adata.X.toarray()
    path = tmp_path / "dense.h5ad"
    dense.write_h5ad(path)
    dataset = Dataset(path, covariate_key="cell_line", backed=True, chunk_cells=CHUNK)
    positions = np.array([3, 4, 200, 201, 202, 640])
    np.testing.assert_array_equal(dataset.rows(positions), dense.X[positions])
    blocks = [block for _, block in dataset.iter_chunks()]
    np.testing.assert_array_equal(np.vstack(blocks), dense.X)


def test_backed_csc_fails_with_advice(screen, tmp_path):
    adata, _ = screen
    by_column = adata.copy()
    by_column.X = sp.csc_matrix(adata.X)
    path = tmp_path / "csc.h5ad"
    by_column.write_h5ad(path)
    with pytest.raises(DatasetError, match="stored by column"):
        Dataset(path, covariate_key="cell_line", backed=True)


def test_cli_backed_option(screen, tmp_path):
    _, path = screen
    out = tmp_path / "run"
    arguments = ["calibrate", str(path), "-p", "mse", "--covariate-key", "cell_line"]
    code = main([*arguments, "--backed", "--chunk-cells", "64", "--out", str(out)])
    assert code == 0
    options = json.loads((out / "run.json").read_text())["options"]
    assert options["backed"] is True and options["chunk_cells"] == 64


def test_anndata_opened_backed_is_read_by_rows(screen):
    import anndata

    adata, path = screen
    opened = anndata.read_h5ad(path, backed="r")
    dataset = Dataset(opened, covariate_key="cell_line", chunk_cells=CHUNK)
    assert dataset.is_backed and isinstance(dataset.matrix(), DiskCSR)
    positions = np.array([1, 2, 3, 450, 799])
    np.testing.assert_array_equal(dataset.rows(positions).toarray(), adata.X[positions].toarray())
