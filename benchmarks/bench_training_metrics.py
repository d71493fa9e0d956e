#!/usr/bin/env python
"""Benchmark: validation with ``PerturbationMetrics`` against writing predictions and scoring.

Without the training metric, a validation pass means writing the predicted cells to
an ``.h5ad`` file and calling ``scperteval.score(..., truth="all")`` on it. This
script times both on one simulated screen, interleaved ``--repeats`` times so that
load from other processes affects both alike, and prints the median times and
their ratio (score / metric). The metric's time is split into ``update`` (all cells,
in batches) and ``compute``; its one-off construction (DE, spaces) is shown apart,
since it is paid once per training run, not per epoch. The values of both are
compared as well (largest relative difference).

Examples
--------
::

    python benchmarks/bench_training_metrics.py
    python benchmarks/bench_training_metrics.py --threads 1
    python benchmarks/bench_training_metrics.py --perturbations 100 --genes 2000 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import scperteval
from scperteval.simulation import simulate_predictions
from scperteval.torch_backend import PerturbationMetrics

PROTOCOLS = (
    "pearson_delta_ctrl,pearson_delta_pert,r2_delta_pert,mse,mse_top_k,weighted_mse,"
    "weighted_r2_delta_pert,rank_full,nir,pds"
)


def main() -> None:
    """Run the comparison and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--perturbations", type=int, default=60)
    parser.add_argument("--genes", type=int, default=1000)
    parser.add_argument("--cells", type=int, default=50, help="cells per perturbation")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    adata = scperteval.simulate(
        n_perturbations=args.perturbations,
        n_genes=args.genes,
        cells_per_perturbation=args.cells,
        seed=0,
    )
    prediction = simulate_predictions(adata, "scaled_effect", scale=0.5, noise=0.3, seed=1)
    values = np.asarray(
        prediction.X.toarray() if hasattr(prediction.X, "toarray") else prediction.X
    )
    labels = prediction.obs["perturbation"].astype(str).to_numpy()
    context = scperteval.Context(scperteval.load_dataset(adata))

    started = time.perf_counter()
    metric = PerturbationMetrics.from_context(context, PROTOCOLS).to(args.device)
    build = time.perf_counter() - started
    index = metric.condition_index(labels).to(args.device)
    cells = torch.as_tensor(values, device=args.device)

    timings: dict[str, list[float]] = {"update": [], "compute": [], "score": []}
    largest = 0.0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.h5ad"
        for _ in range(args.repeats):
            metric.reset()
            started = time.perf_counter()
            for rows in torch.arange(cells.shape[0], device=args.device).split(args.batch):
                metric.update(cells[rows], index[rows])
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            timings["update"].append(time.perf_counter() - started)
            started = time.perf_counter()
            found = metric.compute()
            timings["compute"].append(time.perf_counter() - started)

            started = time.perf_counter()
            prediction.write_h5ad(path)
            table = scperteval.score(
                adata,
                {"model": path},
                protocols=PROTOCOLS,
                truth="all",
                baselines=False,
                progress=False,
                figures=False,
            ).results
            timings["score"].append(time.perf_counter() - started)
        for name, result in found.items():
            rows = table[table["protocol"] == name].set_index("perturbation")["value"]
            expected = rows.reindex(result.values.index).to_numpy()
            defined = np.isfinite(expected)
            gap = np.abs(result.values.to_numpy()[defined] - expected[defined])
            scale = np.maximum(np.abs(expected[defined]), 1e-12)
            largest = max(largest, float((gap / scale).max(initial=0.0)))

    median = {key: statistics.median(times) for key, times in timings.items()}
    metric_time = median["update"] + median["compute"]
    print(
        f"{args.perturbations} perturbations x {args.genes} genes, {cells.shape[0]} cells, "
        f"device {args.device}, {torch.get_num_threads()} torch thread(s), {len(found)} protocols"
    )
    print(f"metric construction (once):  {build:8.3f} s")
    print(f"metric update (all batches): {median['update']:8.3f} s")
    print(f"metric compute:              {median['compute']:8.3f} s")
    print(f"write + score --truth all:   {median['score']:8.3f} s")
    print(f"ratio score / metric per epoch: {median['score'] / metric_time:.1f}x")
    print(f"largest relative difference of the values: {largest:.1e}")


if __name__ == "__main__":
    main()
