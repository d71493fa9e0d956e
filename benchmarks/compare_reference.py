#!/usr/bin/env python
"""Compare scperteval with the published reference implementation (scperteval 0.2.0 on PyPI).

The reference has the same import name, so it is installed into its own virtual
environment under ``--workdir`` (once, then reused): ``torch==2.13.0`` first, so that
pip takes the CPU wheel found on local disk instead of resolving a CUDA build, then
``scperteval[sinkhorn]==0.2.0``.

Two comparisons, both on the same files for the two tools:

- **Cost** (``--cases``): ``calibrate`` per dataset and protocol group, and
  ``score`` with one model (``--score-datasets``), each in a fresh process under
  ``/usr/bin/time -v`` (else ``os.wait4``), recording wall time and peak resident
  memory. The table gives the time ratio reference / ours (above 1: we are faster)
  and the memory ratio ours / reference (below 1: we use less).
- **Values** (``--agreement``): the ``mean`` model of
  ``../shared/bench/make_predictions.py`` scored by both tools against all truth
  cells (the reference's ``score``; ours ``score --truth all --no-baselines``), the
  per-perturbation values joined on (protocol, perturbation) through
  :data:`PROTOCOL_MAP`, with the maximum relative difference per protocol and the
  reason for every difference (:data:`DIFFERENCES`). Our protocols are taken from the
  default suite and from ``reference_aligned.toml``, which writes further reference
  protocols in our protocol language and sets the options that make some
  definitions coincide (so that a closed gap shows which option caused it).

Datasets: ``norman`` (the ``norman19`` subset of the shared development file, written
once to ``--workdir`` since the reference has no subset option), ``S`` and ``M`` (the
shared generator's sizes, see ``bench_calibrate.py``; give ``--s-data``/``--m-data``
to reuse generated files). Both tools run with the same ``--min-cells``.

Examples
--------
The default: Norman, every group; S centroid+DE; score and values on Norman::

    python benchmarks/compare_reference.py --s-data /work/bench_data/S.h5ad --out refcompare

Value agreement on S too, and the population groups on S (the reference needs
20+ minutes per group there)::

    python benchmarks/compare_reference.py --s-data /work/bench_data/S.h5ad \\
        --cases S:energy+mmd,S:sinkhorn --agreement norman,S --timeout 3600
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_calibrate import (  # noqa: E402
    GROUPS,
    NORMAN,
    REPO,
    Measurement,
    ensure_dataset,
    ensure_prediction,
    measure_command,
    protocol_groups,
)

REFERENCE_REQUIREMENT = "scperteval[sinkhorn]==0.2.0"
REFERENCE_VERSION = "0.2.0"
#: Installed before the reference so that pip keeps this CPU build.
TORCH_REQUIREMENT = "torch==2.13.0"
ALIGNED_SUITE = Path(__file__).resolve().parent / "reference_aligned.toml"
DEFAULT_WORKDIR = Path.home() / ".cache" / "scperteval-bench"

#: The reference's protocol selection for each of our groups (``-p`` of its CLI).
REFERENCE_GROUPS = {
    "all": "all",
    "centroid+de": "pseudobulk,de",
    "energy+mmd": "energy_distance_top_k,energy_distance_pca_k,"
    "unbiased_mmd_median_top_k,unbiased_mmd_median_pca_k",
    "sinkhorn": "sinkhorn_w2_top_k,sinkhorn_w2_pca_k",
}

#: Our protocol name -> the reference's (as written in its output, parameter included).
PROTOCOL_MAP = {
    "pearson_delta_ctrl": "pearson_ctrl",
    "pearson_delta_pert": "pearson_pert",
    "pearson_delta_ctrl_top_k": "pearson_ctrl_top_k=50",
    "pearson_delta_ctrl_heg": "pearson_ctrl_heg_k=1000",
    "r2_delta_ctrl": "r2_ctrl",
    "r2_delta_pert": "r2_pert",
    "mse": "mse",
    "mse_top_k": "mse_top_k=50",
    "l2": "l2_heg_k=1000",
    "weighted_mse": "wmse_exp2",
    "weighted_pearson_delta_pert": "weighted_pearson_pert_exp2",
    "weighted_r2_delta_pert": "weighted_r2_pert_exp2",
    "weighted_r2_delta_ctrl": "weighted_r2_ctrl_exp2",
    "de_auprc": "de_auprc",
    "de_auroc": "de_auroc",
    "de_topk_overlap": "de_overlap_k=50",
    "energy_top_k": "energy_distance_top_k=50",
    "energy_pca": "energy_distance_pca_k=50",
    "mmd_top_k": "unbiased_mmd_median_top_k=50",
    "mmd_pca": "unbiased_mmd_median_pca_k=50",
    "sinkhorn_top_k": "sinkhorn_w2_top_k=50",
    "sinkhorn_pca": "sinkhorn_w2_pca_k=50",
    "rank_full": "rank",
    "transpose_rank": "transpose_rank",
    "nir": "nir",
    # reference_aligned.toml
    "de_auprc_all_genes": "de_auprc",
    "de_auroc_all_genes": "de_auroc",
    "de_topk_overlap_all_genes": "de_overlap_k=50",
    "mmd_top_k_pooled": "unbiased_mmd_median_top_k=50",
    "mmd_pca_pooled": "unbiased_mmd_median_pca_k=50",
    "sinkhorn_top_k_scaling05": "sinkhorn_w2_top_k=50",
    "sinkhorn_pca_scaling05": "sinkhorn_w2_pca_k=50",
    "pearson_raw": "pearson",
    "pearson_raw_heg": "pearson_heg_k=1000",
    "mse_degs": "mse_degs_padj=0.05",
    "pearson_delta_ctrl_degs": "pearson_ctrl_degs_padj=0.05",
    "pearson_delta_pert_top_k": "pearson_pert_top_k=50",
    "pearson_delta_pert_degs": "pearson_pert_degs_padj=0.05",
    "r2_delta_ctrl_top_k": "r2_ctrl_top_k=50",
    "r2_delta_ctrl_degs": "r2_ctrl_degs_padj=0.05",
    "r2_delta_pert_top_k": "r2_pert_top_k=50",
    "r2_delta_pert_degs": "r2_pert_degs_padj=0.05",
    "weighted_pearson_delta_ctrl": "weighted_pearson_ctrl_exp2",
}

ONE_EXPONENT = "reference only: our DEG-weight exponent is one per run (Context.weight_exponent)"

#: Protocols of one tool without a counterpart in the other, and why.
UNMATCHED = {
    "pearson_delta_ctrl_interpolated": "ours only as a calibration (interpolated positive "
    "control); in score mode its value is pearson_delta_ctrl's",
    "mse_interpolated": "ours only as a calibration; in score mode its value is mse's",
    "cosine_delta_ctrl": "ours only",
    "mae": "ours only",
    "mse_perturbed_genes": "ours only",
    "rank_pca": "ours only",
    "pds": "ours only",
    "wmse_exp1": ONE_EXPONENT,
    "wmse_exp4": ONE_EXPONENT,
}

#: Why values differ, for every pair that is not expected to agree to 1e-9 relative.
DIFFERENCES = {
    "l2": "the reference computes L2 on the 1000 genes most expressed in controls "
    "(l2_heg_k=1000), ours on all genes: the same only when the dataset has at most 1000 "
    "genes",
    "de_auprc": "our DE protocols rank only genes that vary in the truth or its reference; "
    "the reference also counts never-detected genes (t = 0) as negatives. Average precision "
    "is unchanged by negatives ranked below every positive, so it agrees",
    "de_auroc": "our DE protocols rank only genes that vary in the truth or its reference; "
    "the reference counts never-detected genes as negatives tied at the bottom of every "
    "ranking, which raises the AUROC of any prediction (de_auroc_all_genes closes the gap)",
    "de_topk_overlap": "same top-k sets unless a tie at the cut-off falls differently "
    "(ours: ties resolved against the prediction; reference: argpartition order)",
    "energy_top_k": "same estimator; the reference forms distances as |x|^2 + |y|^2 - 2 x.y, "
    "whose cancellation leaves about 1e-8 absolute error on coinciding cells (sparse top-k "
    "genes hold many); ours is exact",
    "energy_pca": "different PCA basis: the reference fits scikit-learn's PCA (randomized SVD "
    "for these sizes) on every cell of the file, ours an exact SVD on a seeded sample of at "
    "most 10,000 cells of the covariate group, so the 50-dimensional spaces differ slightly",
    "mmd_top_k": "different bandwidth rule: ours is the median distance within the truth "
    "(bandwidth='truth'), the reference's the median over the pooled truth and prediction, "
    "counting coinciding cells (distance 0) too; see mmd_top_k_pooled",
    "mmd_pca": "the bandwidth rule of mmd_top_k, and the PCA basis of energy_pca",
    "mmd_top_k_pooled": "pooled median as in the reference, but ours leaves out pairs of "
    "coinciding cells (distance 0) that the reference keeps: a smaller reference bandwidth "
    "where many cells coincide (sparse top-k genes)",
    "mmd_pca_pooled": "pooled median as in the reference; the PCA basis of energy_pca remains",
    "sinkhorn_top_k": "Sinkhorn settings: ours runs geomloss in float64 with annealing ratio "
    "scaling=0.9, the reference in float32 with geomloss's default 0.5; the iterations stop "
    "at different points of the annealing (see sinkhorn_top_k_scaling05)",
    "sinkhorn_pca": "the Sinkhorn settings of sinkhorn_top_k, and the PCA basis of energy_pca",
    "sinkhorn_top_k_scaling05": "same annealing ratio; float64 (ours) vs float32 (reference) "
    "remains",
    "sinkhorn_pca_scaling05": "float64 vs float32, and the PCA basis of energy_pca",
}

#: Differences that hold on data too large for the reference's all-perturbed sample, or
#: stored in float32 (every generated dataset; the Norman file is float64).
LARGE_DATA_NOTE = (
    "the reference tests the truth against a seeded sample of at most 8192 perturbed cells "
    "(--subsample), ours against all other perturbed cells: where the perturbed cells "
    "outnumber the sample, the truth DE and with it top-k genes, DEG sets and weights "
    "differ; the reference also averages float32 data in float32 (control and perturbation "
    "means), about 1e-7 relative"
)

#: Relative difference below which two values are taken as the same.
TOLERANCE = 1e-9


# --------------------------------------------------------------------- helpers


def relative_difference(ours: Iterable[float], reference: Iterable[float]) -> np.ndarray:
    """Element-wise ``|a - b| / max(|a|, |b|)``.

    Parameters
    ----------
    ours, reference
        Values of the two tools, paired by position.

    Returns
    -------
    numpy.ndarray
        0 where both are equal (both zero, both NaN or equal infinities included),
        infinity where only one of the two is NaN.

    """
    a = np.asarray(list(ours), dtype=np.float64)
    b = np.asarray(list(reference), dtype=np.float64)
    scale = np.maximum(np.abs(a), np.abs(b))
    with np.errstate(invalid="ignore", divide="ignore"):
        difference = np.abs(a - b) / scale
    difference = np.where(a == b, 0.0, difference)
    both_missing = np.isnan(a) & np.isnan(b)
    one_missing = np.isnan(a) ^ np.isnan(b)
    difference = np.where(both_missing, 0.0, difference)
    return np.where(one_missing, np.inf, difference)


def join_values(
    ours: pd.DataFrame, reference: pd.DataFrame, mapping: dict[str, str] | None = None
) -> pd.DataFrame:
    """Pair our per-perturbation values with the reference's through the name map.

    Parameters
    ----------
    ours
        Columns ``protocol, perturbation, value`` (our protocol names).
    reference
        Columns ``protocol, perturbation, value`` (the reference's names).
    mapping
        Our name -> the reference's; :data:`PROTOCOL_MAP` by default.

    Returns
    -------
    pandas.DataFrame
        ``protocol, reference_protocol, perturbation, ours, reference,
        relative_difference`` for every pair found in both tables.

    """
    mapping = PROTOCOL_MAP if mapping is None else mapping
    left = ours[ours["protocol"].isin(mapping)].copy()
    left["reference_protocol"] = left["protocol"].map(mapping)
    right = reference.rename(columns={"protocol": "reference_protocol", "value": "reference"})
    joined = left.rename(columns={"value": "ours"}).merge(
        right[["reference_protocol", "perturbation", "reference"]],
        on=["reference_protocol", "perturbation"],
        how="inner",
    )
    joined["relative_difference"] = relative_difference(joined["ours"], joined["reference"])
    columns = ["protocol", "reference_protocol", "perturbation", "ours", "reference"]
    return joined[[*columns, "relative_difference"]]


def agreement_table(
    joined: pd.DataFrame, reasons: dict[str, str] | None = None, tolerance: float = TOLERANCE
) -> pd.DataFrame:
    """Per protocol pair: how many perturbations, the largest difference, and why.

    Parameters
    ----------
    joined
        The output of :func:`join_values`.
    reasons
        Our protocol name -> why its values differ; :data:`DIFFERENCES` by default.
    tolerance
        Relative difference up to which a protocol counts as agreeing.

    Returns
    -------
    pandas.DataFrame
        ``protocol, reference_protocol, perturbations, max_relative_difference,
        median_relative_difference, agrees, reason``.

    """
    reasons = DIFFERENCES if reasons is None else reasons
    rows = []
    for (ours, theirs), group in joined.groupby(["protocol", "reference_protocol"], sort=False):
        differences = group["relative_difference"].to_numpy()
        largest = float(np.max(differences)) if differences.size else math.nan
        agrees = bool(largest <= tolerance)
        rows.append(
            {
                "protocol": ours,
                "reference_protocol": theirs,
                "perturbations": int(differences.size),
                "max_relative_difference": largest,
                "median_relative_difference": float(np.median(differences)),
                "agrees": agrees,
                "reason": "" if agrees else reasons.get(str(ours), "not explained"),
            }
        )
    return pd.DataFrame(rows)


def markdown_table(frame: pd.DataFrame, float_format: str = "{:.3g}") -> str:
    """A GitHub-flavoured markdown table of ``frame`` (no extra dependency).

    Parameters
    ----------
    frame
        The table.
    float_format
        Format of floating-point cells.

    Returns
    -------
    str
        The table, one line per row.

    """

    def cell(value: Any) -> str:
        if isinstance(value, float):
            if math.isnan(value):
                return "-"
            return float_format.format(value)
        return str(value).replace("|", "\\|")

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join([header, rule, *body])


# ------------------------------------------------------------------ the tools


def ensure_reference_venv(workdir: Path) -> Path:
    """The reference's interpreter, installing it into ``workdir`` the first time.

    Parameters
    ----------
    workdir
        Folder holding the virtual environment ``reference-venv``.

    Returns
    -------
    pathlib.Path
        The venv's ``python``.

    """
    venv = workdir / "reference-venv"
    python = venv / "bin" / "python"
    check = "import geomloss, scperteval; print(scperteval.__version__)"
    if python.exists():
        found = subprocess.run([str(python), "-I", "-c", check], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip() == REFERENCE_VERSION:
            return python
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"installing the reference into {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH_REQUIREMENT], check=True)
    subprocess.run([*pip, REFERENCE_REQUIREMENT], check=True)
    return python


def ensure_norman(workdir: Path, source: Path) -> Path:
    """The ``norman19`` cells of the shared development file, as their own ``.h5ad``.

    Parameters
    ----------
    workdir
        Where the subset is written once.
    source
        The shared development file.

    Returns
    -------
    pathlib.Path
        The subset file (``obs["condition"]`` holds the labels).

    """
    path = workdir / "norman19.h5ad"
    if path.exists():
        return path
    import anndata as ad

    workdir.mkdir(parents=True, exist_ok=True)
    adata = ad.read_h5ad(source)
    adata[adata.obs["dataset"] == "norman19"].copy().write_h5ad(path)
    return path


@dataclass
class Run:
    """One measured process of one tool."""

    tool: str
    dataset: str
    group: str
    measurement: Measurement
    out: Path


def our_command(arguments: list[str]) -> list[str]:
    """Our CLI, run from this checkout with the current interpreter.

    Parameters
    ----------
    arguments
        The CLI's arguments.

    Returns
    -------
    list of str
        The command line.

    """
    launcher = "import sys; from scperteval.cli import main; sys.argv[0] = 'scperteval'; "
    launcher += "sys.exit(main())"
    return [sys.executable, "-c", launcher, *arguments]


def our_environment() -> dict[str, str]:
    """The environment that makes ``import scperteval`` find this checkout.

    Returns
    -------
    dict
        ``os.environ`` with the repository first on ``PYTHONPATH``.

    """
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def reference_environment() -> dict[str, str]:
    """The environment of the reference: none of our checkout on ``PYTHONPATH``.

    The reference also runs with ``python -I``, which keeps the working directory (this
    checkout, with our ``scperteval`` package) off ``sys.path``.

    Returns
    -------
    dict
        ``os.environ`` without ``PYTHONPATH``.

    """
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def run_case(
    tool: str,
    command: list[str],
    env: dict[str, str],
    out: Path,
    timeout: float,
    label: tuple[str, str],
) -> Run:
    """Run one tool once in a fresh process; report and return the measurement.

    Parameters
    ----------
    tool
        ``ours`` or ``reference``.
    command
        The command line.
    env
        Its environment.
    out
        The run's output folder (emptied first).
    timeout
        Seconds before the run is stopped and recorded as timed out.
    label
        ``(dataset, group)`` for the report.

    Returns
    -------
    Run
        The measurement and where the outputs are.

    """
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    measurement = measure_command(command, env, timeout)
    status = "" if measurement.returncode == 0 else f"  (exit {measurement.returncode})"
    if measurement.returncode not in (0, -1):
        status += "\n" + measurement.tail[-800:]
    print(
        f"{label[0]:>7} {label[1]:<12} {tool:<9} {_seconds(measurement.seconds):>9} s "
        f"{measurement.peak_gib:6.2f} GiB{status}",
        flush=True,
    )
    return Run(tool, label[0], label[1], measurement, out)


def _seconds(value: float) -> str:
    return "timed out" if math.isinf(value) else f"{value:.1f}"


def dataset_options(dataset: str, min_cells: int) -> tuple[list[str], list[str]]:
    """The dataset options of our CLI and of the reference's, for one dataset.

    Parameters
    ----------
    dataset
        ``norman``, ``S`` or ``M``.
    min_cells
        Smallest perturbation evaluated, the same for both tools.

    Returns
    -------
    tuple of list of str
        Our options, the reference's options.

    """
    key = "condition" if dataset == "norman" else "perturbation"
    common = ["--perturbation-key", key, "--min-cells", str(min_cells)]
    return common, list(common)


def read_our_values(out: Path) -> pd.DataFrame:
    """Our model's per-perturbation values from a ``score`` output folder.

    Parameters
    ----------
    out
        The folder given to ``scperteval score --out``.

    Returns
    -------
    pandas.DataFrame
        ``protocol, perturbation, value``.

    """
    results = pd.read_parquet(out / "results.parquet")
    model = results[results["source"] == "model"]
    return model[["protocol", "perturbation", "value"]].reset_index(drop=True)


def read_reference_values(out: Path) -> pd.DataFrame:
    """The reference's per-perturbation values from its ``score`` output folder.

    Parameters
    ----------
    out
        The folder given to the reference's ``score --out-dir``.

    Returns
    -------
    pandas.DataFrame
        ``protocol, perturbation, value`` (its ``raw_prediction`` column).

    """
    files = sorted(out.glob("*__score.csv"))
    if not files:
        raise FileNotFoundError(f"no reference score table in {out}")
    table = pd.read_csv(files[-1])
    table = table.rename(columns={"raw_prediction": "value"})
    return table[["protocol", "perturbation", "value"]]


def aligned_suite(workdir: Path) -> Path:
    """``reference_aligned.toml`` plus every protocol of our default suite, in one file.

    Parameters
    ----------
    workdir
        Where the combined suite is written.

    Returns
    -------
    pathlib.Path
        The suite file.

    """
    sys.path.insert(0, str(REPO))
    from scperteval.engine.suites import resolve_protocols

    names = [p.name for p in resolve_protocols("default")]
    path = workdir / "reference_aligned_with_default.toml"
    path.write_text(f"use = {json.dumps(names)}\n" + ALIGNED_SUITE.read_text())
    return path


# ----------------------------------------------------------------------- main


def parse_cases(text: str) -> list[tuple[str, str]]:
    """``"norman:all,S:centroid+de"`` -> ``[("norman", "all"), ("S", "centroid+de")]``.

    Parameters
    ----------
    text
        Comma-separated ``DATASET:GROUP`` pairs; ``DATASET:*`` means every group.

    Returns
    -------
    list of tuple
        The cases in order.

    """
    cases = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        dataset, _, group = item.partition(":")
        groups = GROUPS if group in ("", "*") else (group,)
        for name in groups:
            if name not in REFERENCE_GROUPS:
                raise SystemExit(f"unknown group {name!r}; groups: {', '.join(GROUPS)}")
            cases.append((dataset, name))
    return cases


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and write its tables.

    Parameters
    ----------
    argv
        Command-line arguments (``sys.argv[1:]`` by default).

    Returns
    -------
    int
        0 when every run finished (timed-out runs included), else 1.

    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help="venv, data and runs")
    parser.add_argument("--out", default="refcompare", help="folder for the result tables")
    parser.add_argument(
        "--cases",
        default="norman:*,S:centroid+de",
        help="calibrate runs, DATASET:GROUP (GROUP '*' for all groups); '' for none",
    )
    parser.add_argument(
        "--score-datasets", default="norman", help="datasets timed in score mode ('' for none)"
    )
    parser.add_argument(
        "--agreement", default="norman", help="datasets whose values are compared ('' for none)"
    )
    parser.add_argument("--norman-data", default=str(NORMAN), help="shared development file")
    parser.add_argument("--s-data", default=None, help="use this S file")
    parser.add_argument("--m-data", default=None, help="use this M file")
    parser.add_argument("--min-cells", type=int, default=30, help="for both tools")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    args = parser.parse_args(argv)

    workdir = Path(args.workdir).expanduser().resolve()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = workdir / "runs"
    reference_python = ensure_reference_venv(workdir)
    cases = parse_cases(args.cases)
    score_sets = [d.strip() for d in args.score_datasets.split(",") if d.strip()]
    agreement_sets = [d.strip() for d in args.agreement.split(",") if d.strip()]

    files: dict[str, Path] = {}
    for dataset in [d for d, _ in cases] + score_sets + agreement_sets:
        if dataset in files:
            continue
        if dataset == "norman":
            files[dataset] = ensure_norman(workdir, Path(args.norman_data))
        elif dataset in ("S", "M"):
            given = args.s_data if dataset == "S" else args.m_data
            files[dataset] = ensure_dataset(dataset, workdir, given)
        else:
            raise SystemExit(f"unknown dataset {dataset!r}: norman, S or M")

    groups = protocol_groups()
    runs: list[tuple[Run, Run]] = []
    for dataset, group in cases:
        ours_options, reference_options = dataset_options(dataset, args.min_cells)
        data = str(files[dataset])
        tag = f"{dataset}_{group}"
        our_out = runs_dir / f"ours_{tag}"
        # The reference densifies every cell of a population: no cap, like for like.
        ours = our_command(
            ["calibrate", data, "-p", groups[group], "--max-population-cells", "all", *ours_options]
        )
        theirs_out = runs_dir / f"reference_{tag}"
        theirs = [str(reference_python), "-I", "-m", "scperteval", "calibrate", data]
        theirs += ["-p", REFERENCE_GROUPS[group], *reference_options, "--quiet"]
        runs.append(
            (
                run_case(
                    "ours",
                    [*ours, "--out", str(our_out)],
                    our_environment(),
                    our_out,
                    args.timeout,
                    (dataset, group),
                ),
                run_case(
                    "reference",
                    [*theirs, "--out-dir", str(theirs_out)],
                    reference_environment(),
                    theirs_out,
                    args.timeout,
                    (dataset, group),
                ),
            )
        )

    def prediction_for(dataset: str) -> Path:
        key = "condition" if dataset == "norman" else "perturbation"
        return ensure_prediction(files[dataset], workdir, key)

    scored: dict[str, tuple[Run, Run]] = {}
    for dataset in dict.fromkeys(score_sets + agreement_sets):
        ours_options, reference_options = dataset_options(dataset, args.min_cells)
        data = files[dataset]
        prediction = prediction_for(dataset)
        our_out = runs_dir / f"ours_{dataset}_score"
        ours = our_command(
            ["score", str(data), "--pred", f"mean={prediction}", "-p", "all", "--truth", "all"]
            + ["--no-baselines", "--no-figures", "--max-population-cells", "all"]
            + [*ours_options, "--out", str(our_out)]
        )
        theirs_out = runs_dir / f"reference_{dataset}_score"
        theirs = [
            str(reference_python),
            "-I",
            "-m",
            "scperteval",
            "score",
            str(data),
            str(prediction),
        ]
        theirs += ["-p", "all", *reference_options, "--quiet", "--out-dir", str(theirs_out)]
        pair = (
            run_case("ours", ours, our_environment(), our_out, args.timeout, (dataset, "score")),
            run_case(
                "reference",
                theirs,
                reference_environment(),
                theirs_out,
                args.timeout,
                (dataset, "score"),
            ),
        )
        scored[dataset] = pair
        if dataset in score_sets:
            runs.append(pair)

    timing = timing_table(runs)
    write_table(timing, out / "timings")
    print()
    print(markdown_table(timing))

    suite = aligned_suite(workdir)
    for dataset in agreement_sets:
        ours_run, reference_run = scored[dataset]
        if ours_run.measurement.returncode or reference_run.measurement.returncode:
            print(f"{dataset}: a score run failed, no value comparison", flush=True)
            continue
        ours_options, _ = dataset_options(dataset, args.min_cells)
        data = files[dataset]
        prediction = prediction_for(dataset)
        aligned_out = runs_dir / f"ours_{dataset}_score_aligned"
        aligned = our_command(
            ["score", str(data), "--pred", f"mean={prediction}", "-p", str(suite)]
            + ["--truth", "all", "--no-baselines", "--no-figures", *ours_options]
            + ["--max-population-cells", "all", "--out", str(aligned_out)]
        )
        aligned_run = run_case(
            "ours", aligned, our_environment(), aligned_out, args.timeout, (dataset, "aligned")
        )
        ours_values = read_our_values(
            aligned_out if aligned_run.measurement.returncode == 0 else ours_run.out
        )
        joined = join_values(ours_values, read_reference_values(reference_run.out))
        table = agreement_table(joined)
        if dataset != "norman":
            table["reason"] = [
                (reason + "; " if reason else "") + LARGE_DATA_NOTE if not agrees else reason
                for reason, agrees in zip(table["reason"], table["agrees"], strict=True)
            ]
        joined.to_csv(out / f"values_{dataset}.csv", index=False)
        write_table(table, out / f"agreement_{dataset}")
        print(f"\nvalue agreement on {dataset} (score mode, one model)")
        print(markdown_table(table.drop(columns="reason")))
    unmatched = pd.DataFrame([{"protocol": name, "note": note} for name, note in UNMATCHED.items()])
    write_table(unmatched, out / "unmatched")
    failed = [r for pair in runs for r in pair if r.measurement.returncode not in (0, -1)]
    return 1 if failed else 0


def timing_table(runs: list[tuple[Run, Run]]) -> pd.DataFrame:
    """Wall time and peak memory of each case, with the ratios.

    Parameters
    ----------
    runs
        ``(ours, reference)`` per case.

    Returns
    -------
    pandas.DataFrame
        ``dataset, group, ours_s, reference_s, time_ratio, ours_gib, reference_gib,
        memory_ratio, note``; time_ratio is reference / ours, memory_ratio ours /
        reference, a time is infinite when the run timed out.

    """
    rows = []
    for ours, theirs in runs:
        a, b = ours.measurement, theirs.measurement
        notes = [
            f"{tool} exit {m.returncode}" if m.returncode != -1 else f"{tool} timed out"
            for tool, m in (("ours", a), ("reference", b))
            if m.returncode
        ]
        ok = a.returncode == 0 and b.returncode == 0
        rows.append(
            {
                "dataset": ours.dataset,
                "group": ours.group,
                "ours_s": a.seconds,
                "reference_s": b.seconds,
                "time_ratio": b.seconds / a.seconds if ok else math.nan,
                "ours_gib": a.peak_gib,
                "reference_gib": b.peak_gib,
                "memory_ratio": a.peak_gib / b.peak_gib if ok and b.peak_gib else math.nan,
                "note": "; ".join(notes),
            }
        )
    return pd.DataFrame(rows)


def write_table(frame: pd.DataFrame, stem: Path) -> None:
    """Write ``frame`` as ``STEM.csv`` and ``STEM.md``.

    Parameters
    ----------
    frame
        The table.
    stem
        Path without suffix.

    """
    frame.to_csv(stem.with_suffix(".csv"), index=False)
    stem.with_suffix(".md").write_text(markdown_table(frame) + "\n")


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"\ndone in {time.perf_counter() - started:.0f} s")
    sys.exit(code)
