"""Ctrl-C and SIGTERM stop a run at once, print one line, exit 130 and write nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scperteval.outputs import MANIFEST, staged_output

COMMAND = "from scperteval.cli import main; raise SystemExit(main())"


@pytest.fixture(scope="module")
def slow_data(tmp_path_factory) -> Path:
    """A screen large enough that ``calibrate -p default`` runs for many seconds."""
    from scperteval.simulation import simulate

    # About 15 s of work on two cores (and 6 s, far too close to the signal, for a
    # screen half this size).
    adata = simulate(n_perturbations=400, n_genes=600, cells_per_perturbation=120, seed=2)
    path = tmp_path_factory.mktemp("interrupt") / "screen.h5ad"
    adata.write_h5ad(path)
    return path


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_calibrate_within_two_seconds(slow_data, tmp_path, signum):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.parquet").write_bytes(b"the previous run's results")
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            COMMAND,
            "calibrate",
            str(slow_data),
            "-p",
            "default",
            "--workers",
            "2",
            "--overwrite",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Long enough to be past imports and into the work, well short of its end.
    time.sleep(8.0)
    assert process.poll() is None, "the run ended before it could be interrupted"
    sent = time.monotonic()
    process.send_signal(signum)
    try:
        _, err = process.communicate(timeout=10)
    finally:
        process.kill()
    elapsed = time.monotonic() - sent
    assert process.returncode == 130, err
    assert elapsed < 2.0, f"took {elapsed:.1f} s to stop"
    assert "Traceback" not in err
    assert err.strip().splitlines() == ["scperteval: interrupted; nothing was written"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]


def test_staged_output_publishes_only_complete_runs(tmp_path):
    out = tmp_path / "run"
    with staged_output(out) as folder:
        (folder / "results.parquet").write_text("first")
        (folder / "report.html").write_text("first report")
        (folder / "figures").mkdir()
        (folder / "figures" / "a.png").write_text("a")
    (out / "notes.txt").write_text("the user's own file")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST, "results.parquet", "report.html", "figures", "notes.txt"]
    )
    # A failing run leaves everything as it was.
    with pytest.raises(RuntimeError), staged_output(out) as folder:
        (folder / "results.parquet").write_text("half written")
        raise RuntimeError("killed")
    assert (out / "results.parquet").read_text() == "first"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.partial-")]
    # Another command's run replaces the old run's files and removes those it does not write.
    with staged_output(out) as folder:
        (folder / "results.parquet").write_text("second")
        (folder / "calibration.csv").write_text("second")
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([MANIFEST, "results.parquet", "calibration.csv", "notes.txt"])
    assert (out / "results.parquet").read_text() == "second"
    assert (out / "notes.txt").read_text() == "the user's own file"


def test_check_output_folder_refuses_files_and_unwritable_places(tmp_path):
    from scperteval.errors import SpecError
    from scperteval.outputs import check_output_folder

    existing = tmp_path / "file"
    existing.write_text("x")
    with pytest.raises(SpecError, match="is an existing file"):
        check_output_folder(existing)
    with pytest.raises(SpecError, match="not writable"):
        check_output_folder("/proc/1/results")
    nested = tmp_path / "a" / "b" / "c"
    assert check_output_folder(nested) == nested
    assert not (tmp_path / "a").exists()
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            with pytest.raises(SpecError, match="not writable"):
                check_output_folder(locked / "out")
        finally:
            locked.chmod(0o700)
