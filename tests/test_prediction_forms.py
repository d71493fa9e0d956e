"""Predictions in every form users hold them: each scores exactly as the same AnnData."""

from __future__ import annotations

import re
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import scperteval
from scperteval.cli import main
from scperteval.errors import DatasetError, ScpertevalWarning, SpecError
from scperteval.simulation import simulate

#: Centroid, DE-free and rank protocols: defined for pseudobulk predictions.
PROTOCOLS = (
    "pearson_delta_ctrl,pearson_delta_pert,r2_delta_ctrl,cosine_delta_ctrl,mse,mae,l2,"
    "weighted_mse,weighted_r2_delta_pert,rank_full,transpose_rank,nir,pds"
)
KEYS = ["protocol", "covariate", "perturbation", "source", "source_name"]


@pytest.fixture(scope="module")
def screen():
    """A truth with a covariate, and a model's predicted cells (truth cells plus noise)."""
    truth = simulate(
        n_perturbations=6, n_genes=40, cells_per_perturbation=30, n_covariates=2, seed=11
    )
    rng = np.random.default_rng(5)
    cells = truth[truth.obs["perturbation"] != "control"].copy()
    dense = np.asarray(cells.X.toarray() if sp.issparse(cells.X) else cells.X, dtype=np.float64)
    cells.X = np.clip(dense * rng.lognormal(0.0, 0.2, dense.shape), 0, None)
    return truth, cells


def pseudobulk(cells: ad.AnnData) -> pd.DataFrame:
    """Per-perturbation means of predicted cells, by covariate: a table as users write it."""
    frame = pd.DataFrame(np.asarray(cells.X), columns=cells.var_names)
    frame["perturbation"] = cells.obs["perturbation"].astype(str).to_numpy()
    frame["cell_line"] = cells.obs["cell_line"].astype(str).to_numpy()
    return frame.groupby(["perturbation", "cell_line"], sort=True).mean().reset_index()


def values(truth, prediction, **options) -> pd.DataFrame:
    result = scperteval.score(
        truth,
        {"model": prediction},
        protocols=PROTOCOLS,
        covariate_key="cell_line",
        truth="all",
        baselines=False,
        figures=False,
        **options,
    )
    table = result.results
    table = table[table["source"] == "model"].sort_values(KEYS).reset_index(drop=True)
    return table


def assert_same(first: pd.DataFrame, second: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(first[KEYS], second[KEYS])
    np.testing.assert_allclose(
        second["value"].to_numpy(), first["value"].to_numpy(), rtol=1e-12, atol=1e-14
    )


def test_every_form_scores_as_the_pseudobulk_anndata(screen, tmp_path):
    truth, cells = screen
    table = pseudobulk(cells)
    genes = list(cells.var_names)
    obs = table[["perturbation", "cell_line"]].astype(str)
    obs.index = obs.index.astype(str)
    bulk = ad.AnnData(table[genes].to_numpy(), obs=obs, var=pd.DataFrame(index=genes))
    reference = values(truth, bulk)
    assert reference["value"].notna().all()
    # Predicted cells give the same centroids, hence the same centroid protocols.
    assert_same(reference, values(truth, cells))
    assert_same(reference, values(truth, table))
    indexed = table.set_index(["perturbation", "cell_line"])
    assert_same(reference, values(truth, indexed))
    for suffix, write in {
        ".csv": lambda p: table.to_csv(p, index=False),
        ".tsv": lambda p: table.to_csv(p, sep="\t", index=False),
        ".parquet": lambda p: table.to_parquet(p, index=False),
        ".h5ad": lambda p: bulk.write_h5ad(p),
    }.items():
        path = tmp_path / f"model{suffix}"
        write(path)
        assert_same(reference, values(truth, path))
    array = scperteval.PredictionArray(
        table[genes].to_numpy(), table["perturbation"], genes, covariates=table["cell_line"]
    )
    assert_same(reference, values(truth, array))
    npz = tmp_path / "model.npz"
    np.savez(
        npz,
        X=table[genes].to_numpy(),
        perturbations=table["perturbation"].to_numpy(dtype=str),
        genes=np.asarray(genes),
        covariates=table["cell_line"].to_numpy(dtype=str),
    )
    assert_same(reference, values(truth, npz))


def test_the_run_record_says_how_each_prediction_was_read(screen, tmp_path):
    truth, cells = screen
    table = pseudobulk(cells)
    path = tmp_path / "bulk.csv"
    table.to_csv(path, index=False)
    result = scperteval.score(
        truth,
        {"table": path, "cells": cells},
        protocols="mse",
        covariate_key="cell_line",
        truth="all",
        baselines=False,
        figures=False,
    )
    models = result.info["models"]
    assert models["table"]["read"] == (
        f"CSV table {path}: {len(table)} rows, perturbations from column 'perturbation'"
    )
    assert models["cells"]["read"].startswith("AnnData: ")
    assert models["cells"]["read"].endswith("perturbations from obs['perturbation']")
    assert models["table"]["pseudobulk"] and not models["cells"]["pseudobulk"]


def test_a_delta_table_scores_as_the_table_it_came_from(screen):
    truth, cells = screen
    table = pseudobulk(cells)
    genes = list(cells.var_names)
    # The measured control mean of each cell line, computed independently of the package.
    X = (truth.X.toarray() if sp.issparse(truth.X) else np.asarray(truth.X)).astype(np.float64)
    control = truth.obs["perturbation"].to_numpy() == "control"
    lines = truth.obs["cell_line"].astype(str).to_numpy()
    means = {line: X[control & (lines == line)].mean(axis=0) for line in np.unique(lines)}
    deltas = table.copy()
    deltas[genes] = table[genes].to_numpy() - np.vstack([means[c] for c in table["cell_line"]])
    assert (deltas[genes].to_numpy() < 0).any()
    reference = values(truth, table)
    assert_same(reference, values(truth, deltas, deltas=["model"]))
    # Undeclared, the same table is refused and the refusal says how to declare it.
    with pytest.raises(DatasetError, match=r"look like changes from .*deltas=\['model'\]"):
        values(truth, deltas)
    with pytest.raises(SpecError, match="names no given model: 'other'"):
        values(truth, table, deltas=["other"])


@pytest.mark.parametrize(
    ("transform", "pattern"),
    [
        (lambda x: np.round(np.expm1(x) * 50), r"look like raw counts"),
        (lambda x: np.expm1(x) * 10, r"look like an expm1 or count scale"),
        (lambda x: np.where(x > 1, np.nan, x), r"non-finite predicted value"),
    ],
    ids=["counts", "expm1", "nan"],
)
def test_predictions_off_the_truths_scale_are_refused(screen, transform, pattern):
    truth, cells = screen
    table = pseudobulk(cells)
    genes = list(cells.var_names)
    assert table[genes].to_numpy().max() > 1.5  # so that expm1(x) * 10 exceeds 20
    table[genes] = transform(table[genes].to_numpy())
    with pytest.raises(DatasetError, match=pattern):
        values(truth, table)


def test_negative_expression_is_scored_with_a_warning(screen):
    truth, cells = screen
    table = pseudobulk(cells)
    genes = list(cells.var_names)
    # A regression model's small negative outputs: kept, scored as given, and said.
    table[genes[0]] = -0.05
    with pytest.warns(ScpertevalWarning, match=r"12 negative value\(s\) .*scored as given"):
        warned = values(truth, table)
    assert warned["value"].notna().all()


def test_undeclared_changes_are_refused_even_when_their_total_looks_right(screen):
    truth, cells = screen
    table = pseudobulk(cells)
    genes = list(cells.var_names)
    matrix = table[genes].to_numpy()
    # One row of changes (summing below 0) among rows of expression: the mean total
    # stays near the controls', but no row of expression sums to less than 0.
    matrix[0] = np.where(np.arange(len(genes)) % 2 == 0, 0.1, -0.3)
    table[genes] = matrix
    n_negative = int((matrix < 0).sum())
    assert n_negative == len(genes) // 2 and matrix[0].sum() < 0
    share = f"{100 * n_negative / matrix.size:.1f}%"
    with pytest.raises(
        DatasetError,
        match=rf"{n_negative} negative value\(s\) \(minimum -0\.3, {re.escape(share)} of the "
        r"values\), 1 row\(s\) summing to less than 0, .*deltas=\['model'\]",
    ):
        values(truth, table)


def test_expression_declared_as_changes_is_said_to_look_like_expression(screen):
    truth, cells = screen
    table = pseudobulk(cells)
    genes = list(cells.var_names)
    X = (truth.X.toarray() if sp.issparse(truth.X) else np.asarray(truth.X)).astype(np.float64)
    control = truth.obs["perturbation"].to_numpy() == "control"
    lines = truth.obs["cell_line"].astype(str).to_numpy()
    totals = {line: X[control & (lines == line)].mean(axis=0).sum() for line in np.unique(lines)}
    expected = np.array([totals[c] for c in table["cell_line"]])
    ratio = table[genes].to_numpy().sum(axis=1).mean() / expected.mean()
    assert 1 / 3 < ratio < 3
    with pytest.warns(ScpertevalWarning) as caught:
        values(truth, table, deltas=["model"])
    said = [str(w.message) for w in caught if "looks like expression" in str(w.message)]
    assert said == [
        f"prediction 'model' is declared as changes from the control but has no negative "
        f"value and a total {ratio:.3g} times the control cells': it looks like expression; "
        "if it is, leave out --delta model (Python: deltas)"
    ]


def test_total_expression_far_from_the_truth_is_warned(screen):
    truth, cells = screen
    table = pseudobulk(cells)
    genes = list(cells.var_names)
    table[genes] = table[genes].to_numpy() / 10.0
    with pytest.warns(ScpertevalWarning, match=r"is 0\.1\d* times the control cells'"):
        values(truth, table)


def test_cell_eval_conventions_score_as_ours(screen):
    truth, cells = screen
    table = pseudobulk(cells)
    reference = values(truth, table)

    def renamed(adata_or_table, frame=False):
        if frame:
            out = adata_or_table.rename(columns={"perturbation": "target_gene"})
            out["target_gene"] = out["target_gene"].replace({"control": "non-targeting"})
            return out
        out = adata_or_table.copy()
        # The simulated truth names each perturbation's gene in its own column.
        out.obs = out.obs.drop(columns="target_gene").rename(
            columns={"perturbation": "target_gene"}
        )
        out.obs["target_gene"] = (
            out.obs["target_gene"].astype(str).replace({"control": "non-targeting"})
        )
        return out

    theirs_truth = renamed(truth)
    # Predicted control rows are part of cell-eval's files: they are ignored and said once.
    control_rows = table.groupby("cell_line").head(1).assign(perturbation="control")
    with_controls = renamed(pd.concat([table, control_rows], ignore_index=True), frame=True)
    with pytest.warns(ScpertevalWarning, match=r"2 predicted control row\(s\) ignored"):
        theirs = scperteval.score(
            theirs_truth,
            {"model": with_controls},
            protocols=PROTOCOLS,
            perturbation_key="target_gene",
            control_label="non-targeting",
            covariate_key="cell_line",
            truth="all",
            baselines=False,
            figures=False,
        ).results
    theirs = theirs[theirs["source"] == "model"].sort_values(KEYS).reset_index(drop=True)
    assert_same(reference, theirs)


def test_errors_for_other_tools_conventions(screen):
    truth, cells = screen
    table = pseudobulk(cells)
    theirs = truth.copy()
    theirs.obs["perturbation"] = (
        theirs.obs["perturbation"].astype(str).replace({"control": "non-targeting"})
    )
    with pytest.raises(DatasetError, match=r"look like controls: 'non-targeting'"):
        scperteval.score(theirs, {"m": table}, protocols="mse", covariate_key="cell_line")
    # The prediction names its perturbation column differently: the matching column is named.
    other = table.rename(columns={"perturbation": "target"})
    with pytest.raises(DatasetError, match=r"column 'target' holds 6 of the truth's"):
        values(truth, other.set_index("target").reset_index(drop=False).rename_axis("x"))
    lowered = table.rename(columns={g: g.lower() for g in cells.var_names})
    with pytest.raises(DatasetError, match=r"40 of them match only up to case"):
        values(truth, lowered)
    duplicated = table.rename(columns={cells.var_names[1]: cells.var_names[0]})
    with pytest.raises(DatasetError, match=r"1 duplicate gene name\(s\)"):
        values(truth, duplicated)


def test_wrong_types_say_what_is_accepted(screen):
    truth, cells = screen
    with pytest.raises(DatasetError, match="wrap it as scperteval.PredictionArray"):
        values(truth, np.zeros((3, 40)))
    with pytest.raises(DatasetError, match=r"cannot score a int; give an AnnData"):
        values(truth, 5)
    with pytest.raises(DatasetError, match="needs a name"):
        scperteval.score(truth, [pseudobulk(cells)], protocols="mse", covariate_key="cell_line")


def test_prediction_names_from_paths(tmp_path):
    from scperteval.scoring.predictions import prediction_inputs

    folder = tmp_path / "k=v"
    folder.mkdir()
    path = folder / "good.h5ad"
    path.write_bytes(b"")
    assert prediction_inputs([str(path)]) == {"good": str(path)}
    assert prediction_inputs([f"best={path}"]) == {"best": str(path)}
    with pytest.raises(DatasetError, match="non-empty"):
        prediction_inputs([f"={path}"])


def test_cli_reads_tables_and_deltas(screen, tmp_path, capsys):
    truth, cells = screen
    data = tmp_path / "truth.h5ad"
    truth.write_h5ad(data)
    table = pseudobulk(cells)
    table.to_csv(tmp_path / "good.csv", index=False)
    code = main(
        [
            "score",
            str(data),
            "--pred",
            f"good={tmp_path / 'good.csv'}",
            "-p",
            "mse",
            "--covariate-key",
            "cell_line",
            "--truth",
            "all",
            "--no-baselines",
            "--no-figures",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert re.search(r"good: CSV table .*good\.csv: 12 rows, perturbations from column", out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code = main(
            [
                "score",
                str(data),
                "--pred",
                f"good={tmp_path / 'good.csv'}",
                "--delta",
                "nope",
                "-p",
                "mse",
                "--covariate-key",
                "cell_line",
                "--out",
                str(tmp_path / "out2"),
            ]
        )
    assert code == 2
    assert "--delta names no given model: 'nope'" in capsys.readouterr().err


def test_norman_predictions_in_every_form(devel_path, tmp_path):
    """On real data: cells, pseudobulk AnnData, tables and arrays give identical values."""
    truth = ad.read_h5ad(devel_path)
    truth = truth[truth.obs["dataset"] == "norman19"].copy()
    rng = np.random.default_rng(7)
    cells = truth[truth.obs["condition"] != "control"].copy()
    dense = cells.X.toarray() if sp.issparse(cells.X) else np.asarray(cells.X)
    cells.X = dense * rng.lognormal(0.0, 0.1, dense.shape)
    frame = pd.DataFrame(cells.X, columns=cells.var_names)
    frame["condition"] = cells.obs["condition"].astype(str).to_numpy()
    table = frame.groupby("condition", sort=True).mean()

    def run(prediction):
        result = scperteval.score(
            truth,
            {"model": prediction},
            protocols=PROTOCOLS,
            perturbation_key="condition",
            truth="all",
            baselines=False,
            figures=False,
        ).results
        return result[result["source"] == "model"].sort_values(KEYS).reset_index(drop=True)

    reference = run(cells)
    assert reference["value"].notna().mean() > 0.9
    table.to_csv(tmp_path / "model.csv")  # the index becomes a "condition" column
    table.to_parquet(tmp_path / "model.parquet")
    forms = [
        table,
        table.reset_index(),
        tmp_path / "model.csv",
        tmp_path / "model.parquet",
        scperteval.PredictionArray(table.to_numpy(), table.index, table.columns),
    ]
    for form in forms:
        assert_same(reference, run(form))


@pytest.mark.parametrize("form", ["dense", "csr"])
def test_prediction_checks_read_blocks_of_rows_with_the_values_of_a_whole_copy(monkeypatch, form):
    import scipy.sparse as sp

    from scperteval.scoring import prediction_checks

    rng = np.random.default_rng(6)
    dense = rng.normal(loc=0.5, size=(23, 9)).astype(np.float32)
    dense[dense < 0.2] = 0.0
    dense[4, 2] = -1.5
    matrix = sp.csr_matrix(dense) if form == "csr" else dense
    used = rng.permutation(23)[:19]
    whole = matrix[used]
    values_of = whole.data if form == "csr" else whole
    expected_totals = np.asarray(whole.sum(axis=1)).ravel()
    for rows in (1, 4, 10_000):
        monkeypatch.setattr(prediction_checks, "CHECK_ROWS", rows)
        totals, n_negative, low = prediction_checks._scan_rows(matrix, used)
        assert totals.dtype == expected_totals.dtype
        np.testing.assert_array_equal(totals, expected_totals)
        assert n_negative == int((values_of < 0).sum()) == int(4 in used)
        assert low == float(values_of.min())


def test_predictions_in_the_truths_gene_order_are_not_copied():
    import scipy.sparse as sp

    from scperteval.scoring.predictions import _truth_columns

    matrix = np.arange(24, dtype=np.float32).reshape(4, 6)
    same = _truth_columns(matrix, np.arange(6))
    assert same is matrix
    order = np.array([5, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(_truth_columns(matrix, order), matrix[:, order])
    # Any other layout is copied by column selection, as before.
    fortran = np.asfortranarray(matrix)
    copied = _truth_columns(fortran, np.arange(6))
    assert not np.shares_memory(copied, fortran)
    assert copied.flags.c_contiguous == fortran[:, np.arange(6)].flags.c_contiguous
    np.testing.assert_array_equal(copied, matrix)
    sparse = _truth_columns(sp.csr_matrix(matrix), order)
    np.testing.assert_array_equal(sparse.toarray(), matrix[:, order])
    # A CSR matrix in order is kept, and equals what the selection gives, entry
    # order and repeated columns included.
    indptr = np.array([0, 3, 3, 5])
    indices = np.array([4, 1, 4, 5, 0])
    unsorted = sp.csr_matrix((np.arange(1.0, 6.0), indices, indptr), shape=(3, 6))
    kept = _truth_columns(unsorted, np.arange(6))
    assert np.shares_memory(kept.data, unsorted.data)
    selected = unsorted[:, np.arange(6)]
    np.testing.assert_array_equal(kept.indptr, selected.indptr)
    np.testing.assert_array_equal(kept.indices, selected.indices)
    np.testing.assert_array_equal(kept.data, selected.data)
