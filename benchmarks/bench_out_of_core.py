#!/usr/bin/env python
"""Benchmark: ``scperteval calibrate`` on a backed ``.h5ad`` larger than is sensible to load.

Generates once (into ``--workdir``, reused afterwards) a synthetic screen of
``--cells`` cells x ``--genes`` genes x ``--perts`` perturbations, written to the
``.h5ad`` file block by block so that the generator itself never holds the
matrix, then runs ``scperteval calibrate FILE -p PROTOCOLS --backed`` in a fresh
subprocess under ``/usr/bin/time -v`` and reports wall time, peak resident memory,
the run's own step timings and the size the expression matrix would have in memory
(CSR float32, dense float32, dense float64). ``--protocols`` is ``default`` (every
protocol of the default suite, population ones included, each population capped at
the default 2,000 cells), a group of ``bench_calibrate.py`` (``centroid+de``,
``energy+mmd``, ``sinkhorn``) or any protocol spec.

The generator follows the model of the shared ``make_dataset.py`` (negative
binomial counts around log-normal gene means, sparse per-perturbation effects
with a few strong perturbations, a knock-down of each perturbation's target, a
systematic shift of all perturbed cells, ``normalize_total(1e4)`` + ``log1p``),
but streams: that script builds the whole matrix in memory, about 10 GiB at a
million cells.

Example
-------
The default size (1,000,000 cells x 2,000 genes x 1,000 perturbations), every
protocol::

    python benchmarks/bench_out_of_core.py --workdir /work/bench_data

A screen-shaped case (300,000 cells x 8,000 genes x 5,000 perturbations of about
50 cells), centroid and DE protocols only::

    python benchmarks/bench_out_of_core.py --cells 300000 --genes 8000 --perts 5000 \
        --ctrl-cells 20000 --protocols centroid+de
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calibrate import Measurement, measure, protocol_groups  # noqa: E402

BLOCK_CELLS = 4096  # cells per generated block; each block has its own child seed


def screen_parameters(n_genes: int, n_perts: int, seed: int) -> dict[str, np.ndarray]:
    """Gene means, dispersions and each condition's expression profile.

    Row 0 of ``profile`` is control, row ``j + 1`` perturbation ``j``; rows sum to 1
    so that a perturbation changes composition, not sequencing depth.
    """
    rng = np.random.default_rng([seed, 1])
    base = np.exp(rng.normal(0.0, 2.0, n_genes))
    base /= base.sum()
    size = 3.0 * np.exp(rng.normal(0.0, 0.5, n_genes))
    # Targets among the better-expressed half (more genes when there are more
    # perturbations than that), so that their knock-down is visible.
    candidates = np.argsort(-base)[: min(n_genes, max(n_genes // 2, n_perts))]
    targets = np.sort(rng.choice(candidates, n_perts, replace=n_perts > n_genes))
    strong = rng.random(n_perts) < 0.1
    strength = np.where(strong, 1.0, rng.uniform(0.1, 0.4, n_perts))
    log_fold = np.zeros((n_perts + 1, n_genes))
    for j in range(n_perts):
        affected = rng.choice(n_genes, max(1, int(rng.uniform(0.02, 0.10) * n_genes)), False)
        log_fold[j + 1, affected] = rng.normal(0.0, 1.0, affected.size) * strength[j]
    log_fold[np.arange(1, n_perts + 1), targets] = np.log(rng.uniform(0.05, 0.3, n_perts))
    shifted = rng.choice(n_genes, int(0.2 * n_genes), replace=False)
    log_fold[1:, shifted] += rng.normal(0.0, 0.25, shifted.size)
    profile = base * np.exp(log_fold)
    profile /= profile.sum(axis=1, keepdims=True)
    return {"profile": profile, "size": size, "targets": targets, "strong": strong}


def cell_conditions(n_cells: int, n_control: int, n_perts: int, seed: int) -> np.ndarray:
    """Condition code of every cell (0 = control), in shuffled order."""
    rng = np.random.default_rng([seed, 2])
    weights = np.exp(rng.normal(0.0, 0.3, n_perts))
    n_perturbed = n_cells - n_control
    counts = 5 + np.floor((n_perturbed - 5 * n_perts) * weights / weights.sum()).astype(np.int64)
    counts[np.argsort(-weights)[: n_perturbed - counts.sum()]] += 1
    codes = np.concatenate(
        [np.zeros(n_control, np.int64), np.repeat(np.arange(1, n_perts + 1), counts)]
    )
    return codes[rng.permutation(codes.size)]


def generate_block(
    codes: np.ndarray, parameters: dict[str, np.ndarray], seed: int, block: int
) -> sp.csr_matrix:
    """Log-normalised expression of one block of cells (CSR float32)."""
    rng = np.random.default_rng([seed, 3, block])
    size = parameters["size"]
    library = 3000.0 * np.exp(rng.normal(0.0, 0.35, codes.size))
    rate = rng.gamma(size, 1.0 / size, (codes.size, size.size))
    rate *= parameters["profile"][codes]
    rate *= library[:, None]
    counts = sp.csr_matrix(rng.poisson(rate).astype(np.float32))
    del rate
    totals = np.asarray(counts.sum(axis=1)).ravel()
    scale = np.divide(1e4, totals, out=np.zeros_like(totals), where=totals > 0)
    counts.data *= np.repeat(scale.astype(np.float32), np.diff(counts.indptr))
    np.log1p(counts.data, out=counts.data)
    return counts


def write_screen(
    path: Path, n_cells: int, n_genes: int, n_perts: int, n_control: int, seed: int, threads: int
) -> None:
    """Write the synthetic screen to ``path`` block by block (atomically, via a temporary)."""
    import anndata as ad
    import h5py
    import pandas as pd
    from anndata.io import sparse_dataset, write_elem

    parameters = screen_parameters(n_genes, n_perts, seed)
    codes = cell_conditions(n_cells, n_control, n_perts, seed)
    labels = np.array(["control"] + [f"P{j}" for j in range(n_perts)], dtype=object)
    obs = pd.DataFrame(
        {"perturbation": pd.Categorical(labels[codes], categories=labels)},
        index=pd.Index([f"c{i}" for i in range(n_cells)]),
    )
    var = pd.DataFrame(index=pd.Index([f"G{g}" for g in range(n_genes)]))
    var["is_target"] = np.isin(np.arange(n_genes), parameters["targets"])
    skeleton = ad.AnnData(obs=obs, var=var)
    skeleton.uns["synthetic"] = {"seed": seed, "perts": n_perts, "ctrl_cells": n_control}
    partial = path.with_suffix(".partial.h5ad")
    skeleton.write_h5ad(partial)
    starts = list(range(0, n_cells, BLOCK_CELLS))
    started = time.perf_counter()
    with h5py.File(partial, "r+") as handle, ThreadPoolExecutor(max(1, threads)) as pool:
        matrix: Any = None
        # Bounded windows of blocks: generate in parallel, append in order.
        window = 2 * max(1, threads)
        for first in range(0, len(starts), window):
            batch = range(first, min(first + window, len(starts)))
            blocks = pool.map(
                lambda b: generate_block(
                    codes[starts[b] : starts[b] + BLOCK_CELLS], parameters, seed, b
                ),
                batch,
            )
            for block in blocks:
                if matrix is None:
                    # Large HDF5 chunks: appending and reading row ranges stay sequential.
                    write_elem(handle, "X", block, dataset_kwargs={"chunks": (1 << 20,)})
                    matrix = sparse_dataset(handle["X"])
                else:
                    matrix.append(block)
            done = min(starts[batch[-1]] + BLOCK_CELLS, n_cells)
            elapsed = time.perf_counter() - started
            print(f"\r  {done:,}/{n_cells:,} cells, {elapsed:.0f} s", end="", flush=True)
    print()
    partial.rename(path)


def matrix_sizes(path: Path) -> dict[str, float]:
    """Size of ``X`` in memory, in GiB: CSR float32 (int32 indices), dense float32 / float64."""
    import h5py

    with h5py.File(path, "r") as handle:
        n_cells, n_genes = (int(v) for v in handle["X"].attrs["shape"])
        nnz = int(handle["X"]["data"].shape[0])
    indptr_bytes = 8 * (n_cells + 1)
    return {
        "n_cells": n_cells,
        "n_genes": n_genes,
        "nnz": nnz,
        "density": nnz / (n_cells * n_genes),
        "csr_float32_gib": (nnz * (4 + 4) + indptr_bytes) / 2**30,
        "dense_float32_gib": n_cells * n_genes * 4 / 2**30,
        "dense_float64_gib": n_cells * n_genes * 8 / 2**30,
        "file_gib": path.stat().st_size / 2**30,
    }


def measure_on_cluster(arguments: list[str], n_workers: int, timeout: float) -> Measurement:
    """Run ``scperteval ARGUMENTS --scheduler`` against a fresh dask ``LocalCluster``.

    The cluster has ``n_workers`` worker processes of one thread each. The peak
    memory is the largest sum of resident sets, sampled every 0.5 s, over this
    process (which hosts the scheduler), the workers and the run: the whole
    footprint of the job on the machine.
    """
    import psutil
    from distributed import LocalCluster

    launcher = "import sys; from scperteval.cli import main; sys.argv[0] = 'scperteval'; "
    launcher += "sys.exit(main())"
    with LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        out = Path(arguments[arguments.index("--out") + 1])
        shutil.rmtree(out, ignore_errors=True)
        command = [sys.executable, "-c", launcher, *arguments]
        command += ["--scheduler", cluster.scheduler_address]
        me = psutil.Process()
        started = time.perf_counter()
        peak = 0
        with tempfile.TemporaryFile("w+") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            while process.poll() is None:
                if time.perf_counter() - started > timeout:
                    process.kill()
                    process.wait()
                    return Measurement(float("inf"), float("nan"), -1, tail="timed out")
                total = 0
                for member in [me, *me.children(recursive=True)]:
                    try:
                        total += member.memory_info().rss
                    except psutil.Error:
                        pass  # a process that ended between the listing and the reading
                peak = max(peak, total)
                time.sleep(0.5)
            seconds = time.perf_counter() - started
            log.seek(0)
            tail = log.read()[-2000:]
    measurement = Measurement(seconds, peak / 2**30, process.returncode, {}, tail)
    run_json = out / "run.json"
    if process.returncode == 0 and run_json.exists():
        measurement.timings = json.loads(run_json.read_text()).get("timings_seconds", {})
    return measurement


def same_values(mine: Path, theirs: Path) -> bool:
    """Whether two runs' ``results.parquet`` hold the same rows and bit-identical values."""
    import pandas as pd

    left, right = pd.read_parquet(mine), pd.read_parquet(theirs)
    keys = [c for c in left.columns if left[c].dtype == object or str(left[c].dtype) == "category"]
    left = left.sort_values(keys, ignore_index=True)
    right = right.sort_values(keys, ignore_index=True)
    try:
        pd.testing.assert_frame_equal(left, right, check_exact=True, check_categorical=False)
    except AssertionError as difference:
        print(f"values differ from {theirs}:\n{str(difference)[:1500]}")
        return False
    print(f"all {len(left):,} rows identical to {theirs}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/work/bench_data", help="dataset and outputs")
    parser.add_argument("--cells", type=int, default=1_000_000, help="all cells, controls included")
    parser.add_argument("--genes", type=int, default=2000)
    parser.add_argument("--perts", type=int, default=1000)
    parser.add_argument("--ctrl-cells", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="generator threads")
    parser.add_argument("--generate-only", action="store_true", help="write the file and stop")
    parser.add_argument("--chunk-cells", type=int, default=None, help="passed to calibrate")
    parser.add_argument(
        "--protocols",
        default="default",
        help="default, a protocol group (centroid+de, energy+mmd, sinkhorn) or a spec",
    )
    parser.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds for the run")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="N",
        help="run on a dask LocalCluster of N one-thread worker processes (peak memory is "
        "then the sum over this process, the cluster and the run, sampled every 0.5 s)",
    )
    parser.add_argument(
        "--compare-to",
        default=None,
        metavar="RUN_DIR",
        help="an earlier run's output folder: report whether every value is identical",
    )
    args = parser.parse_args(argv)
    # Checked before a generation or run of many minutes, not after.
    if args.cluster < 0:
        parser.error(
            f"--cluster must be 0 (a thread pool) or a number of workers, got {args.cluster}"
        )
    if args.compare_to and not (Path(args.compare_to) / "results.parquet").is_file():
        parser.error(f"--compare-to {args.compare_to}: no results.parquet there")

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    name = f"ooc_{args.cells}x{args.genes}x{args.perts}_c{args.ctrl_cells}_s{args.seed}.h5ad"
    data = workdir / name
    if not data.exists():
        print(f"generating {data}", flush=True)
        started = time.perf_counter()
        write_screen(
            data, args.cells, args.genes, args.perts, args.ctrl_cells, args.seed, args.threads
        )
        print(f"generated in {time.perf_counter() - started:.0f} s", flush=True)
    sizes = matrix_sizes(data)
    print(
        f"{data.name}: {sizes['n_cells']:,} cells x {sizes['n_genes']:,} genes, "
        f"nnz {sizes['nnz']:,} (density {sizes['density']:.3f}); X in memory: "
        f"CSR float32 {sizes['csr_float32_gib']:.2f} GiB, dense float32 "
        f"{sizes['dense_float32_gib']:.2f} GiB, dense float64 {sizes['dense_float64_gib']:.2f} "
        f"GiB; file {sizes['file_gib']:.2f} GiB",
        flush=True,
    )
    if args.generate_only:
        return 0

    protocols = protocol_groups().get(args.protocols, args.protocols)
    named = args.protocols == "default" or args.protocols in protocol_groups()
    label = args.protocols if named else "custom"
    where = f"_cluster{args.cluster}" if args.cluster else ""
    out = workdir / "runs" / f"{data.stem}_{label}{where}"
    arguments = ["calibrate", str(data), "-p", protocols, "--backed"]
    arguments += ["--perturbation-key", "perturbation", "--out", str(out)]
    if args.chunk_cells:
        arguments += ["--chunk-cells", str(args.chunk_cells)]
    if args.cluster:
        result = measure_on_cluster(arguments, args.cluster, args.timeout)
        where = f" on a {args.cluster}-worker LocalCluster"
    else:
        result = measure(arguments, None, args.timeout)
    print(
        f"calibrate -p {label} --backed{where}: {result.seconds:.1f} s wall, "
        f"peak RSS {result.peak_gib:.2f} GiB (exit {result.returncode})"
    )
    identical = None
    if args.compare_to and result.returncode == 0:
        identical = same_values(out / "results.parquet", Path(args.compare_to) / "results.parquet")
    if result.timings:
        print(
            "  run.json timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items())
        )
    if result.returncode != 0:
        print(result.tail)
    if args.json:
        figures = {
            **sizes,
            "seconds": result.seconds,
            "peak_gib": result.peak_gib,
            "returncode": result.returncode,
            "timings": result.timings,
            "protocols": protocols.split(","),
            "cluster_workers": args.cluster,
            "identical_to": args.compare_to if identical else None,
        }
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0 if result.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
