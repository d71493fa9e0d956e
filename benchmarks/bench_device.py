#!/usr/bin/env python
"""Benchmark: population protocols with NumPy on the CPU against torch on a device.

Runs ``scperteval.calibrate`` with the population protocols of the ``default``
suite (energy distance, MMD and Sinkhorn, in top-k and PCA spaces) on one dataset,
once per backend:

- ``numpy``: the reference path (NumPy and numba on the CPU, Sinkhorn with torch on
  the CPU), with ``--cpu-workers`` threads;
- ``DEVICE float64`` and ``DEVICE float32``: the same protocols with
  ``device=DEVICE`` (``cuda`` by default; ``cpu`` works anywhere), with
  ``--device-workers`` threads feeding it.

Everything before the protocols (reading, group statistics, DE, samples, the PCA
fit) is shared by the backends and computed by each run alike; the table shows the
protocols' own time (``timings_seconds['protocols']``) next to the total, the
speed-up of each backend over NumPy (energy distance + MMD, and Sinkhorn, apart),
and the largest difference of its values from NumPy's, per protocol: relative to
the value, and relative to the protocol's scale (the median absolute value over
perturbations and controls), which stays meaningful for the unbiased estimates
that sit near zero.

The dataset is generated with ``../shared/bench/make_dataset.py`` when no file is
given (``--cells/--genes/--perts``, default the S size: 20,000 perturbed cells x
2,000 genes x 100 perturbations).

Examples
--------
On a machine with a GPU, writing the tables to ``out/``::

    python benchmarks/bench_device.py --out out

A quick check of the code path on any machine::

    python benchmarks/bench_device.py --device cpu --cells 2000 --genes 300 --perts 10
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
MAKE_DATASET_CANDIDATES = (
    REPO.parent / "shared" / "bench" / "make_dataset.py",
    REPO / "shared" / "bench" / "make_dataset.py",
)


def population_protocols() -> list[str]:
    """Names of the ``default`` suite's population protocols."""
    from scperteval.engine.suites import resolve_protocols

    return [p.name for p in resolve_protocols("default") if p.representation == "population"]


def protocol_groups(protocols: list[str]) -> dict[str, list[str]]:
    """The population protocols split into energy distance + MMD, and Sinkhorn."""
    sinkhorn = [name for name in protocols if name.startswith("sinkhorn")]
    return {
        "energy+mmd": [name for name in protocols if name not in sinkhorn],
        "sinkhorn": sinkhorn,
    }


def ensure_dataset(args: argparse.Namespace) -> Path:
    """The dataset file: the one given, or one generated into ``--workdir``."""
    if args.data:
        return Path(args.data)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"bench_{args.cells}x{args.genes}x{args.perts}.h5ad"
    if path.exists():
        return path
    script = next((p for p in MAKE_DATASET_CANDIDATES if p.exists()), None)
    if script is None:
        raise SystemExit("make_dataset.py not found: give a dataset with --data")
    command = [
        sys.executable,
        str(script),
        "--cells",
        str(args.cells),
        "--genes",
        str(args.genes),
        "--perts",
        str(args.perts),
        "--ctrl-cells",
        str(max(args.cells // 10, 100)),
        "--out",
        str(path),
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True)
    print(f"generated {path} in {time.perf_counter() - started:.1f} s", flush=True)
    return path


def run_backend(
    data: Path,
    protocols: list[str],
    device: str | None,
    precision: str,
    workers: int,
    subset: dict[str, list[str]] | None = None,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Calibrate the protocols on one backend; the results and the run's timings."""
    import scperteval

    started = time.perf_counter()
    result = scperteval.calibrate(
        str(data),
        protocols=protocols,
        subset=subset,
        device=device,
        precision=precision,
        workers=workers,
        progress=False,
    )
    timings = dict(result.info["timings_seconds"])
    timings["total"] = time.perf_counter() - started
    return result.results, timings


def value_differences(reference: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Per protocol: largest difference from the reference, relative and scaled."""
    keys = ["protocol", "covariate", "perturbation", "source", "source_name"]
    joined = reference.merge(other, on=keys, suffixes=("_ref", "_other"))
    if len(joined) != len(reference):
        raise AssertionError("the backends scored different sets of values")
    rows = []
    for protocol, group in joined.groupby("protocol"):
        ref = group["value_ref"].to_numpy(dtype=float)
        val = group["value_other"].to_numpy(dtype=float)
        both = np.isfinite(ref) & np.isfinite(val)
        same_nan = bool((np.isnan(ref) == np.isnan(val)).all())
        diff = np.abs(ref[both] - val[both])
        scale = float(np.median(np.abs(ref[both]))) if both.any() else float("nan")
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = diff / np.abs(ref[both])
        rows.append(
            {
                "protocol": protocol,
                "values": int(both.sum()),
                "same_nans": same_nan,
                "max_rel_diff": float(np.nanmax(relative)) if diff.size else float("nan"),
                "max_diff_over_scale": float(diff.max() / scale) if diff.size and scale else 0.0,
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) its tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="an .h5ad file (default: generate one)")
    parser.add_argument("--workdir", default=os.environ.get("TMPDIR", "/tmp"))
    parser.add_argument("--cells", type=int, default=20_000)
    parser.add_argument("--genes", type=int, default=2_000)
    parser.add_argument("--perts", type=int, default=100)
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    parser.add_argument("--cpu-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device-workers", type=int, default=4)
    parser.add_argument("--skip-float32", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print where device runs spend time")
    parser.add_argument("--out", help="folder for device_times.csv and device_values.csv")
    args = parser.parse_args(argv)

    import torch

    data = ensure_dataset(args)
    protocols = population_protocols()
    environment = {
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_count": os.cpu_count(),
        "data": str(data),
        "protocols": protocols,
    }
    print(json.dumps(environment), flush=True)
    cases: list[tuple[str, str | None, str, int]] = [
        ("numpy", None, "float64", args.cpu_workers),
        (f"{args.device} float64", args.device, "float64", args.device_workers),
    ]
    if not args.skip_float32:
        cases.append((f"{args.device} float32", args.device, "float32", args.device_workers))
    # Compile numba kernels and start CUDA before timing: a small subset per backend.
    import anndata

    labels = anndata.read_h5ad(data, backed="r").obs["perturbation"].astype(str)
    warm_subset = {"perturbation": sorted(set(labels))[:3] + ["control"]}
    for _, device, precision, workers in cases:
        run_backend(data, protocols, device, precision, workers, subset=warm_subset)
    time_rows: list[dict[str, Any]] = []
    value_tables = []
    for group, names in protocol_groups(protocols).items():
        results: dict[str, pd.DataFrame] = {}
        for label, device, precision, workers in cases:
            table, timings = run_backend(data, names, device, precision, workers)
            results[label] = table
            time_rows.append(
                {
                    "group": group,
                    "backend": label,
                    "workers": workers,
                    "protocols_s": timings.get("protocols", float("nan")),
                    "total_s": timings["total"],
                }
            )
            print(f"{time_rows[-1]}", flush=True)
        if args.profile:
            # One thread, so that the profile sees the work rather than a pool's waiting.
            profiler = cProfile.Profile()
            profiler.enable()
            run_backend(data, names, args.device, "float64", 1)
            profiler.disable()
            print(f"profile of {group} on {args.device} float64, one thread:")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
        for label, table in list(results.items())[1:]:
            differences = value_differences(results["numpy"], table)
            differences.insert(0, "backend", label)
            value_tables.append(differences)
    times = pd.DataFrame(time_rows)
    numpy_seconds = times[times["backend"] == "numpy"].set_index("group")["protocols_s"]
    times["speedup_protocols"] = times["group"].map(numpy_seconds) / times["protocols_s"]
    values = pd.concat(value_tables, ignore_index=True)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(times.to_string(index=False))
        print(values.to_string(index=False))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        times.to_csv(out / "device_times.csv", index=False)
        values.to_csv(out / "device_values.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
