#!/usr/bin/env python
"""Benchmark: ``calibrate`` on a thread pool versus a local dask cluster.

Simulates a screen (``scperteval.simulate``), then runs ``calibrate`` on it with
``--workers`` threads and with a ``LocalCluster`` of as many single-threaded worker
processes, alternately (``--repeats`` times each, so that load from other processes
affects both alike), and prints the steps' wall times from ``run.json``'s timings:
``group_statistics`` (the pass over the matrix) and ``protocols``. The first cluster
run includes the workers' imports and their first-time derived data; it is shown
apart. Results are compared at the end (equal up to BLAS rounding, see
``docs/distributed.md``).

Example::

    python benchmarks/bench_distributed.py --perturbations 60 --cells 200 --genes 1000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from scperteval import Dataset, calibrate, simulate

PROTOCOLS = "pearson_delta_ctrl,mse_top_k,de_topk_overlap,energy_pca,rank_full"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--perturbations", type=int, default=40)
    parser.add_argument("--cells", type=int, default=150, help="cells per perturbation")
    parser.add_argument("--genes", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-cells", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--protocols", default=PROTOCOLS)
    args = parser.parse_args()

    from distributed import Client, LocalCluster

    adata = simulate(
        n_perturbations=args.perturbations,
        cells_per_perturbation=args.cells,
        n_genes=args.genes,
        n_covariates=2,
        seed=0,
    )
    print(f"{adata.n_obs} cells x {adata.n_vars} genes; protocols {args.protocols}")

    def run(**executor: object) -> tuple[float, dict[str, float], object]:
        dataset = Dataset(adata, covariate_key="cell_line", chunk_cells=args.chunk_cells)
        started = time.perf_counter()
        result = calibrate(dataset, protocols=args.protocols, progress=False, **executor)
        return time.perf_counter() - started, result.info["timings_seconds"], result

    started = time.perf_counter()
    cluster = LocalCluster(
        n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
    )
    client = Client(cluster)
    print(f"cluster started in {time.perf_counter() - started:.1f} s")
    first, steps, _ = run(executor=client)
    print(f"first cluster run {first:.1f} s (protocols {steps['protocols']:.1f} s)")
    rows = []
    for _ in range(args.repeats):
        for label, options in (
            ("threads", {"workers": args.workers}),
            ("cluster", {"executor": client}),
        ):
            total, steps, result = run(**options)
            rows.append((label, total, steps["group_statistics"], steps["protocols"], result))
    print(f"{'run':<8} {'total s':>8} {'group stats s':>14} {'protocols s':>12}")
    for label, total, stats_time, protocol_time, _ in rows:
        print(f"{label:<8} {total:>8.2f} {stats_time:>14.2f} {protocol_time:>12.2f}")
    local = next(r[4] for r in rows if r[0] == "threads").results["value"].to_numpy()
    remote = next(r[4] for r in rows if r[0] == "cluster").results["value"].to_numpy()
    scale = np.nanmax(np.abs(local))
    print(
        f"largest difference {np.nanmax(np.abs(local - remote)) / scale:.1e} of the largest value"
    )
    client.close()
    cluster.close()


if __name__ == "__main__":
    main()
