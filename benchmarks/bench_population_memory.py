#!/usr/bin/env python
"""Benchmark: memory and time of population protocols on one very large perturbation.

Builds (once, into ``--workdir``) a screen of 21,150 cells x 1,000 genes: one
perturbation of 20,000 cells, 19 of 50 cells and 200 control cells, from the
package's own simulation (:func:`scperteval.simulation.simulate` gives the 19
small perturbations, the controls and the first 50 cells of the large one; the
large one's other cells are drawn from the same negative-binomial model and the
same expression profile). Energy distance, MMD and Sinkhorn on the large
perturbation compare a 10,000-cell truth half with a 10,000-cell duplicate.

Then runs ``scperteval calibrate DATA -p default --workers 2`` twice in fresh
processes: with ``--max-population-cells all`` (before: every cell) and with the
default cap (after). Each run's peak resident memory is sampled every 20 ms over
the process and its children (psutil) and read from the kernel for the process
itself when it exits (``wait4``); the larger is reported, with the wall time and the
CPU time (user + system, from ``wait4``; less sensitive than the wall time to other
work on a shared machine). A "before" run that
outlives ``--timeout`` is killed: its time is then a lower bound, and so is its
peak. The machine's load average is printed with the figures, since the cores may
be shared.

Example::

    python benchmarks/bench_population_memory.py --workdir /tmp/bench_population
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

LARGE_CELLS = 20_000
SMALL_CELLS = 50
N_PERTURBATIONS = 20
N_CONTROL = 200
N_GENES = 1000
SEED = 0


def build_dataset(path: Path) -> Path:
    """Write the benchmark's screen to ``path`` (kept if it exists)."""
    if path.exists():
        return path
    import anndata as ad
    import pandas as pd

    from scperteval.simulation import simulate

    base = simulate(
        n_perturbations=N_PERTURBATIONS,
        n_genes=N_GENES,
        cells_per_perturbation=SMALL_CELLS,
        n_control_cells=N_CONTROL,
        seed=SEED,
    )
    truth = base.uns["simulation"]
    parameters = truth["parameters"]
    large = str(truth["conditions"]["perturbation"][1])
    profile = np.asarray(truth["profiles"][1], dtype=np.float64)
    proportions = np.expm1(profile) / parameters["normalized_total"]
    proportions /= proportions.sum()
    extra = _sample_cells(
        proportions,
        LARGE_CELLS - SMALL_CELLS,
        parameters["library_size"],
        parameters["library_size_sd"],
        parameters["dispersion"],
        np.random.default_rng([SEED, 20_000]),
    )
    obs = pd.DataFrame(
        {
            "perturbation": pd.Categorical(
                [large] * extra.shape[0], categories=base.obs["perturbation"].cat.categories
            )
        },
        index=[f"extra{i}" for i in range(extra.shape[0])],
    )
    small = ad.AnnData(X=base.X, obs=base.obs[["perturbation"]].copy(), var=base.var.copy())
    combined = ad.concat([small, ad.AnnData(X=extra, obs=obs, var=base.var.copy())])
    path.parent.mkdir(parents=True, exist_ok=True)
    combined.write_h5ad(path)
    return path


def _sample_cells(
    proportions: np.ndarray,
    n_cells: int,
    library_size: float,
    library_sd: float,
    dispersion: float,
    rng: np.random.Generator,
) -> sp.csr_matrix:
    """Log-normalised cells of one profile, as :func:`simulate` draws them."""
    library = library_size * np.exp(rng.normal(-0.5 * library_sd**2, library_sd, n_cells))
    blocks = []
    for start in range(0, n_cells, 2048):
        size = min(2048, n_cells - start)
        mean = library[start : start + size, None] * proportions[None, :]
        if dispersion > 0:
            mean = mean * rng.gamma(1.0 / dispersion, dispersion, mean.shape)
        counts = rng.poisson(mean).astype(np.float64)
        totals = np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
        blocks.append(sp.csr_matrix(np.log1p(1e4 * counts / totals).astype(np.float32)))
    return sp.vstack(blocks, format="csr")


@dataclass
class Run:
    """One measured run."""

    seconds: float
    cpu_seconds: float
    peak_bytes: int
    timed_out: bool
    returncode: int
    tail: str


def _tree_rss(process: object) -> int:
    import psutil

    assert isinstance(process, psutil.Process)
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            continue
    return total


def measure(arguments: list[str], timeout: float) -> Run:
    """Run ``scperteval ARGUMENTS`` in a fresh interpreter: wall time and peak RSS."""
    import psutil

    launcher = "import sys; from scperteval.cli import main; sys.argv[0] = 'scperteval'; "
    launcher += "sys.exit(main())"
    log_path = Path(arguments[arguments.index("--out") + 1] + ".log")
    peak = 0
    stop = threading.Event()
    started = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", launcher, *arguments], stdout=log, stderr=subprocess.STDOUT
        )
        watched = psutil.Process(child.pid)

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                try:
                    peak = max(peak, _tree_rss(watched))
                except psutil.Error:
                    return
                stop.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        timed_out = False
        watchdog = threading.Timer(timeout, child.kill)
        watchdog.start()
        _, status, usage = os.wait4(child.pid, 0)
        watchdog.cancel()
        seconds = time.perf_counter() - started
        stop.set()
        sampler.join()
        child.returncode = os.waitstatus_to_exitcode(status)
        timed_out = child.returncode < 0 and seconds >= timeout
    peak = max(peak, int(usage.ru_maxrss) * 1024)
    cpu = float(usage.ru_utime + usage.ru_stime)
    return Run(seconds, cpu, peak, timed_out, child.returncode, log_path.read_text()[-1500:])


def main() -> int:
    """Build the data, run before and after, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_population_memory"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument(
        "--before-timeout", type=float, default=None, help="seconds for the uncapped run"
    )
    parser.add_argument("-p", "--protocols", default="default", help="protocols (-p)")
    parser.add_argument("--skip-before", action="store_true", help="only the capped run")
    args = parser.parse_args()

    data = build_dataset(args.workdir / "large_population.h5ad")
    print(f"data: {data} ({data.stat().st_size / 2**20:.0f} MiB on disk)")
    print(f"cells: {LARGE_CELLS} + {N_PERTURBATIONS - 1} x {SMALL_CELLS} + {N_CONTROL} controls")
    common = ["calibrate", str(data), "-p", args.protocols, "--workers", str(args.workers)]
    print(f"scperteval {' '.join(common)}")
    before_timeout = args.timeout if args.before_timeout is None else args.before_timeout
    cases = [("after (default cap)", [], args.timeout)]
    if not args.skip_before:
        cases.insert(0, ("before (no cap)", ["--max-population-cells", "all"], before_timeout))
    runs: dict[str, Run] = {}
    for label, extra, timeout in cases:
        out = args.workdir / ("out_" + label.split()[0])
        shutil.rmtree(out, ignore_errors=True)
        load = os.getloadavg()[0]
        run = measure([*common, *extra, "--out", str(out)], timeout)
        runs[label] = run
        bound = ">= " if run.timed_out else ""
        status = "timed out" if run.timed_out else f"exit {run.returncode}"
        print(
            f"{label:<22} wall {bound}{run.seconds:7.1f} s   cpu {bound}{run.cpu_seconds:7.1f} s"
            f"   peak RSS {bound}"
            f"{run.peak_bytes / 2**30:6.2f} GiB   ({status}; load average {load:.2f} "
            f"on {os.cpu_count()} cores at start)",
            flush=True,
        )
        if run.returncode != 0 and not run.timed_out:
            print(run.tail)
    if len(runs) == 2 and runs["after (default cap)"].timed_out:
        print("ratio before/after: not defined, the capped run timed out too")
    elif len(runs) == 2:
        before, after = runs["before (no cap)"], runs["after (default cap)"]
        bound = ">= " if before.timed_out else ""
        print(
            f"ratio before/after: wall {bound}{before.seconds / after.seconds:.1f}x, "
            f"cpu {bound}{before.cpu_seconds / after.cpu_seconds:.1f}x, "
            f"peak RSS {bound}{before.peak_bytes / after.peak_bytes:.1f}x"
        )
    after = runs["after (default cap)"]
    target = after.peak_bytes < 1.5 * 2**30 and after.seconds < 60
    print(f"target (after < 1.5 GiB and < 60 s): {'met' if target else 'not met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
