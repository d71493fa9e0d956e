#!/usr/bin/env python
"""Benchmark: all-perturbation Welch t-test (reference ``rest``) in scperteval vs scanpy.

What it measures, on one synthetic Perturb-seq dataset held in memory (by
default ``make_dataset.py --cells 100000 --genes 5000 --perts 500
--ctrl-cells 8000``, generated once into ``--workdir`` and reused):

1. ``X.sum(axis=0)``: the cost of one pass over the CSR matrix, the floor any
   one-pass method is compared with.
2. scperteval: a fresh :class:`~scperteval.context.Context` per repeat, then
   ``ctx.group_stats`` (the chunked pass with the numba kernel) and
   ``ctx.de(method="t-test", reference="rest", half="all")`` for every
   perturbation. A warm-up run (numba compile or cache load, lazy imports) comes
   first and is reported separately, not timed with the rest. The
   :class:`~scperteval.data.dataset.Dataset` is built (validated) once, outside the
   timed step; its time and memory are reported as information.
3. scanpy: ``sc.tl.rank_genes_groups(adata, groupby="perturbation",
   method="t-test", reference="rest")`` on the cells of the evaluated
   perturbations (controls excluded, so "rest" is the same cells as
   scperteval's). With ``--scanpy-groups N`` only N perturbations are tested
   (``groups=...``; the rest of each group is still every other perturbed cell)
   and the time is scaled linearly to all perturbations: the output says so.

X.sum and scperteval are run interleaved, ``--repeat`` times each, and the best
(minimum) time is reported, so that load from other processes on the machine
affects both alike; the median is shown too.

Memory: the in-memory size of X (data + indices + indptr) and the peak RSS
increase during the scperteval step (group statistics + DE, its result
included), over the RSS just before it (after ``gc.collect()`` and glibc
``malloc_trim``, so memory freed by earlier runs is not silently reused).
The peak is read from the kernel's high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs`` before the step) where Linux allows it, and also
sampled every 10 ms by a background thread (psutil); the larger is used.

Exactness, on ``--check`` perturbations (smallest, median, largest, then
seeded random ones): scperteval's t statistics against
``scipy.stats.ttest_ind(equal_var=False)`` on the same cells in float64
(1e-9) and, when scanpy ran on them, against scanpy's scores (1e-6; scanpy
stores scores as float32). The error is ``|t - t_ref| / max(|t_ref|, 1)``:
relative for ``|t| >= 1``, absolute below, because the relative error of a t
near 0 only measures the cancellation in its mean difference (a gene with
``t = 3e-6`` differs from scipy by 1e-15 absolute, 6e-10 relative). The pure
relative errors are printed and saved too. Genes where scipy/scanpy give NaN
(both groups constant and equal) count as ``t = 0``, scperteval's convention.

Targets printed with the table: scperteval at least 20x faster than scanpy,
within 3x of one pass (X.sum), peak memory increase below 2x size(X).

``--profile`` (on by default) then splits the step: group layout, the chunked
pass and its numba kernel alone, and inside ``de()``: condition and
leave-one-out statistics, ``welch_between``, ``benjamini_hochberg`` (BH)
and ``log_fold_change``.

Examples
--------
Quick run on a small dataset::

    python benchmarks/bench_de.py --cells 20000 --genes 2000 --perts 100 --ctrl-cells 2000

Full size on a ready-made file, scanpy on 20 perturbations, extrapolated::

    python benchmarks/bench_de.py --data /work/bench_data/M.h5ad --scanpy-groups 20
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MAKE_DATASET = REPO / ".." / "shared" / "bench" / "make_dataset.py"
DEFAULT_WORKDIR = REPO / "bench_out"
PERTURBATION_KEY = "perturbation"
CONTROL_LABEL = "control"

TARGET_VS_SCANPY = 20.0
TARGET_VS_PASS = 3.0
TARGET_MEMORY = 2.0
RTOL_SCIPY = 1e-9
RTOL_SCANPY = 1e-6


# --------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = parser.add_argument_group("dataset")
    data.add_argument(
        "--data",
        type=Path,
        help="use this existing .h5ad instead of generating one (obs 'perturbation', "
        "control label 'control', log-normalised CSR X)",
    )
    data.add_argument(
        "--workdir",
        type=Path,
        default=DEFAULT_WORKDIR,
        help="cache folder for the generated dataset and the results JSON (default: %(default)s)",
    )
    data.add_argument(
        "--make-dataset",
        type=Path,
        default=DEFAULT_MAKE_DATASET,
        help="path to make_dataset.py (default: %(default)s)",
    )
    data.add_argument(
        "--cells", type=int, default=100_000, help="perturbed cells (default %(default)s)"
    )
    data.add_argument("--genes", type=int, default=5000, help="genes (default %(default)s)")
    data.add_argument("--perts", type=int, default=500, help="perturbations (default %(default)s)")
    data.add_argument(
        "--ctrl-cells", type=int, default=8000, help="control cells, extra (default %(default)s)"
    )
    data.add_argument("--data-seed", type=int, default=0, help="make_dataset.py --seed (default 0)")

    timing = parser.add_argument_group("timing")
    timing.add_argument(
        "--repeat", type=int, default=3, help="timed repeats, best kept (default 3)"
    )
    timing.add_argument("--seed", type=int, default=0, help="Context seed (default 0)")
    timing.add_argument(
        "--threads", type=int, help="threads of scperteval's kernels (default: the available cores)"
    )
    timing.add_argument("--skip-scanpy", action="store_true", help="do not run scanpy")
    timing.add_argument(
        "--scanpy-groups",
        type=int,
        default=0,
        help="run scanpy on only N perturbations and extrapolate linearly to all "
        "(0 = all perturbations, the default)",
    )
    timing.add_argument(
        "--scanpy-repeat",
        type=int,
        help="timed scanpy repeats, best kept (default: --repeat)",
    )
    timing.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the parts of the scperteval step separately (default: on)",
    )

    check = parser.add_argument_group("exactness")
    check.add_argument(
        "--check",
        type=int,
        default=5,
        help="perturbations checked against scipy/scanpy (default 5)",
    )

    out = parser.add_argument_group("output")
    out.add_argument(
        "--json", type=Path, help="write results here (default: WORKDIR/bench_de_<dataset>.json)"
    )
    out.add_argument(
        "--strict", action="store_true", help="exit with status 1 when a target or check fails"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.scanpy_groups < 0:
        parser.error("--scanpy-groups must be >= 0")
    args.scanpy_repeat = args.repeat if args.scanpy_repeat is None else args.scanpy_repeat
    if args.scanpy_repeat < 1:
        parser.error("--scanpy-repeat must be at least 1")
    return args


# ------------------------------------------------------------------------ dataset
def dataset_path(args: argparse.Namespace) -> Path:
    """The .h5ad to benchmark: ``--data`` or the generated (cached) one."""
    if args.data is not None:
        if not args.data.exists():
            raise SystemExit(f"--data {args.data}: file not found")
        return args.data
    name = (
        f"bench_c{args.cells}_g{args.genes}_p{args.perts}_k{args.ctrl_cells}_s{args.data_seed}.h5ad"
    )
    path = args.workdir / name
    if path.exists():
        print(f"reusing {path}")
        return path
    script = args.make_dataset.resolve()
    if not script.exists():
        raise SystemExit(f"make_dataset.py not found at {script} (set --make-dataset)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.stem + ".partial.h5ad")
    command = [
        sys.executable,
        str(script),
        "--cells", str(args.cells),
        "--genes", str(args.genes),
        "--perts", str(args.perts),
        "--ctrl-cells", str(args.ctrl_cells),
        "--seed", str(args.data_seed),
        "--out", str(partial),
    ]  # fmt: skip
    print("generating:", " ".join(command), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    os.replace(partial, path)  # only a complete file is ever reused
    print(f"generated {path} in {time.perf_counter() - started:.1f} s")
    return path


def matrix_bytes(matrix: Any) -> int:
    """In-memory size of a CSR/CSC matrix (data + indices + indptr) or a dense array."""
    if hasattr(matrix, "indptr"):
        return int(matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes)
    return int(np.asarray(matrix).nbytes)


# ------------------------------------------------------------------------- memory
def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            match = re.search(rf"^{field}:\s+(\d+)\s+kB", handle.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _reset_high_water_mark() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    hwm, rss = _status_bytes("VmHWM"), _status_bytes("VmRSS")
    return hwm is not None and rss is not None and hwm <= rss + (4 << 20)


def release_free_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``), so RSS counts live data.

    Without it, memory freed by an earlier run stays in the allocator's arenas,
    the next run reuses it, and its RSS increase reads as (close to) zero.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRSS:
    """Peak resident memory of this process during a ``with`` block.

    ``increase`` is the peak minus the RSS at entry, the peak being the larger
    of the kernel's high-water mark (when it could be reset at entry) and a
    10 ms psutil sampling thread.
    """

    def __init__(self, interval: float = 0.01) -> None:
        import psutil

        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.start = 0
        self.sampled_peak = 0
        self.hwm_peak: int | None = None
        self.method = ""

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.sampled_peak = max(self.sampled_peak, self._process.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> PeakRSS:
        gc.collect()
        release_free_memory()
        self._hwm_ok = _reset_high_water_mark()
        self.start = self._process.memory_info().rss
        self.sampled_peak = self.start
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sampled_peak = max(self.sampled_peak, self._process.memory_info().rss)
        self.hwm_peak = _status_bytes("VmHWM") if self._hwm_ok else None
        self.method = "VmHWM+sampling" if self.hwm_peak is not None else "sampling (10 ms)"

    @property
    def peak(self) -> int:
        return max(self.sampled_peak, self.hwm_peak or 0)

    @property
    def increase(self) -> int:
        return self.peak - self.start


# ------------------------------------------------------------------------- timing
def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


def run_scperteval(dataset: Any, seed: int, threads: Any) -> tuple[float, float, Any]:
    """One scperteval step on a fresh Context: (group_stats s, de s, DEResult)."""
    from scperteval.context import Context

    context = Context(dataset, seed=seed, threads=threads)
    t_stats, _ = timed(lambda: context.group_stats)
    t_de, result = timed(lambda: context.de(method="t-test", reference="rest", half="all"))
    return t_stats, t_de, result


def kernel_cache_stats() -> str:
    """Numba cache hits/misses of the group-statistics kernel, when numba reports them."""
    try:
        from scperteval.kernels.moments import csr_group_moments

        stats = csr_group_moments.stats
        hits, misses = sum(stats.cache_hits.values()), sum(stats.cache_misses.values())
        return f"numba cache hits {hits}, misses {misses}"
    except Exception:  # noqa: BLE001 - informative only; the kernel may be renamed
        return "numba cache statistics unavailable"


# ---------------------------------------------------------------------- exactness
def pick_checked(counts: np.ndarray, n_check: int, seed: int) -> list[int]:
    """Condition indices to check: smallest, median, largest, then seeded random ones."""
    order = np.argsort(counts, kind="stable")
    chosen: list[int] = []
    for k in (order[0], order[len(order) // 2], order[-1]):
        if int(k) not in chosen:
            chosen.append(int(k))
    rng = np.random.default_rng(seed)
    for k in rng.permutation(len(counts)):
        if len(chosen) >= n_check:
            break
        if int(k) not in chosen:
            chosen.append(int(k))
    return chosen[:n_check]


def relative_error(ours: np.ndarray, reference: np.ndarray, floor: float = 0.0) -> float:
    """Largest ``|ours - ref| / max(|ref|, floor)``.

    Where the denominator is 0 or ``ref`` is infinite the values must be equal
    (otherwise the error is infinite). ``floor=1`` compares t statistics below 1
    in magnitude absolutely: the relative error of a t near 0 measures the
    cancellation in its mean difference, not the method.
    """
    ours = np.asarray(ours, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    scale = np.maximum(np.abs(reference), floor)
    exact = (scale == 0) | ~np.isfinite(reference)
    if np.any(ours[exact] != reference[exact]):
        return math.inf
    if np.all(exact):
        return 0.0
    return float(np.max(np.abs(ours[~exact] - reference[~exact]) / scale[~exact]))


def scipy_t(
    x_pert: Any, group_codes: np.ndarray, checked: list[int], gene_chunk: int = 256
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """scipy Welch t and p of each checked group vs the other rows (float64; NaN -> t 0, p 1).

    The matrix is densified one block of genes at a time, shared by every checked group.
    """
    from scipy import stats

    n_genes = x_pert.shape[1]
    out = {k: (np.empty(n_genes), np.empty(n_genes)) for k in checked}
    for start in range(0, n_genes, gene_chunk):
        stop = min(start + gene_chunk, n_genes)
        dense = x_pert[:, start:stop].toarray().astype(np.float64)
        for k in checked:
            in_group = group_codes == k
            with np.errstate(divide="ignore", invalid="ignore"):
                result = stats.ttest_ind(dense[in_group], dense[~in_group], equal_var=False, axis=0)
            out[k][0][start:stop] = result.statistic
            out[k][1][start:stop] = result.pvalue
    return {
        k: (np.where(np.isnan(t), 0.0, t), np.where(np.isnan(p), 1.0, p))
        for k, (t, p) in out.items()
    }


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from scperteval.kernels.threads import Threads

    return run(args, Threads(args.threads))


def run(args: argparse.Namespace, threads: Any) -> int:
    """The whole benchmark, with the parsed arguments, on the run's kernel ``threads``."""
    import anndata as ad

    from scperteval.data.dataset import Dataset

    path = dataset_path(args)
    load_before = os.getloadavg()
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, kernel threads "
        f"{threads.count}, load average {load_before[0]:.2f}"
    )
    t_read, adata = timed(lambda: ad.read_h5ad(path))
    if not hasattr(adata.X, "indptr") or adata.X.format != "csr":
        import scipy.sparse as sp

        adata.X = sp.csr_matrix(adata.X)
    x = adata.X
    size_x = matrix_bytes(x)
    print(
        f"read {path} in {t_read:.1f} s: {adata.n_obs} cells x {adata.n_vars} genes, "
        f"nnz {x.nnz} (density {x.nnz / (adata.n_obs * adata.n_vars):.3f}), X {x.dtype}, "
        f"size(X) = {size_x / 2**20:.1f} MiB"
    )
    with PeakRSS() as mem_dataset:
        t_dataset, dataset = timed(
            lambda: Dataset(adata, perturbation_key=PERTURBATION_KEY, control_label=CONTROL_LABEL)
        )
    n_pert = len(dataset.conditions)
    print(f"Dataset(): {dataset.describe()} in {t_dataset:.2f} s (validation, not timed below)")

    # -------------------------------------------------------- warm-up, then timing
    t_warm, (_, _, _) = timed(lambda: run_scperteval(dataset, args.seed, threads))
    print(
        f"warm-up run (numba compile/cache load, imports): {t_warm:.2f} s; {kernel_cache_stats()}"
    )
    gc.collect()

    sums: list[float] = []
    steps: list[float] = []
    stats_times: list[float] = []
    de_times: list[float] = []
    memory: list[PeakRSS] = []
    result = None
    for repeat in range(args.repeat):
        t_sum, _ = timed(lambda: x.sum(axis=0))
        result = None
        gc.collect()
        with PeakRSS() as mem:
            t_stats, t_de, result = run_scperteval(dataset, args.seed, threads)
        sums.append(t_sum)
        stats_times.append(t_stats)
        de_times.append(t_de)
        steps.append(t_stats + t_de)
        memory.append(mem)
        print(
            f"  repeat {repeat + 1}/{args.repeat}: X.sum {t_sum:.3f} s | scperteval "
            f"{t_stats + t_de:.3f} s (group_stats {t_stats:.3f} + de {t_de:.3f}) | "
            f"peak RSS +{mem.increase / 2**20:.0f} MiB [{mem.method}]",
            flush=True,
        )
    assert result is not None
    peak_increase = max(m.increase for m in memory)

    # ------------------------------------------------------------------- profile
    profile: dict[str, float] = {}
    if args.profile:
        try:
            profile = profile_step(dataset, args.seed, threads)
        except Exception as exc:  # noqa: BLE001 - the profile uses package internals
            print(f"profile skipped, package internals changed? {type(exc).__name__}: {exc}")

    # ---------------------------------------------- perturbed-only matrix, checks
    codes = np.asarray(_layout(dataset, args.seed).codes)
    perturbed = (codes >= 0) & (codes < 2 * n_pert)
    pert_rows = dataset.cell_index[perturbed]
    pert_codes = codes[perturbed] // 2  # condition index of each perturbed cell
    x_pert = x[pert_rows]
    names = [c.perturbation for c in result.conditions]
    counts = np.bincount(pert_codes, minlength=n_pert)
    checked = pick_checked(counts, min(args.check, n_pert), args.seed)
    print(
        f"\nexactness on {len(checked)} perturbation(s): "
        + ", ".join(f"{names[k]} ({counts[k]} cells)" for k in checked)
    )
    scipy_err_t, scipy_err_t_strict, scipy_err_p = 0.0, 0.0, 0.0
    started = time.perf_counter()
    reference = scipy_t(x_pert, pert_codes, checked)
    for k in checked:
        t_ref, p_ref = reference[k]
        err_t = relative_error(result.statistic[k], t_ref, floor=1.0)
        err_t_strict = relative_error(result.statistic[k], t_ref)
        err_p = relative_error(result.pvalue[k], p_ref)
        scipy_err_t = max(scipy_err_t, err_t)
        scipy_err_t_strict = max(scipy_err_t_strict, err_t_strict)
        scipy_err_p = max(scipy_err_p, err_p)
        print(
            f"  scipy  {names[k]:>12}: t error {err_t:.2e} (pure relative {err_t_strict:.2e}), "
            f"p relative {err_p:.2e}"
        )
    t_check = time.perf_counter() - started
    print(f"  (scipy check {t_check:.1f} s)")

    # --------------------------------------------------------------------- scanpy
    scanpy_info: dict[str, Any] = {"ran": False}
    if not args.skip_scanpy:
        scanpy_info = run_scanpy(args, adata, x_pert, pert_codes, names, checked, result)
    del x_pert
    gc.collect()

    # ---------------------------------------------------------------------- table
    load_after = os.getloadavg()
    rows = report(
        args=args,
        size_x=size_x,
        sums=sums,
        steps=steps,
        stats_times=stats_times,
        de_times=de_times,
        t_warm=t_warm,
        t_dataset=t_dataset,
        mem_dataset=mem_dataset,
        peak_increase=peak_increase,
        memory_method=memory[0].method,
        scanpy_info=scanpy_info,
        scipy_err_t=scipy_err_t,
        n_pert=n_pert,
    )
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")

    out = args.json or args.workdir / f"bench_de_{path.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "dataset": str(path),
        "shape": [int(adata.n_obs), int(adata.n_vars)],
        "nnz": int(x.nnz),
        "n_perturbations": n_pert,
        "size_x_bytes": size_x,
        "repeat": args.repeat,
        "kernel_threads": threads.count,
        "cpu_count": os.cpu_count(),
        "load_average": [load_before[0], load_after[0]],
        "seconds": {
            "read_h5ad": t_read,
            "dataset_validation": t_dataset,
            "warmup": t_warm,
            "x_sum": sums,
            "scperteval": steps,
            "group_stats": stats_times,
            "de": de_times,
            "scipy_check": t_check,
        },
        "peak_rss_increase_bytes": [m.increase for m in memory],
        "dataset_validation_peak_rss_increase_bytes": mem_dataset.increase,
        "memory_method": memory[0].method,
        "checked": [names[k] for k in checked],
        "scipy_max_error": {
            "t_rel_floor1": scipy_err_t,
            "t_rel": scipy_err_t_strict,
            "p_rel": scipy_err_p,
        },
        "scanpy": scanpy_info,
        "profile_seconds": profile,
        "targets": rows,
    }
    out.write_text(json.dumps(payload, indent=2, default=float))
    print(f"results written to {out}")
    failed = [row for row in rows if row["status"] == "FAIL"]
    return 1 if (args.strict and failed) else 0


def _layout(dataset: Any, seed: int) -> Any:
    from scperteval.data.layout import GroupLayout

    return GroupLayout.build(dataset, seed)


def run_scanpy(
    args: argparse.Namespace,
    adata: Any,
    x_pert: Any,
    pert_codes: np.ndarray,
    names: list[str],
    checked: list[int],
    result: Any,
) -> dict[str, Any]:
    """Time scanpy's rank_genes_groups t-test vs rest on the perturbed cells; compare."""
    import warnings
    from importlib.metadata import version

    import anndata as ad
    import pandas as pd
    import scanpy as sc

    n_pert = len(names)
    obs = pd.DataFrame(
        {PERTURBATION_KEY: pd.Categorical.from_codes(pert_codes, categories=names)},
        index=pd.Index([f"c{i}" for i in range(x_pert.shape[0])]),
    )
    var = pd.DataFrame(index=adata.var_names.copy())
    perturbed = ad.AnnData(X=x_pert, obs=obs, var=var)
    if "log1p" in adata.uns:
        perturbed.uns["log1p"] = dict(adata.uns["log1p"])
    if 0 < args.scanpy_groups < n_pert:
        # the checked perturbations first, then others spread evenly over all of them
        spread = np.round(np.linspace(0, n_pert - 1, args.scanpy_groups)).astype(int)
        groups = list(dict.fromkeys([*checked, *map(int, spread)]))[: args.scanpy_groups]
        selected: list[str] | str = [names[k] for k in groups]
        n_groups = len(groups)
    else:
        selected = "all"
        n_groups = n_pert
    extrapolated = n_groups < n_pert
    what = (
        f"{n_groups} of {n_pert} perturbations, EXTRAPOLATED linearly x{n_pert / n_groups:.1f}"
        if extrapolated
        else f"all {n_pert} perturbations"
    )
    print(f"\nscanpy {version('scanpy')} rank_genes_groups t-test vs rest on {what}")
    times = []
    for repeat in range(args.scanpy_repeat):
        if "rank_genes_groups" in perturbed.uns:
            del perturbed.uns["rank_genes_groups"]
        gc.collect()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            elapsed, _ = timed(
                lambda: sc.tl.rank_genes_groups(
                    perturbed,
                    groupby=PERTURBATION_KEY,
                    groups=selected,
                    reference="rest",
                    method="t-test",
                    use_raw=False,
                    n_genes=perturbed.n_vars,
                )
            )
        times.append(elapsed)
        print(f"  repeat {repeat + 1}/{args.scanpy_repeat}: {elapsed:.1f} s", flush=True)
    best = min(times)
    total = best * n_pert / n_groups
    errors: dict[str, dict[str, float]] = {}
    genes = pd.Index(result.genes)
    ran = set(selected) if selected != "all" else set(names)
    for k in checked:
        if names[k] not in ran:
            continue
        frame = sc.get.rank_genes_groups_df(perturbed, group=names[k]).set_index("names")
        frame = frame.loc[genes]
        errors[names[k]] = {
            "t": relative_error(result.statistic[k], frame["scores"].to_numpy(), floor=1.0),
            "t_rel": relative_error(result.statistic[k], frame["scores"].to_numpy()),
            "p": relative_error(result.pvalue[k], frame["pvals"].to_numpy()),
            "lfc": relative_error(
                result.log_fold_change[k].astype(np.float32), frame["logfoldchanges"].to_numpy()
            ),
        }
        e = errors[names[k]]
        print(
            f"  scanpy {names[k]:>12}: t error {e['t']:.2e} (pure relative {e['t_rel']:.2e}), "
            f"p relative {e['p']:.2e}, lfc (as float32) {e['lfc']:.2e}"
        )
    return {
        "ran": True,
        "version": version("scanpy"),
        "groups_run": n_groups,
        "extrapolated": extrapolated,
        "seconds_measured": times,
        "seconds_all_perturbations": total,
        "max_rel_error": errors,
    }


def profile_step(dataset: Any, seed: int, threads: Any) -> dict[str, float]:
    """Time the parts of the scperteval step (each on the same inputs as the package).

    Uses package internals (the kernel, ``chunk_cells``), mirrored from
    ``Context._compute_group_stats``, ``GroupStats.from_chunk`` and ``Context._de``.
    """
    from scperteval.context import Context
    from scperteval.data.layout import GroupLayout
    from scperteval.stats.diffexp import log_fold_change, welch_between
    from scperteval.stats.groups import GroupStats
    from scperteval.stats.multiple_testing import benjamini_hochberg

    print("\nprofile of one scperteval step (single runs, seconds):")
    parts: dict[str, float] = {}

    def note(name: str, seconds: float, memory: int | None = None) -> None:
        parts[name] = seconds
        extra = "" if memory is None else f"   peak RSS +{memory / 2**20:.0f} MiB"
        print(f"  {name:<66} {seconds:8.3f}{extra}")

    layout_time, layout = timed(lambda: GroupLayout.build(dataset, seed))
    note("layout (GroupLayout.build, seeded halves)", layout_time)
    context = Context(dataset, seed=seed, threads=threads)
    with PeakRSS() as mem:
        stats_time, _ = timed(lambda: context.group_stats)
    n_chunks = len(dataset.chunk_slices())
    note(
        f"ctx.group_stats ({n_chunks} chunk(s), incl. layout)",
        stats_time,
        mem.increase,
    )
    whole = copy.copy(dataset)
    whole.chunk_cells = max(dataset.n_cells, 1)
    with PeakRSS() as mem:
        whole_time, _ = timed(lambda: Context(whole, seed=seed, threads=threads).group_stats)
    note("  what-if: same with one chunk (chunk_cells >= n_cells)", whole_time, mem.increase)
    matrix = dataset.matrix()
    if hasattr(matrix, "indptr") and dataset.n_cells == matrix.shape[0] and not dataset.normalize:
        codes = layout.codes
        n_groups = layout.n_groups
        chunk_time, _ = timed(lambda: GroupStats.from_chunk(matrix, codes, n_groups, threads))
        note("  GroupStats.from_chunk on all of X", chunk_time)
    de_total, _ = timed(lambda: context.de(method="t-test", reference="rest", half="all"))
    note("ctx.de() total (fresh, group_stats cached)", de_total)
    context2 = Context(dataset, seed=seed, threads=threads)
    context2.group_stats  # noqa: B018 - computed outside the timings below
    t, target = timed(lambda: context2.condition_stats("all"))
    note("  condition_stats('all') (merge_groups of the halves)", t)
    t, ref = timed(lambda: context2.rest_stats())
    note("  rest_stats() (leave_one_out of the conditions)", t)
    t, (statistic, pvalue) = timed(lambda: welch_between(target, ref))
    note("  welch_between (t, dof and p-values in one compiled pass)", t)
    t, _ = timed(lambda: benjamini_hochberg(pvalue))
    note("  benjamini_hochberg (BH, equal to scipy false_discovery_control)", t)
    t, _ = timed(lambda: log_fold_change(target.mean, ref.mean))
    note("  log_fold_change", t)
    return parts


def report(
    *,
    args: argparse.Namespace,
    size_x: int,
    sums: list[float],
    steps: list[float],
    stats_times: list[float],
    de_times: list[float],
    t_warm: float,
    t_dataset: float,
    mem_dataset: PeakRSS,
    peak_increase: int,
    memory_method: str,
    scanpy_info: dict[str, Any],
    scipy_err_t: float,
    n_pert: int,
) -> list[dict[str, Any]]:
    """Print the results table and the targets; return the target rows."""
    t_sum, t_step = min(sums), min(steps)
    memory_ratio = peak_increase / size_x
    scanpy_total = scanpy_info.get("seconds_all_perturbations")
    speedup = scanpy_total / t_step if scanpy_total else None

    def fmt(value: float | None, spec: str) -> str:
        width = int(spec.split(".")[0])
        return "-".rjust(width) if value is None else format(value, spec)

    print(f"\nsize(X) = {size_x / 2**20:.1f} MiB (data + indices + indptr); best of {args.repeat}")
    header = (
        f"{'step':<60} {'best s':>9} {'median s':>9} {'x X.sum':>8} {'scanpy/this':>11} "
        f"{'peak/X':>7}"
    )
    print(header)
    print("-" * len(header))

    def row(
        name: str,
        times: list[float] | None,
        seconds: float | None,
        *,
        vs_sum: bool = True,
        scanpy: float | None = None,
        mem: float | None = None,
    ) -> None:
        median = statistics.median(times) if times else None
        ratio = seconds / t_sum if (seconds is not None and vs_sum) else None
        print(
            f"{name:<60} {fmt(seconds, '9.3f')} {fmt(median, '9.3f')} {fmt(ratio, '8.1f')} "
            f"{fmt(scanpy, '11.1f')} {fmt(mem, '7.2f')}"
        )

    row("(a) X.sum(axis=0), one pass", sums, t_sum)
    row(
        "(b) scperteval group_stats + de (t-test, rest)",
        steps,
        t_step,
        scanpy=speedup,
        mem=memory_ratio,
    )
    row("      group_stats", stats_times, min(stats_times))
    row("      de()", de_times, min(de_times))
    row("    warm-up run (numba compile/cache, not timed)", None, t_warm)
    row(
        "    Dataset() validation (once, not timed)",
        None,
        t_dataset,
        mem=mem_dataset.increase / size_x,
    )
    if scanpy_info.get("ran"):
        label = "(c) scanpy rank_genes_groups t-test, rest"
        if scanpy_info["extrapolated"]:
            label += f" [EXTRAPOLATED {scanpy_info['groups_run']}->{n_pert}]"
        row(label, None, scanpy_total)
        if scanpy_info["extrapolated"]:
            row(
                f"      measured on {scanpy_info['groups_run']} perturbations",
                scanpy_info["seconds_measured"],
                min(scanpy_info["seconds_measured"]),
            )
    else:
        print(f"{'(c) scanpy':<60} {'skipped':>9}")
    print(f"peak/X: peak RSS increase during the step / size(X) [{memory_method}]")
    if scanpy_info.get("ran") and scanpy_info["extrapolated"]:
        print(
            f"NOTE: scanpy ran on {scanpy_info['groups_run']} of {n_pert} perturbations; its time "
            f"for all is EXTRAPOLATED linearly (x{n_pert / scanpy_info['groups_run']:.1f})."
        )

    rows: list[dict[str, Any]] = []

    def target(name: str, measured: str, ok: bool | None) -> None:
        status = "n/a" if ok is None else ("PASS" if ok else "FAIL")
        rows.append({"target": name, "measured": measured, "status": status})

    target(
        f"scperteval >= {TARGET_VS_SCANPY:g}x faster than scanpy",
        "-"
        if speedup is None
        else f"{speedup:.1f}x" + (" (extrap.)" if scanpy_info.get("extrapolated") else ""),
        None if speedup is None else speedup >= TARGET_VS_SCANPY,
    )
    target(
        f"scperteval within {TARGET_VS_PASS:g}x of one pass (X.sum)",
        f"{t_step / t_sum:.1f}x",
        t_step / t_sum <= TARGET_VS_PASS,
    )
    target(
        f"peak memory increase < {TARGET_MEMORY:g}x size(X)",
        f"{memory_ratio:.2f}x ({peak_increase / 2**20:.0f} MiB)",
        memory_ratio < TARGET_MEMORY,
    )
    target(
        f"t == scipy ttest_ind(equal_var=False), rel {RTOL_SCIPY:g}",
        f"max {scipy_err_t:.1e}",
        scipy_err_t <= RTOL_SCIPY,
    )
    scanpy_errors = scanpy_info.get("max_rel_error") or {}
    if scanpy_errors:
        worst = max(e["t"] for e in scanpy_errors.values())
        target(
            f"t == scanpy scores, rel {RTOL_SCANPY:g} ({len(scanpy_errors)} perts)",
            f"max {worst:.1e}",
            worst <= RTOL_SCANPY,
        )
    else:
        target(f"t == scanpy scores, rel {RTOL_SCANPY:g}", "not run", None)
    print(
        "\n(t errors: |t - t_ref| / max(|t_ref|, 1); pure relative errors are printed above "
        "and stored in the JSON)"
    )
    print(f"{'target':<52} {'measured':>24}  status")
    print("-" * 86)
    for item in rows:
        print(f"{item['target']:<52} {item['measured']:>24}  {item['status']}")
    return rows


if __name__ == "__main__":
    sys.exit(main())
