#!/usr/bin/env python
"""Compare scperteval's ``cell_eval`` suite with cell-eval 0.8.2, value for value and in cost.

cell-eval is installed into its own virtual environment under ``--workdir`` (once,
then reused): ``torch==2.13.0`` first, so that pip keeps the CPU wheel found on local
disk if anything asks for torch, then ``cell-eval==0.8.2``.

Both tools score the same files:

- **Values** (``--agreement``, default ``norman``): three models of the dataset, each
  with the measured control cells copied in (so cell-eval's deltas against the
  predicted control are the deltas against the measured one): ``noisy`` (truth cells
  plus Gaussian noise, from ``../shared/bench/make_predictions.py``), ``mean``
  (cell-eval's own mean baseline, ``cell-eval baseline``) and ``shuffled`` (truth
  cells with their perturbation labels permuted). cell-eval runs ``--profile full``
  per model; scperteval runs ``score -p cell_eval --truth all --no-baselines`` once
  with all three. The per-perturbation values are joined on (metric, model,
  perturbation) and the table gives, per metric, the largest absolute and relative
  difference, or the documented reason of a difference (:data:`REASONS`). Then the
  baseline-scaled challenge score: ``cell-eval score`` of ``noisy`` and ``shuffled``
  against ``mean`` on cell-eval's aggregated results, next to
  :func:`scperteval.scoring.vcc.vcc_scores` on scperteval's table, for the
  challenge's three metrics (``vcc``) and for every scored metric (``full``).
- **Predicted control** (with ``--agreement``): a fourth model, ``shifted``, is
  ``noisy`` with its control cells moved (each gene shifted by a constant, clipped
  at 0), so that its predicted control mean differs from the measured one.
  cell-eval takes its deltas and DE against those cells; scperteval scores it
  twice, by default (the measured control: the values differ) and with
  ``--control-from-predictions`` (its own control: they must agree to 1e-6, with
  the reasons of the first table). The table gives both differences per metric.
- **Leaderboard column** (with ``--agreement``): ``scperteval score -p vcc2025
  --truth all`` of the four models, with the built-in baselines (which add
  ``cell_eval_mean``), with and without ``--control-from-predictions``; each
  model's ``vcc_score`` in ``leaderboard.csv`` next to ``cell-eval score`` of its
  aggregated results against those of cell-eval's mean baseline.
- **Cost** (``--speed``, default ``S``): one model (``noisy``), ``cell-eval run
  --profile full`` against ``scperteval score -p cell_eval --truth all
  --no-baselines``, each in a fresh process under ``/usr/bin/time -v`` with
  ``--threads`` threads (cell-eval's numba and BLAS pools; scperteval's task threads,
  one BLAS thread each): wall time,
  peak resident memory and the ratios (time: cell-eval / ours, above 1 we are
  faster; memory: ours / cell-eval, below 1 we use less).

Datasets: ``norman`` (the ``norman19`` subset of the shared development file) and
``S`` (the shared generator's small size with ``--gene-prefix GENE``, so that each
perturbation's label is its target gene's name and the target-gene rules apply).

Examples
--------
Everything with the defaults::

    python benchmarks/compare_cell_eval.py --out cellevalcompare

Values only, on both datasets, with two threads for each tool::

    python benchmarks/compare_cell_eval.py --agreement norman,S --speed none --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_calibrate import (  # noqa: E402
    MAKE_DATASET,
    MAKE_PREDICTIONS,
    NORMAN,
    REPO,
    SIZES,
    Measurement,
    measure_command,
)

CELL_EVAL_REQUIREMENT = "cell-eval==0.8.2"
#: Installed before cell-eval so that pip keeps this CPU build if torch is asked for.
TORCH_REQUIREMENT = "torch==2.13.0"
DEFAULT_WORKDIR = Path.home() / ".cache" / "scperteval-bench"
PERT_COL = {"norman": "condition", "S": "perturbation"}
CONTROL = "control"
MODELS = ("noisy", "mean", "shuffled")
#: The model whose predicted control cells differ from the measured ones.
SHIFTED = "shifted"
#: Standard deviation of the per-gene shift of the shifted model's control cells.
CONTROL_SHIFT_SD = 0.15
#: The challenge's terms, as cell-eval's aggregated results name them.
VCC_METRICS = ("mae", "discrimination_score_l1", "overlap_at_N")
#: Metrics of cell-eval without a protocol here, and why.
NOT_COMPARED: dict[str, str] = {}
#: Known reasons for a difference beyond float32 rounding, per metric.
REASONS = {
    "overlap_at_N": "order of genes tied in |log2FC| (infinite fold changes) follows the DE "
    "table's row order; a float32 tie in a finite fold change can fall either way",
    "precision_at_N": "as overlap_at_N",
    "discrimination_score_l1": "ties in distance: cell-eval takes numpy's argsort order, "
    "scperteval counts ties against the prediction; combinations A+B: cell-eval excludes "
    "no gene, scperteval both targets",
}
_FLOAT32 = (
    "float32 rounding in cell-eval: scperteval's value equals the float64 textbook value "
    "(mean of the squared centroid differences) to 1e-13"
)
for _m in ("mse", "mae", "mse_delta", "mae_delta", "pearson_delta"):
    REASONS[_m] = _FLOAT32
for _k in (50, 100, 200, 500):
    REASONS[f"overlap_at_{_k}"] = REASONS["overlap_at_N"]
    REASONS[f"precision_at_{_k}"] = REASONS["overlap_at_N"]
for _d in ("l2", "cosine"):
    REASONS[f"discrimination_score_{_d}"] = REASONS["discrimination_score_l1"]
REASONS["clustering_agreement"] = (
    "model 'mean' only: its predicted centroids are one vector, which cell-eval's numpy "
    "means reproduce only to rounding, so its clusters are rounding noise; on cell-eval's "
    "centroids scperteval gives cell-eval's value (table 'clustering_agreement on "
    "cell-eval's centroids')"
)
#: Relative difference tolerated as float32 rounding (cell-eval stores DE in float32).
TOLERANCE = 1e-6


def ensure_cell_eval_venv(workdir: Path) -> Path:
    """The venv's ``python`` with cell-eval installed (created on first use).

    Parameters
    ----------
    workdir
        Folder holding the virtual environment ``cell-eval``.

    Returns
    -------
    Path
        The venv's ``python``.

    """
    venv = workdir / "cell-eval"
    python = venv / "bin" / "python"
    if python.exists():
        found = subprocess.run(
            [
                str(python),
                "-I",
                "-c",
                "import cell_eval, importlib.metadata as m;print(m.version('cell-eval'))",
            ],
            capture_output=True,
            text=True,
        )
        if found.returncode == 0 and found.stdout.strip() == "0.8.2":
            return python
    print(f"installing {CELL_EVAL_REQUIREMENT} into {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, TORCH_REQUIREMENT], check=True)
    subprocess.run([*pip, CELL_EVAL_REQUIREMENT], check=True)
    return python


def ensure_data(name: str, workdir: Path, given: str | None) -> Path:
    """The truth file of a dataset, written once to ``workdir``."""
    path = Path(given) if given else workdir / f"cell_eval_{name}.h5ad"
    if path.exists():
        return path
    workdir.mkdir(parents=True, exist_ok=True)
    if name == "norman":
        import anndata as ad

        adata = ad.read_h5ad(NORMAN)
        adata = adata[adata.obs["dataset"] == "norman19"].copy()
        adata.obs = adata.obs[["condition"]].astype(str)
        adata.write_h5ad(path)
    else:
        command = [sys.executable, str(MAKE_DATASET), *SIZES[name], "--gene-prefix", "GENE"]
        subprocess.run([*command, "--out", str(path)], check=True)
    return path


def ensure_models(name: str, data: Path, workdir: Path, python: Path) -> dict[str, Path]:
    """The three models' prediction files for ``data`` (each with the control cells)."""
    import anndata as ad

    folder = workdir / f"cell_eval_{name}_models"
    paths = {model: folder / f"{model}.h5ad" for model in MODELS}
    if all(p.exists() for p in paths.values()):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    key = PERT_COL[name]
    subprocess.run(
        [sys.executable, str(MAKE_PREDICTIONS), str(data), "--out-dir", str(folder)]
        + ["--perturbation-key", key, "--models", "noisy_truth"],
        check=True,
    )
    (made,) = sorted(folder.glob("*__pred_noisy_truth.h5ad"))
    made.rename(paths["noisy"])
    baseline = (
        "from cell_eval._baseline import build_base_mean_adata;"
        f"build_base_mean_adata({str(data)!r}, pert_col={key!r}, control_pert={CONTROL!r},"
        f" output_path={str(paths['mean'])!r})"
    )
    subprocess.run([str(python), "-I", "-c", baseline], check=True)
    truth = ad.read_h5ad(data)
    labels = truth.obs[key].astype(str).to_numpy().copy()
    perturbed = np.flatnonzero(labels != CONTROL)
    labels[perturbed] = labels[np.random.default_rng(0).permutation(perturbed)]
    truth.obs = pd.DataFrame({key: labels}, index=truth.obs_names)
    truth.write_h5ad(paths["shuffled"])
    return paths


def ensure_shifted(name: str, noisy: Path, workdir: Path) -> Path:
    """``noisy`` with its control cells shifted per gene (written once, in float64).

    ``noisy`` is stored in float32, in which cell-eval takes its centroids and the
    Pearson correlation of their deltas; in float64 the comparison sees the
    definitions rather than float32 rounding.
    """
    import anndata as ad
    import scipy.sparse as sp

    path = workdir / f"cell_eval_{name}_models" / f"{SHIFTED}.h5ad"
    if path.exists():
        return path
    adata = ad.read_h5ad(noisy)
    matrix = np.asarray(adata.X.toarray() if sp.issparse(adata.X) else adata.X, np.float64)
    control = (adata.obs[PERT_COL[name]].astype(str) == CONTROL).to_numpy()
    shift = np.random.default_rng(1).normal(0.0, CONTROL_SHIFT_SD, matrix.shape[1])
    matrix[control] = np.clip(matrix[control] + shift, 0.0, None)
    adata.X = sp.csr_matrix(matrix.astype(np.float64))
    adata.write_h5ad(path)
    return path


def run_cell_eval(
    python: Path, data: Path, pred: Path, key: str, out: Path, threads: int, timeout: float
) -> Measurement:
    """``cell-eval run --profile full`` in a fresh process, measured."""
    command = [str(python), "-I", "-m", "cell_eval", "run", "-ap", str(pred), "-ar", str(data)]
    command += ["--control-pert", CONTROL, "--pert-col", key, "--profile", "full"]
    command += ["-o", str(out), "--num-threads", str(threads)]
    return measure_command(command, _environment(threads), timeout)


def run_ours(
    data: Path,
    preds: dict[str, Path],
    key: str,
    out: Path,
    threads: int,
    timeout: float,
    protocols: str = "cell_eval",
    options: tuple[str, ...] = ("--no-baselines",),
) -> Measurement:
    """``scperteval score -p cell_eval --truth all --no-baselines``, measured."""
    launcher = "import sys; from scperteval.cli import main; sys.argv[0] = 'scperteval'; "
    launcher += "sys.exit(main())"
    command = [sys.executable, "-c", launcher, "score", str(data), "-p", protocols]
    for model, path in preds.items():
        command += ["--pred", f"{model}={path}"]
    command += ["--truth", "all", *options, "--no-figures", "--perturbation-key", key]
    command += ["--workers", str(threads), "--out", str(out)]
    # scperteval runs its tasks on ``threads`` threads: one BLAS thread each keeps
    # the total at ``threads`` (cell-eval's numba and BLAS pools get ``threads``).
    env = _environment(threads)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = "1"
    env["PYTHONPATH"] = str(REPO)
    return measure_command(command, env, timeout)


def _environment(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(threads)
    env["NUMBA_NUM_THREADS"] = str(threads)
    return env


def _our_results(out: Path) -> pd.DataFrame:
    for name in ("results.parquet", "results.csv", "results.tsv"):
        path = out / name
        if path.exists():
            if path.suffix == ".parquet":
                return pd.read_parquet(path)
            return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",")
    raise FileNotFoundError(f"no results table in {out}")


def _cell_eval_values(
    python: Path, data: Path, pred: Path, key: str, folder: Path, threads: int, timeout: float
) -> pd.DataFrame:
    """cell-eval's per-perturbation values of one model (``metric, perturbation, value``)."""
    if not (folder / "results.csv").exists():
        done = run_cell_eval(python, data, pred, key, folder, threads, timeout)
        if done.returncode != 0:
            raise RuntimeError(f"cell-eval failed on {pred}: {done.tail}")
    table = pd.read_csv(folder / "results.csv")
    return table.melt(id_vars="perturbation", var_name="metric")


def _our_values(
    data: Path,
    preds: dict[str, Path],
    key: str,
    out: Path,
    threads: int,
    timeout: float,
    **options: object,
) -> pd.DataFrame:
    """scperteval's model rows (``metric, model, perturbation, ours, reason``) of a run."""
    done = run_ours(data, preds, key, out, threads, timeout, **options)  # type: ignore[arg-type]
    if done.returncode != 0:
        raise RuntimeError(f"scperteval failed: {done.tail}")
    ours = _our_results(out)
    ours = ours[ours["source"] == "model"].rename(
        columns={"protocol": "metric", "source_name": "model", "value": "ours"}
    )
    return ours[["metric", "model", "perturbation", "ours", "reason"]]


def _difference(a: np.ndarray, b: np.ndarray) -> dict[str, float | int]:
    """NaN mismatches, largest absolute and relative difference, count beyond tolerance."""
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = int((np.isnan(a) ^ np.isnan(b)).sum())
    diff = np.where(both_nan, 0.0, np.abs(a - b))
    scale = np.maximum(np.abs(a), np.abs(b))
    rel = np.where(both_nan | (diff == 0), 0.0, diff / np.where(scale > 0, scale, 1.0))
    return {
        "nan_mismatch": one_nan,
        "max_abs": float(np.nanmax(diff)) if diff.size else 0.0,
        "max_rel": float(np.nanmax(rel)) if rel.size else 0.0,
        "n_differ": int((rel > TOLERANCE).sum()),
    }


def _restrict(path: Path, metrics: tuple[str, ...], out: Path) -> Path:
    table = pd.read_csv(path)
    table[["statistic", *metrics]].to_csv(out, index=False)
    return out


def _cell_eval_score(
    python: Path, user: Path, base: Path, metrics: tuple[str, ...], folder: Path
) -> pd.Series:
    """``cell-eval score`` of one model's aggregated results against the baseline's."""
    folder.mkdir(parents=True, exist_ok=True)
    restricted = [
        _restrict(path, metrics, folder / f"{label}.csv")
        for label, path in (("user", user), ("base", base))
    ]
    out = folder / "baseline_diff.csv"
    command = [str(python), "-I", "-m", "cell_eval", "score", "-i", str(restricted[0])]
    command += ["-I", str(restricted[1]), "-o", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    return pd.read_csv(out).set_index("metric")["from_baseline"]


def agreement(
    name: str, workdir: Path, python: Path, data: Path, threads: int, timeout: float
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-metric agreement and the VCC scores of both tools on one dataset."""
    from scperteval.scoring.vcc import BEST_ONE, BEST_ZERO, vcc_scores

    key = PERT_COL[name]
    preds = ensure_models(name, data, workdir, python)
    runs = workdir / f"cell_eval_{name}_runs"
    theirs = [
        _cell_eval_values(
            python, data, path, key, runs / f"cell_eval_{model}", threads, timeout
        ).assign(model=model)
        for model, path in preds.items()
    ]
    ours = _our_values(data, preds, key, runs / "scperteval", threads, timeout)
    joined = (
        pd.concat(theirs)
        .rename(columns={"value": "cell_eval"})
        .merge(ours.drop(columns="reason"), on=["metric", "model", "perturbation"], how="outer")
    )
    rows = []
    for metric, block in joined.groupby("metric", sort=True):
        if metric in NOT_COMPARED:
            rows.append({"metric": metric, "note": NOT_COMPARED[metric]})
            continue
        found = _difference(block["cell_eval"].to_numpy(float), block["ours"].to_numpy(float))
        agree = found["nan_mismatch"] == 0 and found["max_rel"] <= TOLERANCE
        rows.append(
            {
                "metric": metric,
                "n": len(block),
                **found,
                "agree": agree,
                "note": "" if agree else REASONS.get(str(metric), "UNEXPLAINED"),
            }
        )
    table = pd.DataFrame(rows)
    scores = []
    # "full": every metric both tools have, as cell-eval's own full score.
    common = tuple(sorted(set(joined["metric"]) - set(NOT_COMPARED)))
    for model in ("noisy", "shuffled"):
        their_agg = {m: runs / f"cell_eval_{m}" / "agg_results.csv" for m in (model, "mean")}
        for profile, metrics in (("vcc", VCC_METRICS), ("full", common)):
            theirs_score = _cell_eval_score(
                python,
                their_agg[model],
                their_agg["mean"],
                metrics,
                runs / f"score_{profile}_{model}",
            )
            subset = ours[ours["metric"].isin(metrics)]
            ours_score = vcc_scores(
                subset.rename(
                    columns={"metric": "protocol", "model": "source_name", "ours": "value"}
                ),
                baseline="mean",
                models=[model],
            ).loc[model]
            scored = [m for m in ours_score.index if m in BEST_ONE | BEST_ZERO]
            per_metric = max(
                abs(float(theirs_score[m]) - float(ours_score[m]))
                for m in scored
                if m in theirs_score.index
            )
            scores.append(
                {
                    "model": model,
                    "profile": profile,
                    "cell_eval": float(theirs_score["avg_score"]),
                    "ours": float(ours_score["avg_score"]),
                    "abs_diff": abs(
                        float(theirs_score["avg_score"]) - float(ours_score["avg_score"])
                    ),
                    "metrics": len(scored),
                    "max_metric_diff": per_metric,
                }
            )
    return table, pd.DataFrame(scores)


def predicted_control(
    name: str, workdir: Path, python: Path, data: Path, threads: int, timeout: float
) -> pd.DataFrame:
    """Per metric, how far each of scperteval's two modes is from cell-eval on ``shifted``."""
    key = PERT_COL[name]
    shifted = ensure_shifted(name, ensure_models(name, data, workdir, python)["noisy"], workdir)
    runs = workdir / f"cell_eval_{name}_runs"
    theirs = _cell_eval_values(
        python, data, shifted, key, runs / f"cell_eval_{SHIFTED}", threads, timeout
    ).rename(columns={"value": "cell_eval"})
    joined = theirs
    for mode, options in (
        ("default", ("--no-baselines",)),
        ("option", ("--no-baselines", "--control-from-predictions")),
    ):
        ours = _our_values(
            data,
            {SHIFTED: shifted},
            key,
            runs / f"scperteval_{SHIFTED}_{mode}",
            threads,
            timeout,
            options=options,
        )
        joined = joined.merge(
            ours.drop(columns=["model", "reason"]).rename(columns={"ours": mode}),
            on=["metric", "perturbation"],
            how="outer",
        )
    rows = []
    for metric, block in joined.groupby("metric", sort=True):
        if metric in NOT_COMPARED:
            continue
        a = block["cell_eval"].to_numpy(float)
        default = _difference(a, block["default"].to_numpy(float))
        option = _difference(a, block["option"].to_numpy(float))
        agree = option["nan_mismatch"] == 0 and option["max_rel"] <= TOLERANCE
        rows.append(
            {
                "metric": metric,
                "n": len(block),
                "default_max_rel": default["max_rel"],
                "default_nan_mismatch": default["nan_mismatch"],
                "option_max_rel": option["max_rel"],
                "option_nan_mismatch": option["nan_mismatch"],
                "option_agrees": agree,
                "note": "" if agree else REASONS.get(str(metric), "UNEXPLAINED"),
            }
        )
    return pd.DataFrame(rows)


def leaderboard_column(
    name: str, workdir: Path, python: Path, data: Path, threads: int, timeout: float
) -> pd.DataFrame:
    """Each model's ``vcc_score`` in scperteval's leaderboard next to ``cell-eval score``."""
    key = PERT_COL[name]
    preds = ensure_models(name, data, workdir, python)
    models = {**preds, SHIFTED: ensure_shifted(name, preds["noisy"], workdir)}
    runs = workdir / f"cell_eval_{name}_runs"
    boards = {}
    for mode, options in (("default", ()), ("option", ("--control-from-predictions",))):
        out = runs / f"scperteval_vcc_{mode}"
        done = run_ours(
            data, models, key, out, threads, timeout, protocols="vcc2025", options=options
        )
        if done.returncode != 0:
            raise RuntimeError(f"scperteval failed: {done.tail}")
        boards[mode] = pd.read_csv(out / "leaderboard.csv").set_index("model")["vcc_score"]
    rows = []
    base = runs / "cell_eval_mean" / "agg_results.csv"
    for model in models:
        # Run by predicted_control for the shifted model, by agreement for the others.
        user = runs / f"cell_eval_{model}" / "agg_results.csv"
        theirs = float(
            _cell_eval_score(python, user, base, VCC_METRICS, runs / f"score_board_{model}")[
                "avg_score"
            ]
        )
        rows.append(
            {
                "model": model,
                "cell_eval_score": theirs,
                "vcc_score_option": float(boards["option"][model]),
                "abs_diff_option": abs(theirs - float(boards["option"][model])),
                "vcc_score_default": float(boards["default"][model]),
                "abs_diff_default": abs(theirs - float(boards["default"][model])),
            }
        )
    return pd.DataFrame(rows)


def clustering_on_their_centroids(name: str, workdir: Path, data: Path) -> pd.DataFrame:
    """``clustering_agreement`` of each model on cell-eval's own centroids, next to its value.

    The centroids are what cell-eval clusters: float64 numpy means of each label's cells,
    the control left out, in sorted label order. Isolates the clustering from the way
    each tool averages cells (which matters for points equal up to rounding).
    """
    import anndata as ad
    import scipy.sparse as sp

    from scperteval.metrics.clustering import clustering_agreement

    key = PERT_COL[name]

    def centroids(path: Path) -> tuple[np.ndarray, np.ndarray]:
        adata = ad.read_h5ad(path)
        matrix = adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)
        labels = adata.obs[key].astype(str).to_numpy()
        names = np.unique(labels[labels != CONTROL])
        rows = [matrix[labels == label].astype(np.float64).mean(axis=0) for label in names]
        return names, np.vstack(rows)

    names, truth = centroids(data)
    rows = []
    for model in MODELS:
        path = workdir / f"cell_eval_{name}_models" / f"{model}.h5ad"
        predicted_names, pred = centroids(path)
        if not np.array_equal(names, predicted_names):
            raise RuntimeError(f"model {model} predicts other perturbations than the truth")
        ours = float(clustering_agreement(truth, pred)[0])
        results = workdir / f"cell_eval_{name}_runs" / f"cell_eval_{model}" / "results.csv"
        theirs = pd.read_csv(results)["clustering_agreement"].unique()
        rows.append(
            {
                "model": model,
                "cell_eval": float(theirs[0]),
                "ours": ours,
                "abs_diff": abs(float(theirs[0]) - ours),
                "one_value": len(theirs) == 1,
            }
        )
    return pd.DataFrame(rows)


def speed(name: str, workdir: Path, python: Path, data: Path, threads: int, timeout: float) -> dict:
    """Wall time and peak memory of both tools on one model of one dataset."""
    key = PERT_COL[name]
    pred = ensure_models(name, data, workdir, python)["noisy"]
    runs = workdir / f"cell_eval_{name}_speed"
    theirs = run_cell_eval(python, data, pred, key, runs / "cell_eval", threads, timeout)
    ours = run_ours(data, {"noisy": pred}, key, runs / "scperteval", threads, timeout)
    return {
        "dataset": name,
        "cell_eval_s": theirs.seconds,
        "cell_eval_gib": theirs.peak_gib,
        "ours_s": ours.seconds,
        "ours_gib": ours.peak_gib,
        "time_ratio": theirs.seconds / ours.seconds,
        "memory_ratio": ours.peak_gib / theirs.peak_gib,
        "cell_eval_rc": theirs.returncode,
        "ours_rc": ours.returncode,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help="venv, data and runs")
    parser.add_argument("--agreement", default="norman", help="datasets (norman,S) or none")
    parser.add_argument("--speed", default="S", help="datasets (norman,S) or none")
    parser.add_argument("--s-data", help="an S file made by make_dataset.py --gene-prefix GENE")
    parser.add_argument("--threads", type=int, default=2, help="threads of each tool")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--out", help="folder for the tables (JSON and CSV)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    python = ensure_cell_eval_venv(workdir)
    given = {"S": args.s_data}
    report: dict[str, object] = {}
    pd.set_option("display.width", 200)
    pd.set_option("display.max_colwidth", 90)
    for name in [n for n in args.agreement.split(",") if n and n != "none"]:
        data = ensure_data(name, workdir, given.get(name))
        table, scores = agreement(name, workdir, python, data, args.threads, args.timeout)
        print(f"\n== values on {name}: cell-eval 0.8.2 vs scperteval (-p cell_eval --truth all)")
        print(table.to_string(index=False))
        print(f"\n== baseline-scaled score on {name} (baseline: cell-eval's mean model)")
        print(scores.to_string(index=False))
        report[f"agreement_{name}"] = table.to_dict("records")
        report[f"scores_{name}"] = scores.to_dict("records")
        clusters = clustering_on_their_centroids(name, workdir, data)
        print(f"\n== clustering_agreement on cell-eval's centroids ({name}): numpy means")
        print(clusters.to_string(index=False))
        report[f"clustering_{name}"] = clusters.to_dict("records")
        control = predicted_control(name, workdir, python, data, args.threads, args.timeout)
        print(
            f"\n== predicted control on {name}: model {SHIFTED!r} (control cells shifted), "
            "cell-eval vs scperteval by default and with --control-from-predictions"
        )
        print(control.to_string(index=False))
        column = leaderboard_column(name, workdir, python, data, args.threads, args.timeout)
        print(
            f"\n== leaderboard vcc_score on {name} (score -p vcc2025 --truth all) vs "
            "cell-eval score against cell-eval's mean baseline"
        )
        print(column.to_string(index=False))
        report[f"predicted_control_{name}"] = control.to_dict("records")
        report[f"leaderboard_{name}"] = column.to_dict("records")
    rows = []
    for name in [n for n in args.speed.split(",") if n and n != "none"]:
        data = ensure_data(name, workdir, given.get(name))
        rows.append(speed(name, workdir, python, data, args.threads, args.timeout))
    if rows:
        print(
            "\n== cost: cell-eval run --profile full vs scperteval score -p cell_eval --truth all"
        )
        print(pd.DataFrame(rows).to_string(index=False))
        report["speed"] = rows
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare_cell_eval.json").write_text(json.dumps(report, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
