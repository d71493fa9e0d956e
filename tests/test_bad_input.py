"""Bad input on the command line: refused before any work, in one line, with exit code 2.

Every case is one row of :data:`CASES`: the arguments (``{data}``, ``{out}``,
``{tmp}`` and ``{bad}`` are filled in with a small generated dataset, a fresh
output folder, the test's temporary folder and a folder of malformed files)
and a pattern the error line must match. Each case must exit with code 2,
print exactly one ``error:`` line and no traceback, and leave nothing at
``{out}``. A new input, option or file format adds its bad cases here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scperteval.cli import main
from scperteval.errors import DatasetError, SpecError


@pytest.fixture(scope="module")
def small_path(tmp_path_factory) -> Path:
    from scperteval.simulation import simulate

    adata = simulate(n_perturbations=4, n_genes=30, cells_per_perturbation=12, seed=3)
    path = tmp_path_factory.mktemp("bad_input") / "small.h5ad"
    adata.write_h5ad(path)
    return path


@pytest.fixture(scope="module")
def bad_files(small_path) -> Path:
    """Malformed prediction and DE files for the small dataset, in one folder."""
    import anndata as ad
    import numpy as np
    import pandas as pd

    folder = small_path.parent / "bad_files"
    folder.mkdir()
    truth = ad.read_h5ad(small_path)
    genes = list(truth.var_names)
    labels = sorted(set(truth.obs["perturbation"].astype(str)) - {"control"})
    good = pd.DataFrame(np.full((len(labels), len(genes)), 0.5), columns=genes)
    good.insert(0, "perturbation", labels)
    (folder / "model.xyz").write_text("x")
    good.drop(columns="perturbation").to_csv(folder / "nolabels.csv", index=False)
    signs = np.where(np.arange(len(genes)) % 2 == 0, 0.3, -0.3)
    changes = pd.DataFrame(np.tile(signs, (len(labels), 1)), columns=genes)
    changes.insert(0, "perturbation", labels)
    changes.to_csv(folder / "negative.csv", index=False)
    good.assign(**{genes[0]: 300.0}).to_csv(folder / "counts.csv", index=False)
    good.assign(**{genes[1]: "x"}).to_csv(folder / "text.csv", index=False)
    good.rename(columns={genes[0]: genes[0].lower()}).to_csv(folder / "case.csv", index=False)
    good.to_csv(folder / "good.csv", index=False)
    np.savez(folder / "lacking.npz", X=np.zeros((2, 2)))
    (folder / "broken.parquet").write_text("not parquet")
    stored = small_path.read_bytes()
    (folder / "truncated.h5ad").write_bytes(stored[: len(stored) // 2])
    damaged_h5ad = bytearray(stored)
    damaged_h5ad[len(stored) // 4 : 3 * len(stored) // 4] = bytes(len(stored) // 2)
    (folder / "damaged.h5ad").write_bytes(bytes(damaged_h5ad))
    (folder / "table.h5ad").write_text("cell,gene\n1,2\n")
    (folder / "empty.toml").write_text('description = "no protocols"\n')
    (folder / "binary.toml").write_bytes(bytes(range(256)))
    (folder / "a_file").write_text("not a folder")

    calibrated = folder / "calibrate_run"
    calibrated.mkdir()
    (calibrated / "run.json").write_text('{"command": "calibrate", "options": {}}')
    pd.DataFrame({"value": [1.0]}).to_parquet(calibrated / "results.parquet")
    pd.DataFrame({"protocol": ["mse"]}).to_csv(calibrated / "protocols.csv", index=False)
    damaged = folder / "damaged_run"
    damaged.mkdir()
    (damaged / "run.json").write_text('{"command": "score", "options": {}}')
    (damaged / "results.parquet").write_text("not parquet")
    (damaged / "protocols.csv").write_text("protocol\nmse\n")

    def unlabel(adata):
        labels = adata.obs["perturbation"].astype(object).copy()
        labels.iloc[5] = None
        adata.obs = adata.obs.assign(perturbation=labels)

    for name, change in {
        "unlabelled": unlabel,
        "constant": lambda a: setattr(a, "X", np.ones(a.shape, dtype=np.float32)),
        "huge": lambda a: setattr(a, "X", np.asarray(a.X.todense()) * 1e30 + 0.5),
        "one_control": lambda a: None,
        "one_perturbation": lambda a: None,
        "three_genes": lambda a: None,
    }.items():
        adata = truth.copy()
        if name == "one_control":
            controls = np.flatnonzero(adata.obs["perturbation"].astype(str) == "control")
            adata = adata[np.setdiff1d(np.arange(adata.n_obs), controls[1:])].copy()
        if name == "one_perturbation":
            labels = adata.obs["perturbation"].astype(str)
            first = sorted(set(labels) - {"control"})[0]
            adata = adata[labels.isin(["control", first]).to_numpy()].copy()
        if name == "three_genes":
            adata = adata[:, :3].copy()
        change(adata)
        adata.write_h5ad(folder / f"{name}.h5ad")
    pd.DataFrame({"a": [1]}).to_csv(folder / "de_wrong.csv", index=False)
    for name, metric in (
        ("overlap_k0", "cell_eval_overlap(k=0)"),
        ("nsig_side", "cell_eval_nsig_count(side='both')"),
        ("clustering_score", "cell_eval_clustering_agreement(score='f1')"),
        ("clustering_grid", "cell_eval_clustering_agreement(resolutions=())"),
        ("sinkhorn_tol", "sinkhorn(tol=-1.0)"),
        ("sinkhorn_max_iter", "sinkhorn(max_iter=0)"),
    ):
        (folder / f"{name}.toml").write_text(
            f'[[protocol]]\nname = "{name}"\nmetric = "{metric}"\n'
            'negative = "matched_perturbed_sample"\n'
        )
    _write_bad_splits(folder, sorted(set(truth.obs["perturbation"].astype(str)) - {"control"}))
    _write_split_predictions(folder, good)
    _write_fold_runs(folder, list(good["perturbation"]))
    return folder


def _write_bad_splits(folder: Path, labels: list[str]) -> None:
    """Split tables of the small dataset's four perturbations, each wrong in one way."""
    import pandas as pd

    folds = [str(i % 2) for i in range(len(labels))]
    tables = {
        "missing": {"perturbation": labels[1:], "fold": folds[1:]},
        "unknown": {"perturbation": [*labels, labels[0] + "x"], "fold": [*folds, "0"]},
        "overlap": {"perturbation": [*labels, labels[0]], "fold": [*folds, "1"]},
        "one_fold": {"perturbation": labels, "fold": ["0"] * len(labels)},
        "role": {"perturbation": labels, "role": ["train", "training", "test", "val"]},
        "columns": {"gene": labels, "fold": folds},
    }
    for name, columns in tables.items():
        pd.DataFrame(columns).to_csv(folder / f"split_{name}.csv", index=False)


def _write_split_predictions(folder: Path, good) -> None:  # type: ignore[no-untyped-def]
    """Two valid splits of the small dataset and per-fold predictions that do not fit them."""
    import pandas as pd

    labels = list(good["perturbation"])
    folds = [str(i % 2) for i in range(len(labels))]
    pd.DataFrame({"perturbation": labels, "fold": folds}).to_csv(
        folder / "split_two_folds.csv", index=False
    )
    roles = ["train", "train", "test", "test"][: len(labels)]
    pd.DataFrame({"perturbation": labels, "role": roles}).to_csv(
        folder / "split_roles.csv", index=False
    )
    misnamed = folder / "per_fold_misnamed"
    misnamed.mkdir()
    swapped = folder / "per_fold_swapped"
    swapped.mkdir()
    for fold in ("0", "1"):
        own = good[[f == fold for f in folds]]
        own.to_csv(misnamed / f"fold{fold}.csv", index=False)
        own.to_csv(swapped / f"{1 - int(fold)}.csv", index=False)


def _write_fold_runs(folder: Path, labels: list[str]) -> None:
    """Stored score runs of one fold each, under two splits, for report's pooling."""
    import json

    import pandas as pd

    folds = [str(i % 2) for i in range(len(labels))]
    for name, digest, fold in (("a0", "a", "0"), ("a1", "a", "0"), ("b1", "b", "1")):
        run = folder / f"fold_run_{name}"
        run.mkdir()
        results = pd.DataFrame(
            {
                "covariate": "all",
                "perturbation": labels,
                "protocol": "mse",
                "source": "model",
                "source_name": "m",
                "value": 1.0,
                "reason": "",
                "fold": folds,
            }
        )
        results.to_parquet(run / "results.parquet", index=False)
        pd.DataFrame({"protocol": ["mse"], "better": ["lower"], "perfect": [0.0]}).to_csv(
            run / "protocols.csv", index=False
        )
        missing = [f"all/{p}" for p, f in zip(labels, folds, strict=True) if f != fold]
        options = {
            "input_checksum": "same",
            "seed": 0,
            "truth": "half",
            "split": {"sha256": digest * 64, "folds": {"0": 2, "1": 2}},
            "models": {"m": {"missing": missing}},
        }
        (run / "run.json").write_text(json.dumps({"command": "score", "options": options}))


#: (case id, arguments, pattern of the error line)
CASES: list[tuple[str, list[str], str]] = [
    (
        "missing file",
        ["calibrate", "{tmp}/absent.h5ad", "-p", "mse", "--out", "{out}"],
        r"absent\.h5ad",
    ),
    (
        "truncated .h5ad",
        ["calibrate", "{bad}/truncated.h5ad", "-p", "mse", "--out", "{out}"],
        r"truncated\.h5ad: cannot read as \.h5ad \(OSError: .*truncated file",
    ),
    (
        "damaged .h5ad",
        ["calibrate", "{bad}/damaged.h5ad", "-p", "mse", "--out", "{out}"],
        r"damaged\.h5ad: cannot read as \.h5ad",
    ),
    (
        ".h5ad that is no HDF5 file",
        ["calibrate", "{bad}/table.h5ad", "-p", "mse", "--out", "{out}"],
        r"table\.h5ad: cannot read as \.h5ad \(OSError: .*file signature not found",
    ),
    (
        "truncated .h5ad prediction",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/truncated.h5ad", "--out", "{out}"],
        r"prediction 'm': cannot read .*truncated\.h5ad as AnnData",
    ),
    (
        "unknown protocol",
        ["calibrate", "{data}", "-p", "not_a_protocol", "--out", "{out}"],
        r"not_a_protocol",
    ),
    (
        "missing perturbation column",
        ["calibrate", "{data}", "-p", "mse", "--perturbation-key", "nope", "--out", "{out}"],
        r"perturbation column 'nope'",
    ),
    (
        "missing control label",
        ["calibrate", "{data}", "-p", "mse", "--control-label", "NT", "--out", "{out}"],
        r"control label 'NT'",
    ),
    (
        "missing layer",
        ["calibrate", "{data}", "-p", "mse", "--layer", "nope", "--out", "{out}"],
        r"layer 'nope'",
    ),
    (
        "subset without '='",
        ["calibrate", "{data}", "-p", "mse", "--subset", "A172", "--out", "{out}"],
        r"--subset expects COLUMN=VALUE",
    ),
    (
        "score without predictions",
        ["score", "{data}", "-p", "mse", "--out", "{out}"],
        r"--pred",
    ),
    (
        "prediction file absent",
        ["score", "{data}", "-p", "mse", "--pred", "m={tmp}/absent.h5ad", "--out", "{out}"],
        r"absent\.h5ad",
    ),
    (
        "float32 without a device",
        ["calibrate", "{data}", "-p", "mse", "--precision", "float32", "--out", "{out}"],
        r"float32",
    ),
    (
        "prediction of an unknown format",
        ["score", "{data}", "--pred", "m={bad}/model.xyz", "--out", "{out}"],
        r"cannot read model\.xyz: accepted files are \.h5ad, \.csv",
    ),
    (
        "prediction table without labels",
        ["score", "{data}", "--pred", "m={bad}/nolabels.csv", "--out", "{out}"],
        r"no perturbation labels",
    ),
    (
        "undeclared changes from the control",
        ["score", "{data}", "--pred", "m={bad}/negative.csv", "--out", "{out}"],
        r"look like changes from the control.*--delta m",
    ),
    (
        "prediction on a count scale",
        ["score", "{data}", "--pred", "m={bad}/counts.csv", "--out", "{out}"],
        r"values up to 300 look like an expm1 or count scale",
    ),
    (
        "prediction table with a text column",
        ["score", "{data}", "--pred", "m={bad}/text.csv", "--out", "{out}"],
        r"not numeric",
    ),
    (
        "prediction genes in another case",
        ["score", "{data}", "--pred", "m={bad}/case.csv", "--out", "{out}"],
        r"match only up to case",
    ),
    (
        "npz without its arrays",
        ["score", "{data}", "--pred", "m={bad}/lacking.npz", "--out", "{out}"],
        r"lacks array\(s\) perturbations, genes",
    ),
    (
        "unreadable parquet prediction",
        ["score", "{data}", "--pred", "m={bad}/broken.parquet", "--out", "{out}"],
        r"cannot read .*broken\.parquet as Parquet table",
    ),
    (
        "delta for an unknown model",
        ["score", "{data}", "--pred", "m={bad}/good.csv", "--delta", "x", "--out", "{out}"],
        r"--delta names no given model: 'x'",
    ),
    (
        "predicted control in a calibrated run",
        ["score", "{data}", "--pred", "m={bad}/good.csv", "--control-from-predictions"]
        + ["--out", "{out}"],
        r"predicted control .*need --truth all",
    ),
    (
        "predicted control of a model without control cells",
        ["score", "{data}", "--pred", "m={bad}/good.csv", "--control-from-predictions"]
        + ["--truth", "all", "--out", "{out}"],
        r"prediction 'm': no predicted control cells \(label 'control'\)",
    ),
    (
        "empty model name",
        ["score", "{data}", "--pred", "={bad}/good.csv", "--out", "{out}"],
        r"model names must be non-empty",
    ),
    (
        "DE table absent",
        ["calibrate", "{data}", "-p", "mse", "--de-table", "{tmp}/nope", "--out", "{out}"],
        r"DE table .*nope: not found",
    ),
    (
        "DE table of another format",
        ["calibrate", "{data}", "-p", "mse", "--de-table", "{bad}/de_wrong.csv", "--out", "{out}"],
        r"neither scperteval's columns",
    ),
    (
        "NaN perturbation labels",
        ["calibrate", "{bad}/unlabelled.h5ad", "-p", "mse", "--out", "{out}"],
        r"1 cell\(s\) have no label \(NaN or None\) in column 'perturbation'",
    ),
    (
        "a constant matrix",
        ["calibrate", "{bad}/constant.h5ad", "-p", "mse", "--out", "{out}"],
        r"X has no variation \(every value is 1\)",
    ),
    (
        "values far beyond log expression",
        ["calibrate", "{bad}/huge.h5ad", "-p", "mse", "--out", "{out}"],
        r"beyond log-normalised expression",
    ),
    (
        "one control cell",
        ["calibrate", "{bad}/one_control.h5ad", "-p", "mse", "--out", "{out}"],
        r"only one control cell",
    ),
    (
        "three genes to calibrate",
        ["calibrate", "{bad}/three_genes.h5ad", "-p", "mse", "--out", "{out}"],
        r"the data has 3 gene\(s\); calibration needs at least 10",
    ),
    (
        "three genes to score calibrated",
        ["score", "{bad}/three_genes.h5ad", "--pred", "m={bad}/good.csv", "--out", "{out}"],
        r"the data has 3 gene\(s\); calibration needs at least 10",
    ),
    (
        "one perturbation to calibrate",
        ["calibrate", "{bad}/one_perturbation.h5ad", "-p", "mse", "--out", "{out}"],
        r"the data has 1 perturbation\(s\) with enough cells.*at least 2",
    ),
    (
        "--normalize on log-normalised data",
        ["calibrate", "{data}", "-p", "mse", "--normalize", "--out", "{out}"],
        r"not raw counts.*drop normalize=True",
    ),
    (
        "perturbation key equal to the covariate key",
        ["calibrate", "{data}", "-p", "mse", "--covariate-key", "perturbation", "--out", "{out}"],
        r"both 'perturbation'",
    ),
    (
        "--chunk-cells 0",
        ["calibrate", "{data}", "-p", "mse", "--chunk-cells", "0", "--out", "{out}"],
        r"chunk_cells must be a whole number of at least 1",
    ),
    (
        "--workers 0",
        ["calibrate", "{data}", "-p", "mse", "--workers", "0", "--out", "{out}"],
        r"workers must be a whole number of at least 1, got 0",
    ),
    (
        "--workers -1",
        ["score", "{data}", "--pred", "m={bad}/good.csv", "--workers", "-1", "--out", "{out}"],
        r"workers must be a whole number of at least 1, got -1",
    ),
    (
        "unknown device",
        ["calibrate", "{data}", "-p", "mse", "--device", "gpu", "--out", "{out}"],
        r"unknown device 'gpu'",
    ),
    (
        "population cap of zero",
        ["calibrate", "{data}", "-p", "mse", "--max-population-cells", "0", "--out", "{out}"],
        r"--max-population-cells must be a whole number of at least 2 or 'all', got '0'",
    ),
    (
        "population cap of one cell",
        ["calibrate", "{data}", "-p", "mse", "--max-population-cells", "1", "--out", "{out}"],
        r"--max-population-cells must be .* got '1'",
    ),
    (
        "score: population cap as a word",
        [
            "score",
            "{data}",
            "--pred",
            "m={data}",
            "-p",
            "mse",
            "--max-population-cells",
            "none",
            "--out",
            "{out}",
        ],
        r"--max-population-cells must be .* or 'all', got 'none'",
    ),
    (
        "empty protocol list",
        ["calibrate", "{data}", "-p", "", "--out", "{out}"],
        r"no protocol given",
    ),
    (
        "misspelt suite",
        ["calibrate", "{data}", "-p", "defualt", "--out", "{out}"],
        r"did you mean 'default'",
    ),
    (
        "k of zero",
        ["calibrate", "{data}", "-p", "mse_top_k=0", "--out", "{out}"],
        r"option k must be a whole number of at least 1, got 0",
    ),
    (
        "negative k",
        ["calibrate", "{data}", "-p", "mse_top_k=-5", "--out", "{out}"],
        r"got -5",
    ),
    (
        "fractional k",
        ["calibrate", "{data}", "-p", "mse_top_k=2.5", "--out", "{out}"],
        r"got 2\.5",
    ),
    (
        "suite without protocols",
        ["calibrate", "{data}", "-p", "{bad}/empty.toml", "--out", "{out}"],
        r"defines no protocol",
    ),
    (
        "binary suite file",
        ["calibrate", "{data}", "-p", "{bad}/binary.toml", "--out", "{out}"],
        r"not valid TOML",
    ),
    (
        "BDS threshold above 1",
        ["calibrate", "{data}", "-p", "mse", "--thresholds", "bds=5", "--out", "{out}"],
        r"bds must lie in \[0, 1\], got 5",
    ),
    (
        "DRF threshold above 1",
        ["calibrate", "{data}", "-p", "mse", "--thresholds", "drf=2", "--out", "{out}"],
        r"drf must be a number at most 1",
    ),
    (
        "zero perturbations needed for trust",
        [
            "score",
            "{data}",
            "-p",
            "mse",
            "--pred",
            "m={bad}/good.csv",
            "--min-perturbations",
            "0",
            "--out",
            "{out}",
        ],
        r"--min-perturbations must be at least 1, got 0",
    ),
    (
        "negative perturbations needed for trust in a report",
        ["report", "{tmp}", "--min-perturbations", "-3", "--out", "{out}"],
        r"--min-perturbations must be at least 1, got -3",
    ),
    (
        "output folder is a file",
        ["calibrate", "{data}", "-p", "mse", "--out", "{bad}/a_file"],
        r"is an existing file, not a folder",
    ),
    (
        "output to /dev/null",
        ["de", "{data}", "--out", "/dev/null"],
        r"/dev/null is an existing file",
    ),
    (
        "output folder not writable",
        ["score", "{data}", "--pred", "m={bad}/good.csv", "--out", "/proc/1/results"],
        r"not writable",
    ),
    (
        "demo with zero workers",
        ["demo", "--workers", "0", "--out", "{out}"],
        r"workers must be a whole number of at least 1, got 0",
    ),
    (
        "report on a calibrate folder",
        ["report", "{bad}/calibrate_run", "--out", "{out}"],
        r"holds the output of 'scperteval calibrate'",
    ),
    (
        "report on damaged results",
        ["report", "{bad}/damaged_run", "--out", "{out}"],
        r"cannot read the stored results",
    ),
    (
        "report on a folder that is no run",
        ["report", "{bad}", "--out", "{out}"],
        r"no results\.parquet; is this the output folder of a run",
    ),
    (
        "unknown DE method",
        ["de", "{data}", "--method", "magic", "--out", "{out}"],
        r"magic",
    ),
    (
        "distances: file absent",
        ["distances", "{tmp}/absent.h5ad", "--groupby", "g", "--out", "{out}"],
        r"absent\.h5ad",
    ),
    (
        "distances: unknown metric",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--metric",
            "edistanse",
            "--out",
            "{out}",
        ],
        r"edistanse.*did you mean 'edistance'",
    ),
    (
        "distances: bad metric option",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--metric",
            "mmd(kernel='cubic')",
            "--out",
            "{out}",
        ],
        r"kernel must be",
    ),
    (
        "distances: missing groupby",
        ["distances", "{data}", "--groupby", "nope", "--out", "{out}"],
        r"--groupby: column 'nope'",
    ),
    (
        "distances: missing reference",
        ["distances", "{data}", "--groupby", "perturbation", "--reference", "NT", "--out", "{out}"],
        r"--reference: group 'NT'",
    ),
    (
        "distances: permutations alone",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--permutations",
            "10",
            "--out",
            "{out}",
        ],
        r"--permutations needs --reference",
    ),
    (
        "distances: negative permutations",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--reference",
            "control",
            "--permutations",
            "-1",
            "--out",
            "{out}",
        ],
        r"--permutations must be",
    ),
    (
        "distances: unknown correction",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--reference",
            "control",
            "--correction",
            "sidak",
            "--out",
            "{out}",
        ],
        r"unknown --correction 'sidak'",
    ),
    (
        "distances: bad alpha",
        ["distances", "{data}", "--groupby", "perturbation", "--alpha", "2", "--out", "{out}"],
        r"--alpha must lie",
    ),
    (
        "distances: unknown format",
        ["distances", "{data}", "--groupby", "perturbation", "--format", "xlsx", "--out", "{out}"],
        r"--format must be",
    ),
    (
        "distances: unknown space",
        ["distances", "{data}", "--groupby", "perturbation", "--space", "tsne", "--out", "{out}"],
        r"unknown space 'tsne'",
    ),
    (
        "distances: obsm and space",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--obsm-key",
            "X_pca",
            "--space",
            "pca",
            "--out",
            "{out}",
        ],
        r"not both",
    ),
    (
        "distances: missing embedding",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--obsm-key",
            "X_umap",
            "--out",
            "{out}",
        ],
        r"embedding 'X_umap'",
    ),
    (
        "Sinkhorn with a negative tolerance",
        ["calibrate", "{data}", "-p", "{bad}/sinkhorn_tol.toml", "--out", "{out}"],
        r"tol must be None or a positive finite number, got -1\.0",
    ),
    (
        "Sinkhorn with no iterations allowed",
        ["calibrate", "{data}", "-p", "{bad}/sinkhorn_max_iter.toml", "--out", "{out}"],
        r"max_iter must be a positive integer, got 0",
    ),
    (
        "cell-eval overlap with k below 1",
        ["calibrate", "{data}", "-p", "{bad}/overlap_k0.toml", "--out", "{out}"],
        r"k must be a whole number of at least 1",
    ),
    (
        "cell-eval DEG count of an unknown side",
        ["calibrate", "{data}", "-p", "{bad}/nsig_side.toml", "--out", "{out}"],
        r"side must be 'real' or 'pred', got 'both'",
    ),
    (
        "cell-eval clustering agreement with an unknown score",
        ["calibrate", "{data}", "-p", "{bad}/clustering_score.toml", "--out", "{out}"],
        r"score must be one of ami, nmi, ari, got 'f1'",
    ),
    (
        "cell-eval clustering agreement with no resolution",
        ["calibrate", "{data}", "-p", "{bad}/clustering_grid.toml", "--out", "{out}"],
        r"resolutions must be a list of positive numbers",
    ),
    (
        "distances: missing layer",
        ["distances", "{data}", "--groupby", "perturbation", "--layer", "nope", "--out", "{out}"],
        r"layer 'nope'",
    ),
    (
        "distances: missing covariate",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--covariate-key",
            "line",
            "--out",
            "{out}",
        ],
        r"--covariate-key: column 'line'",
    ),
    (
        "distances: empty groups",
        ["distances", "{data}", "--groupby", "perturbation", "--groups", ",", "--out", "{out}"],
        r"--groups names no group",
    ),
    (
        "distances: bootstrap alone",
        ["distances", "{data}", "--groupby", "perturbation", "--bootstrap", "10", "--out", "{out}"],
        r"--bootstrap needs --reference",
    ),
    (
        "distances: one bootstrap replicate",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--reference",
            "control",
            "--bootstrap",
            "1",
            "--out",
            "{out}",
        ],
        r"--bootstrap must be 0 or at least 2",
    ),
    (
        "distances: bad confidence",
        [
            "distances",
            "{data}",
            "--groupby",
            "perturbation",
            "--reference",
            "control",
            "--confidence",
            "1.5",
            "--out",
            "{out}",
        ],
        r"--confidence must lie",
    ),
    (
        "distances: unknown group",
        ["distances", "{data}", "--groupby", "perturbation", "--groups", "zz", "--out", "{out}"],
        r"group 'zz'",
    ),
    # Cross-validation splits: drawing one, and reading the user's own.
    (
        "split into one fold",
        ["split", "{data}", "--folds", "1", "--out", "{out}.csv"],
        r"--folds must be at least 2, got 1",
    ),
    (
        "split into no folds",
        ["split", "{data}", "--folds", "0", "--out", "{out}.csv"],
        r"--folds must be at least 2, got 0",
    ),
    (
        "more folds than perturbations",
        ["split", "{data}", "--folds", "5", "--out", "{out}.csv"],
        r"5 folds but only 4 perturbation\(s\): .*use at most 4 folds",
    ),
    (
        "split seed as a word",
        ["split", "{data}", "--seed", "one", "--out", "{out}.csv"],
        r"--seed: invalid int value: 'one'",
    ),
    (
        "negative split seed",
        ["split", "{data}", "--seed", "-1", "--out", "{out}.csv"],
        r"seed must be a whole number of at least 0, got -1",
    ),
    (
        "split table of no known type",
        ["split", "{data}", "--out", "{out}"],
        r"unknown file type '\(none\)'; use \.csv, \.tsv, \.parquet",
    ),
    (
        "split table in a folder that is missing",
        ["split", "{data}", "--out", "{tmp}/absent/split.csv"],
        r"folder .*absent does not exist",
    ),
    (
        "unwritable split table",
        ["split", "{data}", "--out", "/proc/1/split.csv"],
        r"folder /proc/1 is not writable",
    ),
    (
        "split table that is a folder",
        ["split", "{data}", "--out", "{bad}"],
        r"unknown file type|is an existing folder",
    ),
    (
        "split from a missing file",
        ["split", "{data}", "--from", "{tmp}/absent.csv", "--out", "{out}.csv"],
        r"split table '.*absent\.csv' not found",
    ),
    (
        "split from a file and folds",
        [
            "split",
            "{data}",
            "--from",
            "{bad}/split_missing.csv",
            "--folds",
            "3",
            "--out",
            "{out}.csv",
        ],
        r"--from reads a split as it is; leave out --folds and --seed",
    ),
    (
        "split that misses a perturbation",
        ["split", "{data}", "--from", "{bad}/split_missing.csv", "--out", "{out}.csv"],
        r"split_missing\.csv misses 1 of the data's 4 perturbations: 'G10'; give each a fold",
    ),
    (
        "split that lists an unknown perturbation",
        ["split", "{data}", "--from", "{bad}/split_unknown.csv", "--out", "{out}.csv"],
        r"perturbation 'G10x' is not in the data \(nearest label in the data: 'G10'\)",
    ),
    (
        "split with overlapping folds",
        ["split", "{data}", "--from", "{bad}/split_overlap.csv", "--out", "{out}.csv"],
        r"'G10' is in folds '0' and '1'; each perturbation belongs to one fold",
    ),
    (
        "split fold without training perturbations",
        ["split", "{data}", "--from", "{bad}/split_one_fold.csv", "--out", "{out}.csv"],
        r"fold '0' has no training perturbations; every fold must train on",
    ),
    (
        "split with a bad role",
        ["split", "{data}", "--from", "{bad}/split_role.csv", "--out", "{out}.csv"],
        r"'G24' has role 'training'; roles are 'train', 'val' or 'test'",
    ),
    (
        "split table without its columns",
        ["split", "{data}", "--from", "{bad}/split_columns.csv", "--out", "{out}.csv"],
        r"no perturbation column \(columns: gene, fold\); a split table has columns perturbation",
    ),
    (
        "split from an obs column that is missing",
        ["split", "{data}", "--from", "obs:fold", "--out", "{out}.csv"],
        r"split column 'fold' not found in obs; available columns: perturbation",
    ),
    # calibrate: the evidence rule's minimum
    (
        "calibrate: zero perturbations needed for trust",
        ["calibrate", "{data}", "-p", "mse", "--min-perturbations", "0", "--out", "{out}"],
        r"min_perturbations must be at least 1, got 0",
    ),
    # Scoring under a split: predictions that do not fit the split's folds.
    (
        "score: prediction of a training perturbation",
        [
            "score",
            "{data}",
            "-p",
            "mse",
            "--split",
            "{bad}/split_roles.csv",
            "--pred",
            "m={bad}/good.csv",
            "--out",
            "{out}",
        ],
        r"predicts '.*', which no fold of the split holds out \(a training perturbation\)",
    ),
    (
        "score: per-fold files not named by the folds",
        [
            "score",
            "{data}",
            "-p",
            "mse",
            "--split",
            "{bad}/split_two_folds.csv",
            "--pred",
            "m={bad}/per_fold_misnamed",
            "--out",
            "{out}",
        ],
        r"per-fold files in folder .* do not match the split's folds \('0', '1'\)",
    ),
    (
        "score: per-fold file of another fold's perturbations",
        [
            "score",
            "{data}",
            "-p",
            "mse",
            "--split",
            "{bad}/split_two_folds.csv",
            "--pred",
            "m={bad}/per_fold_swapped",
            "--out",
            "{out}",
        ],
        r"the file for fold '0' predicts .*, held out by fold '1'",
    ),
    (
        "score: split that misses a perturbation",
        [
            "score",
            "{data}",
            "-p",
            "mse",
            "--split",
            "{bad}/split_missing.csv",
            "--pred",
            "m={bad}/good.csv",
            "--out",
            "{out}",
        ],
        r"split .*split_missing\.csv",
    ),
    # Calibration under a split, and report pooling fold runs.
    (
        "calibrate: split that misses a perturbation",
        [
            "calibrate",
            "{data}",
            "-p",
            "mse",
            "--split",
            "{bad}/split_missing.csv",
            "--out",
            "{out}",
        ],
        r"split_missing\.csv misses 1 of the data's 4 perturbations: 'G10'; give each a fold",
    ),
    (
        "calibrate: split that lists an unknown perturbation",
        [
            "calibrate",
            "{data}",
            "-p",
            "mse",
            "--split",
            "{bad}/split_unknown.csv",
            "--out",
            "{out}",
        ],
        r"split_unknown\.csv",
    ),
    (
        "calibrate: split with overlapping folds",
        [
            "calibrate",
            "{data}",
            "-p",
            "mse",
            "--split",
            "{bad}/split_overlap.csv",
            "--out",
            "{out}",
        ],
        r"'G10' is in folds '0' and '1'; each perturbation belongs to one fold",
    ),
    (
        "calibrate: split fold without training perturbations",
        [
            "calibrate",
            "{data}",
            "-p",
            "mse",
            "--split",
            "{bad}/split_one_fold.csv",
            "--out",
            "{out}",
        ],
        r"fold '0' has no training perturbations; every fold must train on",
    ),
    (
        "calibrate: split table that is missing",
        ["calibrate", "{data}", "-p", "mse", "--split", "{tmp}/absent.csv", "--out", "{out}"],
        r"split table '.*absent\.csv' not found",
    ),
    (
        "report: fold runs of different splits",
        ["report", "{bad}/fold_run_a0", "{bad}/fold_run_b1", "--out", "{out}"],
        r"cannot merge .*fold_run_b1 with .*fold_run_a0: different splits",
    ),
    (
        "report: fold runs of the same fold",
        ["report", "{bad}/fold_run_a0", "{bad}/fold_run_a1", "--out", "{out}"],
        r"cannot merge .*fold_run_a1 with .*fold_run_a0: both scored fold '0' \(mse\)",
    ),
]


@pytest.mark.parametrize(
    ("arguments", "pattern"),
    [pytest.param(arguments, pattern, id=case) for case, arguments, pattern in CASES],
)
def test_bad_input_is_refused_in_one_line(
    small_path, bad_files, tmp_path, capsys, arguments, pattern
):
    out = tmp_path / "out"
    filled = [a.format(data=small_path, out=out, tmp=tmp_path, bad=bad_files) for a in arguments]
    try:
        code = main(filled)
    except SystemExit as exc:  # argparse refuses its own errors this way
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1, captured.err
    assert re.search(pattern, errors[0]), errors[0]
    assert not out.exists()


#: The same checks in the Python API: (case id, keyword arguments, error type, pattern).
API_CASES = [
    ("protocols of the wrong type", {"protocols": 5}, SpecError, r"got int"),
    ("subset as a string", {"subset": "dataset=norman19"}, DatasetError, r"subset must map"),
    ("zero workers", {"workers": 0}, SpecError, r"workers must be a whole number"),
    ("fractional seed", {"seed": 1.5}, SpecError, r"seed must be a whole number"),
    ("backed as a word", {"backed": "yes"}, DatasetError, r"backed must be True, False"),
    ("unknown device", {"device": "tpu"}, SpecError, r"unknown device 'tpu'"),
    ("population cap of zero", {"max_population_cells": 0}, SpecError, r"at least 2"),
    ("fractional population cap", {"max_population_cells": 2.5}, SpecError, r"got 2.5"),
    ("misspelt option", {"perturbation_kye": "x"}, TypeError, r"did you mean"),
    ("unwritable output", {"out": "/proc/1/out"}, SpecError, r"not writable"),
]


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [pytest.param(options, error, pattern, id=case) for case, options, error, pattern in API_CASES],
)
def test_the_python_api_refuses_the_same_input(small_path, options, error, pattern):
    import scperteval

    arguments = {"protocols": "mse", **options}
    with pytest.raises(error, match=pattern):
        scperteval.calibrate(small_path, **arguments)
    with pytest.raises(error, match=pattern):
        scperteval.score(small_path, {"m": small_path}, **arguments)


def test_score_needs_a_model_in_python_as_on_the_command_line(small_path):
    import scperteval

    with pytest.raises(SpecError, match="give at least one model"):
        scperteval.score(small_path, {}, protocols="mse")
