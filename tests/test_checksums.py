"""Checksums of the input recorded in run.json."""

from __future__ import annotations

import hashlib

from scperteval.data.dataset import Dataset
from scperteval.runinfo.checksums import dataset_checksum, file_checksum, start_dataset_checksum
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


def test_lower_thread_priority_affects_the_calling_thread_only():
    import os
    import sys
    import threading

    from scperteval.runinfo.checksums import _lower_thread_priority as lower_thread_priority

    def nice_of(thread_id):
        return os.getpriority(os.PRIO_PROCESS, thread_id)

    result = {}

    def background():
        result["lowered"] = lower_thread_priority()
        result["nice"] = nice_of(threading.get_native_id())

    before = nice_of(threading.get_native_id()) if sys.platform.startswith("linux") else 0
    thread = threading.Thread(target=background)
    thread.start()
    thread.join(10)
    if not sys.platform.startswith("linux"):
        assert result["lowered"] is False
        return
    assert result["lowered"] is True
    assert result["nice"] == 19
    assert nice_of(threading.get_native_id()) == before
