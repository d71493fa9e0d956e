#!/usr/bin/env python
"""Benchmark: scoring with the truth's DE read from an earlier run vs computed.

On one dataset (the Norman subset of the shared development file by default,
or any ``.h5ad`` with ``--data``), in one process:

1. ``scperteval.de`` of the truth half (the DE a calibrated run uses), written
   to a folder once, outside the timings;
2. ``scperteval.score`` of one model (the truth cells with multiplicative noise)
   on DE-dependent protocols, ``--repeat`` times with the DE computed and the
   same number of times with ``de_tables=`` the folder, interleaved; the best
   and median wall times of each, and their ratio.

Both runs' result tables must be identical value for value (checked and
printed); the DE method is ``--method`` (Wilcoxon by default, where reading the
table saves the most: it reads every perturbation's cells).

Example::

    python benchmarks/bench_precomputed_de.py --method wilcoxon --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

import scperteval

NORMAN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "perturbench_devel.h5ad"
PROTOCOLS = "de_auprc,de_auroc,de_topk_overlap,weighted_mse,mse_top_k,pearson_delta_ctrl_top_k"
KEYS = ["protocol", "covariate", "perturbation", "source", "source_name"]


def _truth_and_model(path: Path, key: str, subset: str | None) -> tuple[ad.AnnData, ad.AnnData]:
    truth = ad.read_h5ad(path)
    if subset:
        column, value = subset.split("=", 1)
        truth = truth[truth.obs[column].astype(str) == value].copy()
    model = truth[truth.obs[key] != "control"].copy()
    dense = model.X.toarray() if sp.issparse(model.X) else np.asarray(model.X)
    model.X = dense * np.random.default_rng(0).lognormal(0.0, 0.2, dense.shape)
    return truth, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(NORMAN))
    parser.add_argument("--perturbation-key", default="condition")
    parser.add_argument("--subset", default="dataset=norman19")
    parser.add_argument("--method", default="wilcoxon")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    truth, model = _truth_and_model(Path(args.data), args.perturbation_key, args.subset)
    options = {"perturbation_key": args.perturbation_key, "de_method": args.method}
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        scperteval.de(
            truth,
            perturbation_key=args.perturbation_key,
            method=args.method,
            half="truth",
            out=Path(folder) / "de",
        )
        de_seconds = time.perf_counter() - started
        timings: dict[str, list[float]] = {"computed": [], "read": []}
        tables: dict[str, pd.DataFrame] = {}
        for _ in range(args.repeat):
            for kind in ("computed", "read"):
                extra = {"de_tables": Path(folder) / "de"} if kind == "read" else {}
                started = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = scperteval.score(
                        truth,
                        {"model": model},
                        PROTOCOLS,
                        baselines=False,
                        figures=False,
                        progress=False,
                        **options,
                        **extra,
                    )
                timings[kind].append(time.perf_counter() - started)
                tables[kind] = result.results.sort_values(KEYS).reset_index(drop=True)
    same = tables["computed"].equals(tables["read"])
    print(f"data: {args.data} ({truth.n_obs} cells x {truth.n_vars} genes), DE {args.method}")
    print(f"scperteval de --half truth, written once: {de_seconds:.2f} s")
    print(f"{'score':<10} {'best s':>8} {'median s':>9}")
    for kind, values in timings.items():
        print(f"{kind:<10} {min(values):>8.2f} {statistics.median(values):>9.2f}")
    print(f"ratio computed / read (best): {min(timings['computed']) / min(timings['read']):.2f}x")
    print(f"identical result tables: {same}")


if __name__ == "__main__":
    main()
