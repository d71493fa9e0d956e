"""A file read and hashed ahead of a run gives what the run would read and hash itself."""

from __future__ import annotations

import hashlib
import os
import threading

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from scperteval.cli import main
from scperteval.data import prefetch
from scperteval.data.h5ad import read_stored
from scperteval.data.prefetch import (
    discard_prefetches,
    start_prefetch,
    take_prefetched,
)
from scperteval.runinfo import checksums


@pytest.fixture(autouse=True)
def _nothing_left_behind():
    yield
    discard_prefetches()
    checksums.cancel_unclaimed_checksums()
    assert not prefetch._PENDING
    assert not checksums._UNCLAIMED


@pytest.fixture(scope="module")
def simulated_path(tmp_path_factory):
    from scperteval.simulation import simulate

    adata = simulate(
        n_perturbations=4, n_genes=30, cells_per_perturbation=12, n_covariates=2, seed=5
    )
    path = tmp_path_factory.mktemp("read_ahead") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


def _write(path, matrix):
    n_obs, n_vars = matrix.shape
    adata = ad.AnnData(
        X=matrix,
        obs=pd.DataFrame(
            {"perturbation": pd.Categorical(["control", "A", "B"] * (n_obs // 3))},
            index=[f"c{i}" for i in range(n_obs)],
        ),
        var=pd.DataFrame(index=[f"g{i}" for i in range(n_vars)]),
    )
    adata.write_h5ad(path)
    return path


MATRICES = {
    "csr float32": lambda: sp.random(60, 9, density=0.3, format="csr", dtype=np.float32, rng=1),
    "csc float64": lambda: sp.random(60, 9, density=0.3, format="csc", dtype=np.float64, rng=2),
    "dense float32": lambda: np.random.default_rng(3).random((60, 9), dtype=np.float32),
    "dense int64": lambda: np.arange(540, dtype=np.int64).reshape(60, 9),
}


@pytest.mark.parametrize("kind", list(MATRICES))
def test_prefetched_arrays_are_the_stored_ones(tmp_path, monkeypatch, kind):
    # Slices of 7 elements: many reads per array, the last one short.
    monkeypatch.setattr(prefetch, "_SLICE_ELEMENTS", 7)
    path = _write(tmp_path / "x.h5ad", MATRICES[kind]())
    assert start_prefetch(path, backed=False)
    arrays = take_prefetched(path)
    assert arrays is not None
    with h5py.File(path) as handle:
        node = handle["X"]
        stored = {"": node} if isinstance(node, h5py.Dataset) else dict(node.items())
        assert set(arrays) == set(stored)
        for name, array in arrays.items():
            assert array.dtype == stored[name].dtype
            np.testing.assert_array_equal(array, stored[name][()])
    # Taken once: a second read goes to the file.
    assert take_prefetched(path) is None


def test_the_reader_uses_the_prefetched_arrays(tmp_path):
    path = _write(tmp_path / "x.h5ad", MATRICES["csr float32"]())
    expected = read_stored(path).X
    assert start_prefetch(path, backed=False)
    pending = prefetch._PENDING[os.path.realpath(path)]
    pending.thread.join()
    arrays = pending.arrays
    found = read_stored(path).X
    # The very arrays read ahead, not copies.
    assert found.data is arrays["data"] and found.indices is arrays["indices"]
    for part in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(found, part), getattr(expected, part))
    assert not prefetch._PENDING


def test_nothing_is_prefetched_for_a_file_left_on_disk_or_missing(tmp_path, monkeypatch):
    path = _write(tmp_path / "x.h5ad", MATRICES["csr float32"]())
    assert not start_prefetch(path, backed=True)
    assert not start_prefetch(tmp_path / "missing.h5ad", backed=False)
    assert not start_prefetch(path, backed="sometimes")
    # "auto": left on disk when over a third of the available memory.
    monkeypatch.setattr("scperteval.data.memory.available_memory", lambda: 3.0 * 100)
    assert not start_prefetch(path, backed="auto")
    assert not prefetch._PENDING


def test_a_file_changed_after_the_prefetch_is_read_again(tmp_path):
    path = _write(tmp_path / "x.h5ad", MATRICES["csr float32"]())
    assert start_prefetch(path, backed=False)
    prefetch._PENDING[os.path.realpath(path)].thread.join()
    replacement = MATRICES["csc float64"]()
    _write(tmp_path / "x.h5ad", replacement)
    os.utime(path, ns=(1, 1))  # a different modification time, whatever the clock
    assert take_prefetched(path) is None
    np.testing.assert_array_equal(read_stored(path).X.toarray(), replacement.toarray())


def test_a_file_that_is_not_hdf5_prefetches_nothing_and_fails_as_before(tmp_path):
    path = tmp_path / "text.h5ad"
    path.write_text("not an HDF5 file")
    assert start_prefetch(path, backed=False)
    assert take_prefetched(path) is None
    with pytest.raises(OSError):
        read_stored(path)


def test_a_discarded_prefetch_stops_before_reading(tmp_path, monkeypatch):
    path = _write(tmp_path / "x.h5ad", MATRICES["dense float32"]())
    gate = threading.Event()
    reads = []
    original_touch = prefetch._touch

    def held_touch(arrays, stop):
        gate.wait(10)  # held until the discard below has set the stop flag
        original_touch(arrays, stop)

    monkeypatch.setattr(prefetch, "_touch", held_touch)
    monkeypatch.setattr(prefetch, "_read_in_slices", lambda *args: reads.append(args))
    assert start_prefetch(path, backed=False)
    pending = prefetch._PENDING[os.path.realpath(path)]
    waiter = threading.Thread(target=discard_prefetches)
    waiter.start()
    assert pending.stop.wait(10)
    gate.set()
    waiter.join(10)
    assert not waiter.is_alive()
    assert reads == []
    assert pending.arrays is None
    assert take_prefetched(path) is None


def test_pages_are_touched_in_pieces_until_stopped(monkeypatch):
    monkeypatch.setattr(prefetch, "_TOUCH_BYTES", 64)
    arrays = [np.full(1000, 7.0), np.full((30, 7), 3, dtype=np.int32), np.empty(0)]
    stop = threading.Event()
    prefetch._touch(arrays, stop)
    for array in arrays:
        assert not array.any()
    stop.set()
    untouched = np.full(1000, 7.0)
    prefetch._touch([untouched], stop)
    assert (untouched == 7.0).all()


def test_slices_stop_at_the_next_read_once_stopped():
    stop = threading.Event()
    calls = []

    class Stored:
        def read_direct(self, out, source, destination):
            assert source == destination
            out[source] = np.arange(out.shape[0])[source]
            calls.append(source)
            if len(calls) == 2:
                stop.set()

    out = np.zeros(10)
    assert prefetch._read_in_slices(Stored(), out, stop) is True  # one slice: 2**23 rows
    stop.clear()
    calls.clear()
    original = prefetch._SLICE_ELEMENTS
    try:
        prefetch._SLICE_ELEMENTS = 3
        assert prefetch._read_in_slices(Stored(), out, stop) is False
    finally:
        prefetch._SLICE_ELEMENTS = original
    assert calls == [np.s_[0:3], np.s_[3:6]]
    np.testing.assert_array_equal(out[:6], np.arange(6))


def test_a_checksum_begun_ahead_is_the_one_the_run_records(tmp_path):
    path = _write(tmp_path / "x.h5ad", MATRICES["csr float32"]())
    checksums.begin_input_checksum(str(path))
    begun = next(iter(checksums._UNCLAIMED.values()))
    claimed = checksums.start_input_checksum(path)
    assert claimed is begun
    assert not checksums._UNCLAIMED
    assert claimed() == "md5:" + hashlib.md5(path.read_bytes()).hexdigest()
    # Nothing to claim for data in memory; a new hash once the first is claimed.
    assert checksums.start_input_checksum(ad.read_h5ad(path)) is None
    again = checksums.start_input_checksum(path)
    assert again is not begun and again() == claimed()


def test_a_cancelled_checksum_raises_instead_of_a_wrong_value(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 100)
    stop = threading.Event()
    stop.set()
    with pytest.raises(checksums.ChecksumCancelled):
        checksums.file_checksum(path, chunk_bytes=100, stop=stop)


def test_a_hash_of_another_file_is_not_used(tmp_path, simulated_path):
    from scperteval.data.dataset import Dataset

    first = _write(tmp_path / "a.h5ad", MATRICES["csr float32"]())
    second = simulated_path
    begun = checksums.start_input_checksum(first)
    dataset = Dataset(str(second), covariate_key="cell_line")
    pending = checksums.start_dataset_checksum(dataset, begun)
    assert pending is not begun
    assert pending() == "md5:" + hashlib.md5(second.read_bytes()).hexdigest()
    # The other hash was told to stop (a small file may have been hashed already).
    assert begun._stop is not None and begun._stop.is_set()


def test_a_refused_run_leaves_no_read_or_hash_behind(simulated_path, tmp_path, capsys):
    code = main(
        ["calibrate", str(simulated_path), "-p", "no_such_protocol", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert "no_such_protocol" in capsys.readouterr().err
    assert not prefetch._PENDING
    assert not checksums._UNCLAIMED
    assert not any(t.name.startswith("scperteval-prefetch") for t in threading.enumerate())


@pytest.mark.parametrize("command", ["calibrate", "de"])
def test_a_run_from_the_command_line_reads_ahead_and_records_the_files_md5(
    simulated_path, tmp_path, monkeypatch, command
):
    import json

    import scperteval.data.h5ad as h5ad_module

    taken = []

    def spy(path):
        arrays = take_prefetched(path)
        taken.append(arrays is not None)
        return arrays

    monkeypatch.setattr(h5ad_module, "take_prefetched", spy)
    out = tmp_path / "o"
    args = [command, str(simulated_path), "--covariate-key", "cell_line"]
    if command == "calibrate":
        args += ["-p", "mse"]
    assert main([*args, "--out", str(out)]) == 0
    assert taken == [True]
    recorded = json.loads((out / "run.json").read_text())["input_checksum"]
    assert recorded == "md5:" + hashlib.md5(simulated_path.read_bytes()).hexdigest()
    assert not prefetch._PENDING
    assert not checksums._UNCLAIMED


def test_a_dataset_refused_after_loading_cancels_its_hash(simulated_path, monkeypatch):
    from scperteval.errors import DatasetError
    from scperteval.runinfo import Timer
    from scperteval.workflows import steps

    begun = []

    def spy(data):
        pending = checksums.start_input_checksum(data)
        begun.append(pending)
        return pending

    def refuse(dataset):
        raise DatasetError("refused")

    monkeypatch.setattr(steps, "start_input_checksum", spy)
    options = {"covariate_key": "cell_line"}
    with pytest.raises(DatasetError, match="refused"):
        steps.load_and_hash(str(simulated_path), Timer(), options, check=refuse)
    assert len(begun) == 1 and begun[0]._stop.is_set()
    dataset, pending = steps.load_and_hash(str(simulated_path), Timer(), options)
    assert not begun[1]._stop.is_set()
    assert pending is begun[1]
    assert pending() == "md5:" + hashlib.md5(simulated_path.read_bytes()).hexdigest()
    assert steps.load_and_hash(dataset, Timer(), {}, checksum=False)[1] is None
