#!/usr/bin/env python
"""Benchmark: ``scperteval calibrate`` end to end, by dataset and protocol group.

Each case runs ``scperteval calibrate DATA -p PROTOCOLS --out DIR`` in a fresh
subprocess (imports, reading the file and writing the results included) and
records its wall time and peak resident memory: from ``/usr/bin/time -v`` when it
exists, else from the child's own resource usage (``os.wait4``). The timings the
run writes to ``run.json`` (load, protocols, ...) are shown next to them.

Datasets (generated once into ``--workdir`` with the shared generator
``../shared/bench/make_dataset.py`` and reused, unless a file is given):

- ``norman``: the Norman subset of the shared development file
  (``--perturbation-key condition --subset dataset=norman19``);
- ``S``: ``--cells 20000 --genes 2000 --perts 100 --ctrl-cells 2000``;
- ``M``: ``--cells 100000 --genes 5000 --perts 500 --ctrl-cells 8000``.

Protocol groups, taken from the ``default`` suite: ``all`` (the suite),
``centroid+de`` (centroid, rank and DE protocols), ``energy+mmd`` (the four
energy-distance and MMD protocols) and ``sinkhorn`` (the two Sinkhorn
protocols). ``--score`` adds ``scperteval score -p all`` on S with one model
(``make_predictions.py --models mean``).

The table compares each case with the reference implementation's published
figures (the issue's measurements on a 2-core machine): the speed-up is
reference time / our time, the memory ratio our peak / the reference's.
``--baseline PYTHONPATH`` also runs every case with another copy of the package
(e.g. a checkout of the previous version), interleaved with ours so that load
from other processes affects both alike, and prints that ratio too.

Examples
--------
Norman and S, every group::

    python benchmarks/bench_calibrate.py --s-data /work/bench_data/S.h5ad

Everything, M included::

    python benchmarks/bench_calibrate.py --datasets norman,S,M --score
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
MAKE_DATASET = SHARED / "bench" / "make_dataset.py"
MAKE_PREDICTIONS = SHARED / "bench" / "make_predictions.py"
NORMAN = SHARED / "data" / "perturbench_devel.h5ad"

SIZES = {
    "S": ["--cells", "20000", "--genes", "2000", "--perts", "100", "--ctrl-cells", "2000"],
    "M": ["--cells", "100000", "--genes", "5000", "--perts", "500", "--ctrl-cells", "8000"],
}
GROUPS = ("all", "centroid+de", "energy+mmd", "sinkhorn")

#: The reference implementation's figures: (seconds, GiB, note). A time given as a
#: lower bound is marked ">".
REFERENCE: dict[tuple[str, str], tuple[float, float, str]] = {
    ("norman", "all"): (241.0, 0.54, ""),
    ("S", "centroid+de"): (12.7, 0.49, ""),
    ("S", "energy+mmd"): (1261.0, 2.0, "4 protocols"),
    ("S", "sinkhorn"): (1500.0, 1.5, "> 25 min for ONE protocol (we run 2)"),
    ("M", "centroid+de"): (65.0, 1.6, ""),
    ("S", "score"): (45.5, 1.2, "score -p all, one model"),
}


@dataclass
class Measurement:
    seconds: float
    peak_gib: float
    returncode: int
    timings: dict[str, float] = field(default_factory=dict)
    tail: str = ""


def protocol_groups() -> dict[str, str]:
    """Comma-separated protocol names of each group of the default suite."""
    from scperteval.engine.suites import resolve_protocols

    suite = resolve_protocols("default")
    names = {
        "centroid+de": [p.name for p in suite if p.representation in ("centroid", "de")],
        "energy+mmd": [p.name for p in suite if p.metric.name in ("energy_distance", "mmd")],
        "sinkhorn": [p.name for p in suite if p.metric.name == "sinkhorn"],
    }
    groups = {group: ",".join(members) for group, members in names.items()}
    groups["all"] = "default"
    return groups


def ensure_dataset(name: str, workdir: Path, given: str | None) -> Path:
    """The dataset file: given, already in ``workdir``, or generated there."""
    if given:
        return Path(given).resolve()
    path = workdir / f"{name}.h5ad"
    if path.exists():
        return path
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(MAKE_DATASET), *SIZES[name], "--out", str(path)]
    print(f"generating {name}: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True)
    return path


def ensure_prediction(data: Path, workdir: Path, perturbation_key: str = "perturbation") -> Path:
    """One model's predictions for ``data`` (the ``mean`` model), generated once."""
    folder = workdir / f"{data.stem}_predictions"
    found = sorted(folder.glob("*__pred_mean.h5ad")) if folder.exists() else []
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(MAKE_PREDICTIONS), str(data), "--out-dir", str(folder)]
    command += ["--perturbation-key", perturbation_key]
    subprocess.run([*command, "--models", "mean"], check=True)
    return sorted(folder.glob("*__pred_mean.h5ad"))[0]


def measure(arguments: list[str], pythonpath: str | None, timeout: float) -> Measurement:
    """Run ``scperteval ARGUMENTS`` in a fresh interpreter; wall time and peak RSS."""
    # The program's entry point (a baseline from before it existed: ``main``).
    launcher = "import sys; from scperteval import cli; sys.argv[0] = 'scperteval'; "
    launcher += "sys.exit(getattr(cli, 'console_main', cli.main)())"
    command = [sys.executable, "-c", launcher, *arguments]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    out = Path(arguments[arguments.index("--out") + 1])
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    # ``python -c`` puts the working directory first on the import path: run from
    # the output's parent, so that a checkout in the current directory cannot
    # shadow ``--baseline``'s copy.
    measurement = measure_command(command, env, timeout, cwd=out.parent)
    run_json = out / "run.json"
    if measurement.returncode == 0 and run_json.exists():
        try:
            measurement.timings = json.loads(run_json.read_text()).get("timings_seconds", {})
        except (OSError, ValueError):
            measurement.timings = {}
    return measurement


def measure_command(
    command: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None
) -> Measurement:
    """Run ``command`` as a fresh process; its wall time and peak resident memory.

    Parameters
    ----------
    command
        The program and its arguments.
    env
        The environment of the process.
    timeout
        Seconds after which the process is killed; the measurement then has an
        infinite time, a NaN peak, return code -1 and the tail ``"timed out"``.
    cwd
        Working directory of the process (default: this one).

    Returns
    -------
    Measurement
        Wall seconds, peak RSS in GiB, return code and the tail of the output.

    """
    started = time.perf_counter()
    if Path("/usr/bin/time").exists():
        with tempfile.NamedTemporaryFile("r", suffix=".txt") as report:
            try:
                done = subprocess.run(
                    ["/usr/bin/time", "-v", "-o", report.name, *command],
                    env=env,
                    cwd=cwd,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                return Measurement(float("inf"), float("nan"), -1, tail="timed out")
            seconds = time.perf_counter() - started
            text = report.read()
        wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", text)
        peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        if wall:
            seconds = _clock_seconds(wall.group(1))
        peak_kib = int(peak.group(1)) if peak else 0
        returncode, tail = done.returncode, (done.stdout + done.stderr)[-2000:]
    else:
        # The child's own resource usage (its peak RSS, not the largest of all children).
        with tempfile.TemporaryFile("w+") as log:
            process = subprocess.Popen(
                command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT
            )
            watchdog = threading.Timer(timeout, process.kill)
            watchdog.start()
            _, status, usage = os.wait4(process.pid, 0)
            watchdog.cancel()
            seconds = time.perf_counter() - started
            returncode = os.waitstatus_to_exitcode(status)
            process.returncode = returncode
            log.seek(0)
            tail = log.read()[-2000:]
        if returncode < 0:
            return Measurement(float("inf"), float("nan"), returncode, tail="timed out")
        peak_kib = int(usage.ru_maxrss)
    return Measurement(seconds, peak_kib / 2**20, returncode, {}, tail)


def _clock_seconds(text: str) -> float:
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def case_arguments(
    dataset: str, data: Path, group: str, groups: dict[str, str], out: Path, workdir: Path
) -> list[str]:
    if group == "score":
        prediction = ensure_prediction(data, workdir)
        arguments = ["score", str(data), "--pred", f"mean={prediction}", "-p", "all"]
        arguments += ["--no-figures"]
    else:
        arguments = ["calibrate", str(data), "-p", groups[group]]
    if dataset == "norman":
        arguments += ["--perturbation-key", "condition", "--subset", "dataset=norman19"]
    else:
        arguments += ["--perturbation-key", "perturbation"]
    return [*arguments, "--out", str(out)]


def _fmt(value: float, digits: int = 1) -> str:
    if value != value:  # NaN
        return "-"
    if value == float("inf"):
        return "timeout"
    return f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="bench_out", help="datasets and outputs")
    parser.add_argument("--datasets", default="norman,S", help="norman, S and/or M")
    parser.add_argument("--groups", default=",".join(GROUPS), help="protocol groups to run")
    parser.add_argument("--norman-data", default=str(NORMAN))
    parser.add_argument("--s-data", default=None, help="use this S file")
    parser.add_argument("--m-data", default=None, help="use this M file")
    parser.add_argument("--score", action="store_true", help="also: score -p all on S")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (best kept)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument(
        "--baseline", default=None, metavar="PYTHONPATH", help="another copy to compare with"
    )
    parser.add_argument("--json", default=None, help="write the measurements here")
    args = parser.parse_args(argv)

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    groups = protocol_groups()
    chosen = [g.strip() for g in args.groups.split(",") if g.strip()]
    cases: list[tuple[str, str]] = []
    for dataset in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        for group in chosen:
            if dataset == "norman" and group != "all":
                continue  # the reference has Norman figures for the whole suite only
            if dataset == "M" and group not in ("centroid+de", "all"):
                continue
            cases.append((dataset, group))
        if dataset == "S" and args.score:
            cases.append(("S", "score"))

    files = {"norman": Path(args.norman_data).resolve()}
    for dataset, _ in cases:
        if dataset not in files:
            given = args.s_data if dataset == "S" else args.m_data
            files[dataset] = ensure_dataset(dataset, workdir, given)

    results: list[dict[str, Any]] = []
    for dataset, group in cases:
        data = files[dataset]
        ours: list[Measurement] = []
        theirs: list[Measurement] = []
        for _ in range(max(1, args.repeat)):
            out = workdir / "runs" / f"{dataset}_{group}"
            arguments = case_arguments(dataset, data, group, groups, out, workdir)
            ours.append(measure(arguments, None, args.timeout))
            if args.baseline:
                theirs.append(measure(arguments, args.baseline, args.timeout))
        best = min(ours, key=lambda m: m.seconds)
        reference = REFERENCE.get((dataset, group))
        row: dict[str, Any] = {
            "dataset": dataset,
            "group": group,
            "seconds": best.seconds,
            "peak_gib": best.peak_gib,
            "returncode": best.returncode,
            "timings": best.timings,
            "all_seconds": [m.seconds for m in ours],
        }
        if reference:
            row["reference_seconds"], row["reference_gib"], row["reference_note"] = reference
        if theirs:
            baseline = min(theirs, key=lambda m: m.seconds)
            row["baseline_seconds"] = baseline.seconds
            row["baseline_gib"] = baseline.peak_gib
        results.append(row)
        status = "" if best.returncode == 0 else f"  (exit {best.returncode}: {best.tail[-300:]})"
        print(
            f"{dataset:>6} {group:<12} {_fmt(best.seconds)} s  {_fmt(best.peak_gib, 2)} GiB"
            f"{status}",
            flush=True,
        )

    print()
    header = (
        f"{'dataset':<7} {'protocols':<12} {'wall s':>8} {'peak GiB':>9} {'load s':>7} "
        f"{'proto s':>8} | {'ref s':>7} {'ref GiB':>8} {'speed-up':>9} {'mem ratio':>9}"
    )
    if args.baseline:
        header += f" | {'base s':>8} {'base GiB':>8} {'vs base':>8}"
    print(header)
    print("-" * len(header))
    for row in results:
        timings = row["timings"]
        line = (
            f"{row['dataset']:<7} {row['group']:<12} {_fmt(row['seconds']):>8} "
            f"{_fmt(row['peak_gib'], 2):>9} {_fmt(timings.get('load', float('nan'))):>7} "
            f"{_fmt(timings.get('protocols', float('nan'))):>8} | "
        )
        if "reference_seconds" in row:
            bound = ">" if row["reference_note"].startswith(">") else ""
            speed = row["reference_seconds"] / row["seconds"]
            memory = row["peak_gib"] / row["reference_gib"]
            line += (
                f"{bound + _fmt(row['reference_seconds']):>7} {_fmt(row['reference_gib'], 2):>8} "
                f"{bound + _fmt(speed) + 'x':>9} {_fmt(memory, 2):>9}"
            )
        else:
            line += f"{'-':>7} {'-':>8} {'-':>9} {'-':>9}"
        if args.baseline:
            if "baseline_seconds" in row:
                line += (
                    f" | {_fmt(row['baseline_seconds']):>8} {_fmt(row['baseline_gib'], 2):>8} "
                    f"{_fmt(row['baseline_seconds'] / row['seconds']) + 'x':>8}"
                )
        print(line)
    notes = {row["reference_note"] for row in results if row.get("reference_note")}
    for note in sorted(notes):
        print(f"note: {note}")
    print(
        "speed-up = reference time / ours (higher is better); mem ratio = our peak / the "
        "reference's (lower is better). Wall time and peak RSS of the whole process."
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if all(r["returncode"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
