"""Checksums of the input recorded in run.json, computed beside the run that owns them."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest

from scperteval.cli import main
from scperteval.data.dataset import Dataset
from scperteval.runinfo.checksums import (
    ChecksumCancelled,
    dataset_checksum,
    file_checksum,
    start_input_checksum,
)
from scperteval.simulation import simulate


@pytest.fixture(scope="module")
def simulated_path(tmp_path_factory):
    adata = simulate(
        n_perturbations=4, n_genes=30, cells_per_perturbation=12, n_covariates=2, seed=5
    )
    path = tmp_path_factory.mktemp("checksums") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


def _md5(path) -> str:
    return "md5:" + hashlib.md5(path.read_bytes()).hexdigest()


def test_file_checksum_is_the_md5_of_the_bytes(tmp_path):
    path = tmp_path / "blob.bin"
    payload = bytes(range(256)) * 5000
    path.write_bytes(payload)
    assert file_checksum(path, chunk_bytes=1000) == hashlib.md5(payload).hexdigest()


def test_a_cancelled_checksum_raises_instead_of_a_wrong_value(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 100)
    stop = threading.Event()
    stop.set()
    with pytest.raises(ChecksumCancelled):
        file_checksum(path, chunk_bytes=100, stop=stop)


def test_background_checksum_equals_direct_one(tmp_path):
    adata = simulate(n_perturbations=3, n_genes=20, cells_per_perturbation=10, seed=2)
    path = tmp_path / "screen.h5ad"
    adata.write_h5ad(path)
    on_disk = Dataset(str(path))
    assert start_input_checksum(on_disk)() == dataset_checksum(on_disk) == _md5(path)
    assert start_input_checksum(str(path))() == _md5(path)
    in_memory = Dataset(adata)
    assert start_input_checksum(in_memory)() == dataset_checksum(in_memory)
    assert dataset_checksum(in_memory).startswith("md5-memory:")


def test_a_hash_taken_over_between_chunks_is_the_files_md5(tmp_path):
    from scperteval.runinfo.checksums import _FileHash

    class PauseAfter:
        """Asks a hash to pause once it has hashed ``chunks`` chunks."""

        def __init__(self, chunks):
            self.asked = -1
            self.chunks = chunks

        def is_set(self):
            self.asked += 1
            return self.asked >= self.chunks

    path = tmp_path / "blob.bin"
    payload = bytes(range(256)) * 40 + b"tail"
    path.write_bytes(payload)
    partial = _FileHash(path, chunk_bytes=1000)
    assert partial.advance(pause=PauseAfter(3)) is None  # 3 of 11 chunks hashed
    assert partial.advance() == hashlib.md5(payload).hexdigest()
    assert partial.advance() == hashlib.md5(payload).hexdigest()  # once finished, kept


def test_a_background_checksum_reports_the_error_of_its_hash(tmp_path):
    pending = start_input_checksum(tmp_path / "missing.h5ad")
    with pytest.raises(FileNotFoundError):
        pending()


def test_lower_thread_priority_affects_the_calling_thread_only():
    import os
    import sys

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


def test_a_refused_run_starts_no_hash(simulated_path, tmp_path, capsys):
    code = main(
        ["calibrate", str(simulated_path), "-p", "no_such_protocol", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert "no_such_protocol" in capsys.readouterr().err
    assert not any(t.name == "scperteval-checksum" for t in threading.enumerate())


@pytest.mark.parametrize("command", ["calibrate", "de"])
def test_a_run_from_the_command_line_records_the_files_md5(simulated_path, tmp_path, command):
    out = tmp_path / "o"
    args = [command, str(simulated_path), "--covariate-key", "cell_line"]
    if command == "calibrate":
        args += ["-p", "mse"]
    assert main([*args, "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["input_checksum"] == _md5(simulated_path)


def test_a_dataset_refused_after_loading_cancels_its_hash(simulated_path, monkeypatch):
    from scperteval.errors import DatasetError
    from scperteval.runinfo import Timer
    from scperteval.workflows import steps

    begun = []

    def spy(data):
        pending = start_input_checksum(data)
        begun.append(pending)
        return pending

    def refuse(dataset):
        raise DatasetError("refused")

    monkeypatch.setattr(steps, "start_input_checksum", spy)
    options = {"covariate_key": "cell_line"}
    with pytest.raises(DatasetError, match="refused"):
        steps.load_and_hash(str(simulated_path), Timer(), options, check=refuse)
    assert len(begun) == 1 and begun[0].cancelled
    dataset, pending = steps.load_and_hash(str(simulated_path), Timer(), options)
    # Begun on the path before the file was read, and the one the job gets.
    assert len(begun) == 2 and pending is begun[1] and not pending.cancelled
    assert pending() == _md5(simulated_path)
    assert steps.load_and_hash(dataset, Timer(), {}, checksum=False)[1] is None
    # An open Dataset's hash starts once it is known to be open.
    assert steps.load_and_hash(dataset, Timer(), {})[1]() == _md5(simulated_path)
