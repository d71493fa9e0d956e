"""Checksums recorded in run.json."""

from __future__ import annotations

import hashlib

from scperteval.data.dataset import Dataset
from scperteval.runinfo import dataset_checksum, file_checksum, start_dataset_checksum
from scperteval.simulation import simulate


def test_file_checksum_is_the_md5_of_the_bytes(tmp_path):
    path = tmp_path / "blob.bin"
    payload = bytes(range(256)) * 5000
    path.write_bytes(payload)
    assert file_checksum(path, chunk_bytes=1000) == hashlib.md5(payload).hexdigest()


def test_background_checksum_equals_direct_one(tmp_path):
    adata = simulate(n_perturbations=3, n_genes=20, cells_per_perturbation=10, seed=2)
    path = tmp_path / "screen.h5ad"
    adata.write_h5ad(path)
    on_disk = Dataset(str(path))
    assert start_dataset_checksum(on_disk)() == dataset_checksum(on_disk)
    assert dataset_checksum(on_disk) == "md5:" + file_checksum(path)
    in_memory = Dataset(adata)
    assert start_dataset_checksum(in_memory)() == dataset_checksum(in_memory)
    assert dataset_checksum(in_memory).startswith("md5-memory:")
