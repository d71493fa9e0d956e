#!/usr/bin/env python
"""Compare :mod:`scperteval.distances` with pertpy 1.0.3's ``Distance`` and ``DistanceTest``.

pertpy is installed into its own virtual environment under ``--workdir`` (once, then
reused): ``torch==2.13.0`` first, so that pip keeps the CPU wheel, then
``pertpy==1.0.3`` and ``statsmodels<0.15`` (pertpy 1.0.3 imports a function that
statsmodels 0.15 removed). pertpy always runs as ``python -I`` in that environment.

Both tools read the same files, written once to ``--workdir``: the ``norman19``
cells of the shared development file and, with ``--datasets norman,S``, the shared
generator's S dataset (22,000 cells), each with ``obsm["X_pca"]`` (the first 50
principal axes, computed here) so that both measure in one embedding.

- **Values** (``--agreement``): ``onesided`` to the control for every distance pertpy
  has, with the option that aligns a definition where the two differ (the
  ``ours`` column), and the largest relative difference over the groups. Rows
  marked ``differs`` are different by definition (the reason is printed).
- **Cost** (``--cost``): ``onesided`` and ``pairwise`` edistance in a fresh process
  each, under ``/usr/bin/time -v`` (else ``os.wait4``): wall time and peak resident
  memory side by side, with the ratios pertpy / ours (time) and ours / pertpy
  (memory). With ``--permutations N``, our ``permutation_test`` over every group
  with ``N`` permutations is timed too (pertpy's ``DistanceTest`` runs with
  ``--pertpy-permutations``, 0 to skip it).

Examples
--------
Values and cost on Norman (a few minutes, most of it pertpy)::

    python benchmarks/compare_pertpy.py

Cost on S, with 1,000 permutations over its 100 groups::

    python benchmarks/compare_pertpy.py --datasets S --no-agreement --permutations 1000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_calibrate import NORMAN, ensure_dataset, measure_command  # noqa: E402

PERTPY_REQUIREMENTS = ("pertpy==1.0.3", "statsmodels<0.15")
PERTPY_VERSION = "1.0.3"
TORCH_REQUIREMENT = "torch==2.13.0"
DEFAULT_WORKDIR = Path.home() / ".cache" / "scperteval-bench"

#: (pertpy metric, pertpy's Distance(...) options, options of its call, our spec, why
#: the two differ or ""). A ``layer_key`` option reads that layer in both tools.
AGREEMENT: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    ("edistance", {}, {}, "edistance", ""),
    (
        "edistance",
        {"cell_wise_metric": "sqeuclidean"},
        {},
        "edistance(cell_wise_metric='sqeuclidean')",
        "",
    ),
    ("euclidean", {}, {}, "euclidean", ""),
    ("root_mean_squared_error", {}, {}, "root_mean_squared_error(pertpy=True)", ""),
    (
        "root_mean_squared_error",
        {},
        {},
        "root_mean_squared_error",
        "differs: pertpy returns |mx - my|, ours divides by sqrt(d)",
    ),
    ("mse", {}, {}, "mse", ""),
    ("mean_absolute_error", {}, {}, "mean_absolute_error", ""),
    ("pearson_distance", {}, {}, "pearson_distance", ""),
    ("spearman_distance", {}, {}, "spearman_distance", ""),
    ("kendalltau_distance", {}, {}, "kendalltau_distance", ""),
    ("cosine_distance", {}, {}, "cosine_distance", ""),
    ("r2_distance", {}, {}, "r2_distance", ""),
    ("mean_pairwise", {}, {}, "mean_pairwise", ""),
    ("mmd", {}, {}, "mmd(pertpy=True)", ""),
    ("mmd", {}, {"kernel": "rbf", "gamma": 0.01}, "mmd(gamma=0.01, unbiased=False)", ""),
    (
        "mmd",
        {},
        {"kernel": "poly", "gamma": 0.01},
        "mmd(kernel='poly', pertpy=True, gamma=0.01)",
        "",
    ),
    ("sym_kldiv", {}, {}, "sym_kldiv", ""),
    ("t_test", {}, {}, "t_test", ""),
    ("ks_test", {}, {}, "ks_test", ""),
    ("mahalanobis", {}, {}, "mahalanobis(pertpy=True)", ""),
    ("mean_var_distribution", {"layer_key": "logexpr"}, {}, "mean_var_distribution", ""),
    (
        "wasserstein",
        {},
        {},
        "wasserstein",
        "differs: pertpy's is ott-jax's entropic cost, not debiased, in squared units",
    ),
]

_PERTPY_WORKER = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import anndata as ad
import pertpy as pt
request = json.loads(sys.argv[1])
adata = ad.read_h5ad(request["data"])
mode = request["mode"]
if mode == "agreement":
    out = {}
    for key, (metric, init_kwargs, kwargs) in request["cases"].items():
        init = dict(init_kwargs)
        if "layer_key" not in init:
            init["obsm_key"] = "X_pca"
        distance = pt.tl.Distance(metric, **init)
        series = distance.onesided_distances(
            adata, request["groupby"], request["reference"], show_progressbar=False, **kwargs
        )
        out[key] = {str(k): float(v) for k, v in series.items()}
    json.dump(out, open(request["out"], "w"))
started = time.perf_counter()
if mode == "onesided":
    pt.tl.Distance("edistance", obsm_key="X_pca").onesided_distances(
        adata, request["groupby"], request["reference"], show_progressbar=False
    )
elif mode == "pairwise":
    pt.tl.Distance("edistance", obsm_key="X_pca").pairwise(
        adata, request["groupby"], show_progressbar=False
    )
elif mode == "test":
    pt.tl.DistanceTest("edistance", n_perms=request["permutations"], obsm_key="X_pca")(
        adata, request["groupby"], request["reference"], show_progressbar=False
    )
if mode != "agreement":
    print(json.dumps({"compute_s": time.perf_counter() - started}))
"""

_OUR_WORKER = r"""
import json, sys, time
import anndata as ad
from scperteval.distances import onesided, pairwise, permutation_test
request = json.loads(sys.argv[1])
adata = ad.read_h5ad(request["data"])
mode, groupby, reference = request["mode"], request["groupby"], request["reference"]
started = time.perf_counter()
if mode == "onesided":
    onesided(adata, groupby, reference, "edistance", obsm_key="X_pca")
elif mode == "pairwise":
    pairwise(adata, groupby, "edistance", obsm_key="X_pca")
elif mode == "test":
    permutation_test(adata, groupby, reference, "edistance", obsm_key="X_pca",
                     n_permutations=request["permutations"], seed=0)
print(json.dumps({"compute_s": time.perf_counter() - started}))
"""


def ensure_pertpy_venv(workdir: Path) -> Path:
    """pertpy's interpreter, installing it into ``workdir / "pertpy"`` the first time.

    Parameters
    ----------
    workdir
        Folder holding the virtual environment.

    Returns
    -------
    pathlib.Path
        The venv's ``python``.

    """
    venv = workdir / "pertpy"
    python = venv / "bin" / "python"
    check = "import pertpy; print(pertpy.__version__)"
    if python.exists():
        found = subprocess.run([str(python), "-I", "-c", check], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip().endswith(PERTPY_VERSION):
            return python
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"installing pertpy {PERTPY_VERSION} into {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH_REQUIREMENT], check=True)
    subprocess.run([*pip, *PERTPY_REQUIREMENTS], check=True)
    return python


def ensure_embedded(name: str, workdir: Path, s_data: str | None) -> tuple[Path, str, str]:
    """A dataset with ``obsm["X_pca"]`` (50 axes), written once; its groupby and reference."""
    import anndata as ad
    import scipy.sparse as sp

    from scperteval.engine._pca import principal_axes

    path = workdir / f"distances_{name}.h5ad"
    groupby = "condition" if name == "norman" else "perturbation"
    if path.exists():
        return path, groupby, "control"
    if name == "norman":
        full = ad.read_h5ad(NORMAN)
        adata = full[full.obs["dataset"] == "norman19"].copy()
    else:
        adata = ad.read_h5ad(ensure_dataset(name, workdir, s_data))
    components, offset = principal_axes(adata.X, 50)
    dense = adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)
    embedding = (np.asarray(dense, dtype=np.float64) - offset) @ components
    slim = ad.AnnData(
        X=np.asarray(dense, dtype=np.float32)
        if name == "norman"
        else sp.csr_matrix((adata.n_obs, 1)),
        obs=adata.obs[[groupby]].astype(str).astype("category"),
    )
    if name != "norman":
        slim.var_names = ["unused"]
    else:
        slim.var_names = adata.var_names
    slim.obsm["X_pca"] = embedding
    if name == "norman":
        # float64, so that pertpy's per-gene means and variances are not float32 ones.
        slim.layers["logexpr"] = np.asarray(dense, dtype=np.float64)
    slim.write_h5ad(path)
    return path, groupby, "control"


def agreement(
    python: Path, data: Path, groupby: str, reference: str, workdir: Path
) -> list[dict[str, Any]]:
    """Per case: pertpy's and our one-sided values and their largest relative difference."""
    import anndata as ad

    from scperteval.distances import onesided

    cases = {f"{i}": (case[0], case[1], case[2]) for i, case in enumerate(AGREEMENT)}
    out = workdir / f"pertpy_values_{data.stem}.json"
    request = {"data": str(data), "mode": "agreement", "groupby": groupby, "reference": reference}
    request.update({"cases": cases, "out": str(out)})
    done = subprocess.run(
        [str(python), "-I", "-c", _PERTPY_WORKER, json.dumps(request)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pertpy failed: {done.stderr[-2000:]}")
    theirs = json.loads(out.read_text())
    adata = ad.read_h5ad(data)
    rows = []
    for i, (metric, init, kwargs, ours_spec, why) in enumerate(AGREEMENT):
        space = {"layer": init["layer_key"]} if "layer_key" in init else {"obsm_key": "X_pca"}
        if "layer_key" in init and init["layer_key"] not in adata.layers:
            continue
        ours = onesided(adata, groupby, reference, ours_spec, **space)
        values = pd.Series(theirs[str(i)])
        joined = pd.concat([values.rename("pertpy"), ours.rename("ours")], axis=1).drop(reference)
        scale = np.maximum(np.abs(joined["pertpy"]), 1e-300)
        relative = float((np.abs(joined["ours"] - joined["pertpy"]) / scale).max())
        rows.append(
            {
                "pertpy": metric + "".join(f" {o}" for o in (init, kwargs) if o),
                "ours": ours_spec,
                "max_rel_diff": relative,
                "note": why,
            }
        )
    return rows


def cost(
    python: Path,
    data: Path,
    groupby: str,
    reference: str,
    modes: list[str],
    permutations: int,
    pertpy_permutations: int,
    timeout: float,
) -> list[dict[str, Any]]:
    """Wall time and peak memory of each mode for both tools, in fresh processes."""
    rows = []
    for mode in modes:
        request = {"data": str(data), "mode": mode, "groupby": groupby, "reference": reference}
        request["permutations"] = permutations
        ours = measure_command(
            [sys.executable, "-c", _OUR_WORKER, json.dumps(request)],
            dict(os.environ),
            timeout,
        )
        row: dict[str, Any] = {"mode": mode, "ours_s": ours.seconds, "ours_gib": ours.peak_gib}
        row["ours_compute_s"] = _compute_seconds(ours.tail)
        if ours.returncode != 0:
            row["ours_error"] = ours.tail[-300:]
        run_pertpy = mode != "test" or pertpy_permutations > 0
        if run_pertpy:
            request["permutations"] = pertpy_permutations if mode == "test" else permutations
            theirs = measure_command(
                [str(python), "-I", "-c", _PERTPY_WORKER, json.dumps(request)],
                dict(os.environ),
                timeout,
            )
            row.update({"pertpy_s": theirs.seconds, "pertpy_gib": theirs.peak_gib})
            row["pertpy_compute_s"] = _compute_seconds(theirs.tail)
            if theirs.returncode != 0:
                row["pertpy_error"] = theirs.tail[-300:]
        rows.append(row)
    return rows


def _compute_seconds(tail: str) -> float:
    """The ``compute_s`` a worker printed last (NaN if none)."""
    for line in reversed(tail.strip().splitlines()):
        if line.startswith("{") and "compute_s" in line:
            return float(json.loads(line)["compute_s"])
    return float("nan")


def _fmt(value: Any, digits: int = 2) -> str:
    if not isinstance(value, float) or math.isnan(value):
        return "-"
    return "timeout" if math.isinf(value) else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help="venv, data and outputs")
    parser.add_argument("--datasets", default="norman", help="norman and/or S")
    parser.add_argument("--s-data", default=None, help="use this S file (else generated)")
    parser.add_argument("--no-agreement", action="store_true", help="skip the value comparison")
    parser.add_argument("--no-cost", action="store_true", help="skip the time/memory comparison")
    parser.add_argument("--modes", default="onesided,pairwise", help="cost cases")
    parser.add_argument("--permutations", type=int, default=0, help="also time our test")
    parser.add_argument(
        "--pertpy-permutations", type=int, default=0, help="pertpy's DistanceTest (0: skip)"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)

    workdir = Path(args.workdir).expanduser().resolve()
    python = ensure_pertpy_venv(workdir)
    report: dict[str, Any] = {}
    for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        data, groupby, reference = ensure_embedded(name, workdir, args.s_data)
        if not args.no_agreement:
            rows = agreement(python, data, groupby, reference, workdir)
            report[f"{name}_agreement"] = rows
            print(f"\n{name}: onesided to {reference!r}, pertpy {PERTPY_VERSION} vs ours")
            print(f"{'pertpy':<40} {'ours':<46} {'max rel diff':>12}")
            for row in rows:
                values = f"{row['pertpy']:<40} {row['ours']:<46} {row['max_rel_diff']:>12.2e}"
                print(f"{values}  {row['note']}")
        if not args.no_cost:
            modes = [m.strip() for m in args.modes.split(",") if m.strip()]
            if args.permutations:
                modes.append("test")
            rows = cost(
                python,
                data,
                groupby,
                reference,
                modes,
                args.permutations,
                args.pertpy_permutations,
                args.timeout,
            )
            report[f"{name}_cost"] = rows
            print(f"\n{name}: edistance in X_pca; wall and peak memory of a fresh process,")
            print("and compute seconds after imports and reading (in brackets)")
            print(
                f"{'case':<10} {'ours s':>14} {'ours GiB':>9} {'pertpy s':>15} {'pertpy GiB':>11} "
                f"{'speed-up':>15} {'mem ratio':>9}"
            )
            for row in rows:
                nan = float("nan")
                speed = row.get("pertpy_s", nan) / row["ours_s"]
                compute_speed = row.get("pertpy_compute_s", nan) / row["ours_compute_s"]
                memory = row["ours_gib"] / row.get("pertpy_gib", nan)
                label = row["mode"] + (f" {args.permutations}" if row["mode"] == "test" else "")
                ours_s = f"{_fmt(row['ours_s'], 1)} ({_fmt(row['ours_compute_s'], 2)})"
                theirs_s = (
                    f"{_fmt(row.get('pertpy_s', nan), 1)} "
                    f"({_fmt(row.get('pertpy_compute_s', nan), 2)})"
                )
                speeds = f"{_fmt(speed, 1)} ({_fmt(compute_speed, 1)})"
                errors = "".join(
                    f"  {k}: {row[k]}" for k in ("ours_error", "pertpy_error") if k in row
                )
                print(
                    f"{label:<10} {ours_s:>14} {_fmt(row['ours_gib']):>9} {theirs_s:>15} "
                    f"{_fmt(row.get('pertpy_gib', nan)):>11} {speeds:>15} {_fmt(memory):>9}"
                    + errors
                )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
