#!/usr/bin/env python
"""Benchmark: scoring and calibrating under a 5-fold split vs the same runs without one.

On one dataset (``S`` of the benchmark data by default, or any ``.h5ad`` with
``--data``), in one process: ``scperteval.score`` of one model (the truth cells
with multiplicative noise) and the built-in baselines, and ``scperteval.calibrate``,
each without a split and under a seeded ``--folds``-fold split of the
perturbations, interleaved ``--repeat`` times. Printed per command: the best wall
time of each, their ratio (the target for ``score`` is at most 2: the truth's
statistics are computed once, not once per fold) and the time the split run
spends on its own steps. Both commands under a split also calibrate the data
without it, in the same run, to state the verdicts the split changes.

Example::

    python benchmarks/bench_split.py --repeat 2
    python benchmarks/bench_split.py --commands calibrate --repeat 3
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import scipy.sparse as sp

import scperteval
from scperteval.splits.split import Split

S_DATA = Path("/work/bench_data/S.h5ad")
PROTOCOLS = "pearson_delta_ctrl,mse,weighted_mse,mse_top_k,rank_full,energy_pca,de_topk_overlap"


def _truth_and_model(path: Path, key: str) -> tuple[ad.AnnData, ad.AnnData]:
    truth = ad.read_h5ad(path)
    model = truth[truth.obs[key] != "control"].copy()
    dense = model.X.toarray() if sp.issparse(model.X) else np.asarray(model.X)
    model.X = dense * np.random.default_rng(0).lognormal(0.0, 0.2, dense.shape)
    return truth, model


def _split(truth: ad.AnnData, key: str, folds: int, seed: int) -> Split:
    labels = sorted(set(truth.obs[key].astype(str)) - {"control"})
    order = np.random.default_rng(seed).permutation(len(labels))
    fold_of = {("all", labels[i]): str(rank % folds) for rank, i in enumerate(order)}
    return Split.from_folds(fold_of, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(S_DATA))
    parser.add_argument("--perturbation-key", default="perturbation")
    parser.add_argument("--protocols", default=PROTOCOLS)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--commands",
        default="score,calibrate",
        help="comma-separated: score, calibrate (default: both)",
    )
    args = parser.parse_args()
    unknown = set(args.commands.split(",")) - {"score", "calibrate"}
    if unknown:
        parser.error(f"unknown command(s) {sorted(unknown)}; choose score, calibrate")
    truth, model = _truth_and_model(Path(args.data), args.perturbation_key)
    split = _split(truth, args.perturbation_key, args.folds, args.seed)
    options = {
        "protocols": args.protocols,
        "perturbation_key": args.perturbation_key,
        "figures": False,
        "progress": False,
    }
    for command in args.commands.split(","):
        _compare(command, truth, model, split, options, args)


def _compare(
    command: str,
    truth: ad.AnnData,
    model: ad.AnnData,
    split: Split,
    options: dict[str, object],
    args: argparse.Namespace,
) -> None:
    """Time one command without and under the split, interleaved, and print the ratio."""
    timings: dict[str, list[float]] = {"unsplit": [], "split": []}
    steps: dict[str, float] = {}
    for _ in range(args.repeat):
        for kind in ("unsplit", "split"):
            extra = {"split": split} if kind == "split" else {}
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if command == "score":
                    result = scperteval.score(truth, {"noisy": model}, **options, **extra)
                else:
                    # calibrate draws no figures.
                    plain = {k: v for k, v in options.items() if k != "figures"}
                    result = scperteval.calibrate(truth, **plain, **extra)
            timings[kind].append(time.perf_counter() - started)
            if kind == "split":
                steps = result.info["timings_seconds"]
    best = {kind: min(values) for kind, values in timings.items()}
    print(
        f"{command}: {args.data}, {truth.n_obs} cells, {args.folds} folds, "
        f"protocols {args.protocols}"
    )
    for kind, seconds in best.items():
        runs = ", ".join(f"{t:.2f}" for t in timings[kind])
        print(f"  {kind:8s} best {seconds:8.2f} s  (runs: {runs})")
    target = " (target <= 2x)" if command == "score" else ""
    print(f"  split / unsplit: {best['split'] / best['unsplit']:.2f}x{target}")
    print(
        "  split run steps: "
        + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in steps.items())
    )


if __name__ == "__main__":
    main()
