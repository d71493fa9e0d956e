"""Bad input on the command line: refused before any work, in one line, with exit code 2.

Every case is one row of :data:`CASES`: the arguments (``{data}``, ``{out}``,
``{tmp}`` and ``{bad}`` are filled in with a small generated dataset, a fresh
output folder, the test's temporary folder and a folder of malformed files)
and a pattern the error line must match. Each case must exit with code 2,
print exactly one ``error:`` line and no traceback, and leave nothing at
``{out}``. A new input, option or file format adds its bad cases here.
"""

from __future__ import annotations

import os
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
    (folder / "store.zarr").mkdir()

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
    # Two screens under the same labels, told apart only by an obs column.
    pooled = truth.copy()
    pooled.obs["screen"] = np.where(np.arange(pooled.n_obs) % 2 == 0, "first", "second")
    pooled.write_h5ad(folder / "two_screens.h5ad")
    one_row = good.copy()
    one_row.loc[0, genes] = -0.05
    one_row.to_csv(folder / "one_row_of_changes.csv", index=False)
    _write_unusual_inputs(folder, truth, good)
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
        "header_only": {"perturbation": [], "fold": []},
        "covariate": {"covariate": ["K562"] * len(labels), "perturbation": labels, "fold": folds},
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


def _write_unusual_inputs(folder: Path, truth, good) -> None:
    """Inputs that look right and are not: repeated rows, other separators, stored runs."""
    import json

    import h5py
    import numpy as np
    import pandas as pd

    import scperteval

    genes = list(truth.var_names)
    first = good.iloc[[0]].assign(**{genes[0]: 0.9})
    pd.concat([good, first]).to_csv(folder / "repeated.csv", index=False)
    good.assign(perturbation=good["perturbation"] + " ").to_csv(folder / "spaced.csv", index=False)
    good.to_csv(folder / "semicolons.csv", index=False, sep=";")
    good.to_csv(folder / "tabs.csv", index=False, sep="\t")
    good.iloc[:0].to_csv(folder / "header_only.csv", index=False)
    unlabelled = good.astype({"perturbation": object})
    unlabelled.loc[0, "perturbation"] = None
    unlabelled.to_csv(folder / "unlabelled_rows.csv", index=False)
    (folder / "a_folder").mkdir()
    (folder / "empty.csv").write_text("")
    repeated_column = good.copy()
    repeated_column.columns = [*good.columns[:-1], good.columns[1]]
    repeated_column.to_csv(folder / "repeated_column.csv", index=False)
    latin = good.assign(perturbation=good["perturbation"] + "\xe9")
    (folder / "latin1.csv").write_bytes(latin.to_csv(index=False).encode("latin-1"))
    good.rename(columns={g: f"{g} " for g in genes}).to_csv(
        folder / "spaced_genes.csv", index=False
    )
    good.assign(**{genes[2]: np.inf}).to_csv(folder / "infinite.csv", index=False)
    np.savez(
        folder / "one_dimensional.npz",
        X=np.zeros(5),
        perturbations=good["perturbation"].to_numpy(str),
        genes=np.asarray(genes),
    )
    (folder / "no_bytes.toml").write_text("")
    (folder / "unknown_metric.toml").write_text(
        '[[protocol]]\nname = "x"\nmetric = "nope"\nnegative = "matched_perturbed_sample"\n'
    )
    (folder / "empty_folder").mkdir()
    truth[:0].copy().write_h5ad(folder / "no_cells.h5ad")
    duplicated = truth.copy()
    duplicated.var_names = [genes[0], *genes[1:-1], genes[0]]
    duplicated.write_h5ad(folder / "duplicated_genes.h5ad")
    only_control = truth.copy()
    only_control.obs["perturbation"] = "control"
    only_control.write_h5ad(folder / "only_control.h5ad")
    (folder / "a_folder_with_files").mkdir()
    (folder / "a_folder_with_files" / "notes.txt").write_text("the user's own notes")
    (folder / "protocol_text.toml").write_text('protocol = "mse"\n')
    (folder / "use_text.toml").write_text('use = "mse"\n')
    (folder / "params_number.toml").write_text(
        '[[protocol]]\nname = "x"\nmetric = "mse"\nparams = 3\n'
        'negative = "matched_perturbed_sample"\n'
    )
    truth.write_h5ad(folder / "no_x.h5ad")
    with h5py.File(folder / "no_x.h5ad", "a") as handle:
        del handle["X"]
    with_nan = truth.copy()
    dense = np.asarray(with_nan.X.todense())
    dense[3, 4] = np.nan
    with_nan.X = dense
    with_nan.write_h5ad(folder / "with_nan.h5ad")
    truth[:, :0].copy().write_h5ad(folder / "no_genes.h5ad")
    scperteval.de(truth, half="all", out=folder / "de_all_cells")
    for name, options, results in (
        ("seed_text", {"seed": "x"}, None),
        ("truth_word", {"truth": "weird"}, None),
        ("thresholds_text", {"thresholds": "x"}, None),
        ("value_text", {}, {"value": ["0.5"]}),
        ("protocol_undescribed", {}, {"protocol": ["zzz"]}),
    ):
        run = folder / f"tampered_{name}"
        run.mkdir()
        record = {"command": "score", "options": {"seed": 0, "truth": "half", **options}}
        (run / "run.json").write_text(json.dumps(record))
        row = {
            "covariate": ["all"],
            "perturbation": ["A"],
            "protocol": ["mse"],
            "source": ["model"],
            "source_name": ["m"],
            "value": [0.5],
            **(results or {}),
        }
        pd.DataFrame(row).to_parquet(run / "results.parquet")
        (run / "protocols.csv").write_text("protocol\nmse\n")


def _write_fold_runs(folder: Path, labels: list[str]) -> None:
    """Stored score runs of one fold each, under two splits, for report's pooling."""
    import json

    import pandas as pd

    folds = [str(i % 2) for i in range(len(labels))]
    runs = (
        ("a0", "a", "0"),
        ("a1", "a", "0"),
        ("b1", "b", "1"),
        ("c0", "c", "0"),
        ("c1", "c", "1"),
    )
    for name, digest, fold in runs:
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
        if digest == "c":
            # Runs that added the criterion's protocol: one stored its values damaged.
            options["split"]["criterion"] = {"protocol_added": True}
            values = results.assign(protocol="l2_heg1000")
            values.to_parquet(run / "criterion_values.parquet", index=False)
            if fold == "0":
                (run / "criterion_values.parquet").write_bytes(b"PAR1 damaged")
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
        r"group\(s\) 'zz' have no cell in column 'perturbation'",
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
    # Inputs that would be scored wrongly: pooled screens, undeclared changes.
    (
        "screens pooled under the same labels",
        ["calibrate", "{bad}/two_screens.h5ad", "-p", "mse", "--out", "{out}"],
        r"obs column 'screen' splits the cells into 2 groups .*--subset screen=first.*"
        r"--covariate-key screen.*--pool",
    ),
    (
        "score on screens pooled under the same labels",
        ["score", "{bad}/two_screens.h5ad", "--pred", "m={bad}/good.csv", "--out", "{out}"],
        r"obs column 'screen' splits .*--subset screen=.*--covariate-key screen",
    ),
    (
        "undeclared changes in one row",
        ["score", "{data}", "--pred", "m={bad}/one_row_of_changes.csv", "--out", "{out}"],
        r"30 negative value\(s\) \(minimum -0\.05, 25% of the values\), 1 row\(s\) "
        r"summing to less than 0.*--delta m",
    ),
    # Inputs that looked valid: repeated rows, invisible label differences, wrong types.
    (
        "two different rows for one perturbation",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/repeated.csv", "--out", "{out}"],
        r"1 perturbation\(s\) have two or more different rows: 'G\d+'; a table holds one row",
    ),
    (
        "labels with a trailing space",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/spaced.csv", "--out", "{out}"],
        r"not predicted: 'G(\d+)' \(nearest: 'G\1 '\)",
    ),
    (
        "semicolon-separated .csv",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/semicolons.csv", "--out", "{out}"],
        r"semicolons\.csv is separated by semicolons, not commas",
    ),
    (
        "tab-separated .csv",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/tabs.csv", "--out", "{out}"],
        r"tabs\.csv is separated by tabs, not commas; .* or name it \.tsv",
    ),
    (
        "prediction table with a header only",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/header_only.csv", "--out", "{out}"],
        r"the table has columns but no row",
    ),
    (
        "prediction rows without a label",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/unlabelled_rows.csv", "--out", "{out}"],
        r"1 row\(s\) have no label \(NaN or empty\) in column 'perturbation'",
    ),
    (
        "--pred with nothing after '='",
        ["score", "{data}", "-p", "mse", "--pred", "m=", "--out", "{out}"],
        r"--pred 'm=': no file after '='",
    ),
    (
        "--pred with a slash in the model name",
        ["score", "{data}", "-p", "mse", "--pred", "a/b={bad}/good.csv", "--out", "{out}"],
        r"model name 'a/b' holds a '/'",
    ),
    (
        "--pred NAME=FOLDER",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/a_folder", "--out", "{out}"],
        r"a_folder is a folder, not a prediction file; .*--pred .*a_folder\) to score each file",
    ),
    (
        "suite path that is a folder",
        ["calibrate", "{data}", "-p", "{bad}/a_folder", "--out", "{out}"],
        r"suite file .*a_folder is a folder; give the path of a \.toml file",
    ),
    (
        "suite whose protocol is a string",
        ["calibrate", "{data}", "-p", "{bad}/protocol_text.toml", "--out", "{out}"],
        r"protocol must be \[\[protocol\]\] tables .*got 'mse'",
    ),
    (
        "suite whose use is a string",
        ["calibrate", "{data}", "-p", "{bad}/use_text.toml", "--out", "{out}"],
        r"use must be a list of protocol names .*got 'mse'",
    ),
    (
        "suite whose params is a number",
        ["calibrate", "{data}", "-p", "{bad}/params_number.toml", "--out", "{out}"],
        r"protocol 'x': params must be a table",
    ),
    (
        ".h5ad without X",
        ["calibrate", "{bad}/no_x.h5ad", "-p", "mse", "--out", "{out}"],
        r"no_x\.h5ad: the data has no X matrix; choose a layer",
    ),
    (
        "distances: .h5ad without X",
        ["distances", "{bad}/no_x.h5ad", "--groupby", "perturbation", "--out", "{out}"],
        r"the data has no X matrix; choose a layer or an obsm embedding",
    ),
    (
        "distances: a matrix with NaN",
        ["distances", "{bad}/with_nan.h5ad", "--groupby", "perturbation", "--out", "{out}"],
        r"holds NaN or infinite values",
    ),
    (
        "distances: NaN labels",
        ["distances", "{bad}/unlabelled.h5ad", "--groupby", "perturbation", "--out", "{out}"],
        r"1 cell\(s\) have no label \(NaN or None\) in groupby column 'perturbation'",
    ),
    (
        "distances: no genes",
        ["distances", "{bad}/no_genes.h5ad", "--groupby", "perturbation", "--out", "{out}"],
        r"the data has no cells or no genes \(72 x 0\)",
    ),
    (
        "DE table of all cells in a calibrated run",
        ["calibrate", "{data}", "-p", "de_auprc", "--de-table", "{bad}/de_all_cells"]
        + ["--out", "{out}"],
        r"computed on all cells, but a calibrated run uses the DE of the truth half",
    ),
    (
        "--out holding another command's run",
        ["calibrate", "{data}", "-p", "mse", "--out", "{bad}/damaged_run"],
        r"holds the output of 'scperteval score', which 'scperteval calibrate' would "
        r"replace; .*--overwrite",
    ),
    (
        "--out holding files scperteval did not write",
        ["de", "{data}", "--out", "{bad}/a_folder_with_files"],
        r"holds files scperteval did not write \('notes\.txt'\); .*--overwrite",
    ),
    (
        "report on a run.json with a text seed",
        ["report", "{bad}/tampered_seed_text", "--out", "{out}"],
        r"run\.json: seed is 'x', not a whole number; the folder was changed",
    ),
    (
        "report on a run.json with an unknown truth",
        ["report", "{bad}/tampered_truth_word", "--out", "{out}"],
        r"run\.json: truth is 'weird', not one of half, all",
    ),
    (
        "report on a run.json with text thresholds",
        ["report", "{bad}/tampered_thresholds_text", "--out", "{out}"],
        r"run\.json: thresholds is 'x', not a mapping",
    ),
    (
        "report on results with text values",
        ["report", "{bad}/tampered_value_text", "--out", "{out}"],
        r"results\.parquet: column 'value' holds object values, not numbers",
    ),
    (
        "report on results of an undescribed protocol",
        ["report", "{bad}/tampered_protocol_undescribed", "--out", "{out}"],
        r"protocol\(s\) 'zzz' are not described in protocols\.csv",
    ),
    # The next cases found by trying: empty, repeated, mis-encoded and out-of-range input.
    (
        "empty prediction file",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/empty.csv", "--out", "{out}"],
        r"cannot read .*empty\.csv as CSV table \(No columns to parse",
    ),
    (
        "a gene column named twice",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/repeated_column.csv", "--out", "{out}"],
        r"repeated_column\.csv names 1 column\(s\) twice: 'G0'; each gene must appear once",
    ),
    (
        "prediction table in Latin-1",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/latin1.csv", "--out", "{out}"],
        r"latin1\.csv as CSV table: it is not UTF-8 text .*; save it as UTF-8",
    ),
    (
        "gene names with a trailing space",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/spaced_genes.csv", "--out", "{out}"],
        r"gene\(s\) of the truth missing: 'G0' \(nearest: 'G0 '\)",
    ),
    (
        "infinite predicted values",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/infinite.csv", "--out", "{out}"],
        r"4 non-finite predicted value\(s\)",
    ),
    (
        "one-dimensional .npz prediction",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/one_dimensional.npz", "--out", "{out}"],
        r"values must be 2-D \(rows x genes\), got 1-D",
    ),
    (
        "empty suite file",
        ["calibrate", "{data}", "-p", "{bad}/no_bytes.toml", "--out", "{out}"],
        r"suite 'no_bytes' defines no protocol",
    ),
    (
        "suite with an unknown metric",
        ["calibrate", "{data}", "-p", "{bad}/unknown_metric.toml", "--out", "{out}"],
        r"unknown metric 'nope'",
    ),
    (
        "prediction folder without prediction files",
        ["score", "{data}", "-p", "mse", "--pred", "{bad}/empty_folder", "--out", "{out}"],
        r"no prediction files .* in folder .*empty_folder",
    ),
    (
        "one model name given twice",
        ["score", "{data}", "-p", "mse", "--pred", "m={bad}/good.csv"]
        + ["--pred", "m={bad}/good.csv", "--out", "{out}"],
        r"model name 'm' given twice",
    ),
    (
        "zero genes",
        ["calibrate", "{bad}/no_genes.h5ad", "-p", "mse", "--out", "{out}"],
        r"empty dataset \(72 cells x 0 genes\)",
    ),
    (
        "zero cells",
        ["calibrate", "{bad}/no_cells.h5ad", "-p", "mse", "--out", "{out}"],
        r"empty dataset \(0 cells x 30 genes\)",
    ),
    (
        "distances: zero cells",
        ["distances", "{bad}/no_cells.h5ad", "--groupby", "perturbation", "--out", "{out}"],
        r"the data has no cells or no genes \(0 x 30\)",
    ),
    (
        "duplicated gene names in the truth",
        ["calibrate", "{bad}/duplicated_genes.h5ad", "-p", "mse", "--out", "{out}"],
        r"duplicate gene names in var_names: 'G0' \(make them unique",
    ),
    (
        "only control cells",
        ["calibrate", "{bad}/only_control.h5ad", "-p", "mse", "--out", "{out}"],
        r"no perturbation in column 'perturbation' has at least min_cells=4 cells",
    ),
    (
        "a subset value that is absent",
        ["calibrate", "{data}", "-p", "mse", "--subset", "perturbation=zzz", "--out", "{out}"],
        r"subset value\(s\) 'zzz' not found in column 'perturbation'",
    ),
    (
        "a threshold without a value",
        ["calibrate", "{data}", "-p", "mse", "--thresholds", "bds", "--out", "{out}"],
        r"cannot read threshold 'bds'",
    ),
    (
        "DE table folder without a table",
        ["calibrate", "{data}", "-p", "mse", "--de-table", "{bad}/empty_folder", "--out", "{out}"],
        r"DE table .*empty_folder: not found",
    ),
    (
        "empty control label",
        ["calibrate", "{data}", "-p", "mse", "--control-label", "", "--out", "{out}"],
        r"control label '' not found in column 'perturbation'; labels that look like controls",
    ),
    (
        "empty perturbation key",
        ["calibrate", "{data}", "-p", "mse", "--perturbation-key", "", "--out", "{out}"],
        r"perturbation_key must be a column name, got ''",
    ),
    (
        "a huge k",
        ["calibrate", "{data}", "-p", "mse_top_k=1e9", "--out", "{out}"],
        r"option k must be a whole number of at least 1, got 1000000000\.0",
    ),
    (
        "one protocol given twice",
        ["calibrate", "{data}", "-p", "mse,mse", "--out", "{out}"],
        r"protocol 'mse' given twice",
    ),
    (
        "a subset value with a trailing space",
        ["calibrate", "{data}", "-p", "mse", "--subset", "perturbation=control ", "--out", "{out}"],
        r"subset value\(s\) 'control ' \(nearest: 'control'\) not found",
    ),
    (
        "a seed in scientific notation",
        ["calibrate", "{data}", "-p", "mse", "--seed", "1e3", "--out", "{out}"],
        r"argument --seed: invalid int value: '1e3'",
    ),
    (
        "report into a file",
        ["report", "{bad}/tampered_seed_text", "--out", "{bad}/good.csv"],
        r"good\.csv is an existing file, not a folder",
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
    (
        "report: fold runs with damaged criterion values",
        ["report", "{bad}/fold_run_c0", "{bad}/fold_run_c1", "--out", "{out}"],
        r"fold_run_c0/criterion_values\.parquet: cannot read the stored criterion values",
    ),
    # distances: unknown --groups and --reference labels shown with the nearest label.
    (
        "distances: a --groups label with a trailing space",
        ["distances", "{data}", "--groupby", "perturbation", "--groups", "control ,G10"]
        + ["--out", "{out}"],
        r"group\(s\) 'control ' \(nearest: 'control'\) have no cell in column 'perturbation'",
    ),
    (
        "distances: a --reference label in the wrong case",
        ["distances", "{data}", "--groupby", "perturbation", "--reference", "CONTROL"]
        + ["--out", "{out}"],
        r"--reference: group 'CONTROL' \(nearest: 'control'\) is not in 'perturbation'",
    ),
    # Split tables without rows, or with a covariate the data does not have; folders as files.
    (
        "split table with a header and no row",
        ["split", "{data}", "--from", "{bad}/split_header_only.csv", "--out", "{out}.csv"],
        r"split_header_only\.csv: the table has columns but no row",
    ),
    (
        "split with a covariate column for data without a covariate",
        ["split", "{data}", "--from", "{bad}/split_covariate.csv", "--out", "{out}.csv"],
        r"has a covariate column but the data has no covariate; name its column",
    ),
    (
        "a folder given as the .h5ad",
        ["calibrate", "{bad}", "-p", "mse", "--out", "{out}"],
        r"bad_files: is a folder, not an \.h5ad file",
    ),
    (
        "a .zarr store given as the data",
        ["calibrate", "{bad}/store.zarr", "-p", "mse", "--out", "{out}"],
        r"store\.zarr: is a folder, not an \.h5ad file; read the store with anndata\.read_zarr",
    ),
    # Under a split the DE is against each fold's training cells: a DE table cannot stand in.
    (
        "calibrate: DE table with a split",
        ["calibrate", "{data}", "-p", "mse", "--split", "{bad}/split_two_folds.csv"]
        + ["--de-table", "{tmp}/nope", "--out", "{out}"],
        r"give the DE table or the split, not both",
    ),
    (
        "score: DE table with a split",
        ["score", "{data}", "--pred", "m={bad}/good.csv", "--split", "{bad}/split_two_folds.csv"]
        + ["--de-table", "{tmp}/nope", "--out", "{out}"],
        r"give the DE table or the split, not both",
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
    # Pooling screens is a yes or no.
    ("pool as a word", {"pool": "yes"}, SpecError, r"pool must be True or False, got 'yes'"),
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


#: Unusual input that is valid: (case id, arguments, pattern of the one warning or None).
VALID_CASES = [
    (
        "suite file with a byte-order mark",
        ["calibrate", "{data}", "-p", "{tmp}/bom.toml", "--out", "{out}"],
        None,
    ),
    (
        "distances with a one-cell group",
        ["distances", "{tmp}/one_cell.h5ad", "--groupby", "perturbation", "--out", "{out}"],
        r"1 group\(s\) of one cell: 'single'; their edistance rests on that cell alone",
    ),
    (
        "half-precision X",
        ["calibrate", "{tmp}/half.h5ad", "-p", "mse", "--out", "{out}"],
        None,
    ),
    (
        "prediction file whose name is not UTF-8",
        ["score", "{data}", "-p", "mse", "--pred", "{tmp}/caf\udce9.csv", "--out", "{out}"],
        r"mean total expression",
    ),
    (
        "a seed beyond 64 bits",
        ["calibrate", "{data}", "-p", "mse", "--seed", str(2**80), "--out", "{out}"],
        None,
    ),
    (
        "--overwrite into a folder of another command",
        ["calibrate", "{data}", "-p", "mse", "--overwrite", "--out", "{tmp}/score_run"],
        None,
    ),
]


def _write_valid_unusual(small_path: Path, tmp: Path) -> None:
    import anndata as ad
    import numpy as np

    (tmp / "bom.toml").write_bytes(
        b'\xef\xbb\xbf[[protocol]]\nname = "m"\nmetric = "mse"\n'
        b'negative = "matched_perturbed_sample"\n'
    )
    truth = ad.read_h5ad(small_path)
    labels = truth.obs["perturbation"].astype(str).to_numpy().copy()
    labels[np.flatnonzero(labels != "control")[0]] = "single"
    one_cell = truth.copy()
    one_cell.obs["perturbation"] = labels
    one_cell.write_h5ad(tmp / "one_cell.h5ad")
    half = truth.copy()
    half.X = np.asarray(half.X.todense()).astype(np.float16)
    half.write_h5ad(tmp / "half.h5ad")
    import pandas as pd

    labels_of = sorted(set(truth.obs["perturbation"].astype(str)) - {"control"})
    table = pd.DataFrame(np.full((len(labels_of), truth.n_vars), 0.5), columns=truth.var_names)
    table.insert(0, "perturbation", labels_of)
    # A Latin-1 file name reaches Python with a surrogate for its undecodable byte.
    Path(os.fsdecode(os.fsencode(tmp) + b"/caf\xe9.csv")).write_bytes(
        table.to_csv(index=False).encode()
    )
    (tmp / "score_run").mkdir()
    (tmp / "score_run" / "run.json").write_text('{"command": "score", "options": {}}')


@pytest.mark.parametrize(
    ("arguments", "warning"),
    [pytest.param(arguments, warning, id=case) for case, arguments, warning in VALID_CASES],
)
def test_unusual_valid_input_runs_with_at_most_one_warning(
    small_path, tmp_path, capsys, arguments, warning
):
    _write_valid_unusual(small_path, tmp_path)
    out = tmp_path / "out"
    filled = [a.format(data=small_path, out=out, tmp=tmp_path) for a in arguments]
    code = main(filled)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err and "error:" not in captured.err
    warnings = [line for line in captured.err.splitlines() if "warning:" in line]
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and re.search(warning, warnings[0]), captured.err


def test_half_precision_scores_as_the_same_values_stored_in_float32(small_path, tmp_path):
    """float16 X is read as float32: the run equals one on the same values stored in float32."""
    import anndata as ad
    import numpy as np
    import pandas as pd

    truth = ad.read_h5ad(small_path)
    values = np.asarray(truth.X.todense()).astype(np.float16)
    for name, dtype in (("half", np.float16), ("single", np.float32)):
        stored = truth.copy()
        stored.X = values.astype(dtype)
        stored.write_h5ad(tmp_path / f"{name}.h5ad")
        assert (
            main(
                ["calibrate", str(tmp_path / f"{name}.h5ad"), "-p", "mse,pearson_delta_pert"]
                + ["--out", str(tmp_path / name)]
            )
            == 0
        )
    half = pd.read_parquet(tmp_path / "half" / "results.parquet")
    single = pd.read_parquet(tmp_path / "single" / "results.parquet")
    pd.testing.assert_frame_equal(half, single)


def test_calibrate_into_a_score_run_keeps_its_report(small_path, bad_files, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "score",
                str(small_path),
                "-p",
                "mse",
                "--pred",
                f"m={bad_files}/good.csv",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    before = sorted(p.name for p in run.iterdir())
    assert "report.html" in before
    capsys.readouterr()
    assert main(["calibrate", str(small_path), "-p", "mse", "--out", str(run)]) == 2
    assert "holds the output of 'scperteval score'" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before
    # The same command again replaces its own run.
    assert (
        main(
            [
                "score",
                str(small_path),
                "-p",
                "mse",
                "--pred",
                f"m={bad_files}/good.csv",
                "--out",
                str(run),
            ]
        )
        == 0
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_folder_is_refused_before_any_work(small_path, tmp_path, capsys):
    out = tmp_path / "read_only"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert main(["calibrate", str(small_path), "-p", "mse", "--out", str(out)]) == 2
    finally:
        out.chmod(0o755)
    assert "exists and is not writable" in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_an_output_folder_that_takes_no_file_is_refused_before_reading(
    small_path, tmp_path, capsys, monkeypatch
):
    """The folder's own writability is tried (as root a read-only folder takes files)."""
    import scperteval.outputs as outputs

    out = tmp_path / "existing"
    out.mkdir()
    tried = outputs._can_create_in
    monkeypatch.setattr(outputs, "_can_create_in", lambda folder: folder != out and tried(folder))
    # The data path does not exist: refusing the folder first shows no work was started.
    assert main(["calibrate", str(tmp_path / "absent.h5ad"), "-p", "mse", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists and is not writable" in err and "absent" not in err


PROGRAM = "import sys; from scperteval.cli import console_main; sys.exit(console_main())"


def test_a_closed_pipe_ends_the_program_quietly_with_status_141():
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, "list", "protocols"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `| head -0` does: every write fails with EPIPE
    err = process.stderr.read().decode()
    assert process.wait() == 141
    assert err == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_on_standard_output_is_one_error_line_and_status_1():
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM, "list", "protocols"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "scperteval: error: cannot write to standard output (No space left on device)"
    ]
