"""Bad and unusual input in the Python API: refused with the expected type, or read as meant.

A string where a list is expected is a list of one, never split into letters; a
NumPy array where a tensor or an AnnData is expected is taken or refused in one
clear message; integer loss weights are cast as docs/torch.md says.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scperteval.errors import DatasetError, ScpertevalWarning, SpecError


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    from scperteval.simulation import simulate

    adata = simulate(n_perturbations=4, n_genes=30, cells_per_perturbation=12, seed=3)
    path = tmp_path_factory.mktemp("api_input") / "small.h5ad"
    adata.write_h5ad(path)
    labels = sorted(set(adata.obs["perturbation"].astype(str)) - {"control"})
    table = pd.DataFrame(np.full((len(labels), adata.n_vars), 0.5), columns=adata.var_names)
    table.insert(0, "perturbation", labels)
    return path, table


def test_pairwise_refuses_a_bare_array_naming_the_wrapper(small):
    from scperteval.distances import pairwise

    path, _ = small
    import anndata as ad

    matrix = ad.read_h5ad(path).X.toarray()
    with pytest.raises(DatasetError, match=r"got ndarray; a bare matrix .*anndata\.AnnData"):
        pairwise(matrix, "perturbation")


def test_pairwise_refuses_an_empty_group_list(small):
    from scperteval.distances import pairwise

    with pytest.raises(SpecError, match="groups is empty"):
        pairwise(small[0], "perturbation", groups=[])


def test_one_group_given_as_a_string_is_that_group(small):
    from scperteval.distances import pairwise

    path, table = small
    label = str(table["perturbation"].iloc[0])
    one = pairwise(path, "perturbation", groups=label, space="full")
    listed = pairwise(path, "perturbation", groups=[label], space="full")
    assert list(one.index) == [label]
    pd.testing.assert_frame_equal(one, listed)


@pytest.mark.parametrize("n_jobs", [0, -1, 2.5, True, "2"])
def test_distances_refuse_a_thread_count_that_is_not_a_positive_whole_number(small, n_jobs):
    from scperteval.distances import pairwise, permutation_test

    with pytest.raises(SpecError, match=r"n_jobs must be a whole number of at least 1 or None"):
        pairwise(small[0], "perturbation", n_jobs=n_jobs)
    with pytest.raises(SpecError, match=r"n_jobs must be a whole number of at least 1 or None"):
        permutation_test(small[0], "perturbation", "control", n_jobs=n_jobs)


def test_pairwise_refuses_nan_labels_instead_of_a_group_nan(small):
    import anndata as ad

    from scperteval.distances import pairwise

    adata = ad.read_h5ad(small[0])
    labels = adata.obs["perturbation"].astype(object)
    labels.iloc[3] = np.nan
    adata.obs["perturbation"] = labels
    with pytest.raises(DatasetError, match=r"1 cell\(s\) have no label \(NaN or None\)"):
        pairwise(adata, "perturbation")


def test_onesided_refuses_a_list_as_the_reference(small):
    from scperteval.distances import onesided

    with pytest.raises(SpecError, match="reference must be one group label, got list"):
        onesided(small[0], "perturbation", ["control"])


def test_a_one_cell_group_is_measured_with_one_warning(small):
    import anndata as ad

    from scperteval.distances import pairwise

    adata = ad.read_h5ad(small[0])
    labels = adata.obs["perturbation"].astype(str).to_numpy().copy()
    labels[np.flatnonzero(labels != "control")[0]] = "single"
    adata.obs["perturbation"] = labels
    with pytest.warns(ScpertevalWarning, match=r"1 group\(s\) of one cell: 'single'") as caught:
        table = pairwise(adata, "perturbation", space="full")
    assert len(caught) == 1
    assert np.isfinite(table.loc["single"].to_numpy()).all()


def test_deltas_and_baselines_as_strings_are_lists_of_one(small, tmp_path):
    import scperteval

    path, table = small
    changes = table.copy()
    genes = changes.columns[1:]
    changes[genes] = np.where(np.arange(len(genes)) % 2 == 0, 0.3, -0.3)
    as_text = scperteval.score(
        path,
        {"model": changes},
        protocols="mse",
        deltas="model",
        baselines="dataset_mean",
        progress=False,
    )
    as_list = scperteval.score(
        path,
        {"model": changes},
        protocols="mse",
        deltas=["model"],
        baselines=["dataset_mean"],
        progress=False,
    )
    pd.testing.assert_frame_equal(as_text.results, as_list.results)
    sources = set(as_text.results["source_name"])
    assert "dataset_mean" in sources and "control_mean" not in sources


def test_an_unknown_delta_name_is_refused_whole(small):
    import scperteval

    path, table = small
    with pytest.raises(SpecError, match=r"--delta names no given model: 'modle'"):
        scperteval.score(path, {"model": table}, protocols="mse", deltas="modle")


def test_a_table_with_two_different_rows_for_a_label_is_refused(small):
    import scperteval

    path, table = small
    repeated = pd.concat([table, table.iloc[[1]].assign(**{table.columns[1]: 0.9})])
    label = str(table["perturbation"].iloc[1])
    with pytest.raises(DatasetError, match=rf"have two or more different rows: '{label}'"):
        scperteval.score(path, {"m": repeated}, protocols="mse")


def test_repeating_the_same_row_scores_as_one_row(small):
    import scperteval

    path, table = small
    once = scperteval.score(path, {"m": table}, protocols="mse", progress=False)
    twice = scperteval.score(
        path, {"m": pd.concat([table, table.iloc[[0]]])}, protocols="mse", progress=False
    )
    pd.testing.assert_frame_equal(once.results, twice.results)


def _metric():
    torch = pytest.importorskip("torch")
    from scperteval.torch_backend import PerturbationMetrics

    rng = np.random.default_rng(0)
    truth = rng.normal(size=(3, 5))
    return PerturbationMetrics.from_tensors(
        torch.as_tensor(truth), ["A", "B", "A+B"], list("vwxyz"), "mse", control=np.zeros(5)
    ), truth


def test_update_takes_a_numpy_batch_as_a_tensor():
    torch = pytest.importorskip("torch")
    by_array, truth = _metric()
    by_tensor, _ = _metric()
    pred = truth + 0.25
    by_array.update(pred, ["A", "B", "A+B"])
    by_tensor.update(torch.as_tensor(pred), ["A", "B", "A+B"])
    found = by_array.compute()["mse"].values.to_numpy()
    assert np.array_equal(found, by_tensor.compute()["mse"].values.to_numpy())
    assert np.allclose(found, 0.0625, rtol=1e-12)


def test_update_with_one_label_as_a_string_reads_one_label():
    metric, truth = _metric()
    metric.update(truth[2:3] + 0.5, "A+B")
    values = metric.compute()["mse"].values
    assert values.loc[values.index.get_level_values(-1) == "A+B"].iloc[0] == pytest.approx(0.25)
    with pytest.raises(SpecError, match="1 labels for 2 predicted rows"):
        metric.update(truth[:2], "A")


def test_update_names_the_nearest_label_of_an_unknown_one():
    metric, truth = _metric()
    with pytest.raises(SpecError, match=r"unknown perturbation 'A\+B ' \(nearest: 'A\+B'\)"):
        metric.update(truth[:1], ["A+B "])


def test_update_refuses_a_list_of_lists_of_numbers():
    metric, _ = _metric()
    with pytest.raises(SpecError, match="a torch.Tensor or a NumPy array of numbers, got list"):
        metric.update([[0.0] * 5], ["A"])


def test_integer_loss_weights_are_cast_to_the_prediction_dtype():
    torch = pytest.importorskip("torch")
    from scperteval.torch_backend import weighted_mse_loss

    pred = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64)
    target = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    integer = weighted_mse_loss(pred, target, torch.tensor([1, 2, 3]))
    floating = weighted_mse_loss(pred, target, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    # (1 * 1 + 2 * 0 + 3 * 4) / 6 by hand.
    assert integer.dtype == torch.float64
    assert integer.item() == pytest.approx(13 / 6, rel=1e-15)
    assert integer.item() == floating.item()


def test_an_integer_prediction_is_still_refused():
    torch = pytest.importorskip("torch")
    from scperteval.torch_backend import weighted_mse_loss

    with pytest.raises(TypeError, match="pred must be a floating-point tensor"):
        weighted_mse_loss(torch.tensor([1, 2]), torch.tensor([1.0, 2.0]), torch.tensor([1, 1]))


#: Options of ``score`` of the wrong type or value: (case, keyword arguments, pattern).
SCORE_OPTION_CASES = [
    ("thresholds of an unknown key", {"thresholds": {"bds_minimum": 0.5}}, r"unknown key"),
    ("thresholds as a number", {"thresholds": 0.5}, r"thresholds must be a scperteval"),
    ("an unknown aggregate", {"aggregate": "mode"}, r"aggregate must be 'mean' or 'median'"),
    ("an unknown correction", {"correction": "sidak"}, r"correction must be 'bonferroni'"),
    ("a sample of no cells", {"sample_cells": 0}, r"sample_cells must be a whole number"),
    ("a fractional sample", {"sample_cells": 10.5}, r"got 10\.5"),
    ("figures as a word", {"figures": "no"}, r"figures must be True or False, got 'no'"),
    ("progress as a word", {"progress": "no"}, r"progress must be None, True or False"),
    ("baselines as a number", {"baselines": 3}, r"baselines must be True, False, a baseline"),
    ("an output folder as a number", {"out": 5}, r"out must be a folder path"),
]


@pytest.mark.parametrize(
    ("options", "pattern"),
    [pytest.param(options, pattern, id=case) for case, options, pattern in SCORE_OPTION_CASES],
)
def test_score_refuses_an_option_of_the_wrong_type(small, options, pattern, tmp_path):
    import scperteval

    path, table = small
    options = {"progress": False, **options}
    with pytest.raises(SpecError, match=pattern):
        scperteval.score(path, {"m": table}, protocols="mse", **options)


def test_thresholds_given_as_a_mapping_judge_as_the_same_thresholds(small):
    import scperteval
    from scperteval import Thresholds

    path, _ = small
    short = scperteval.calibrate(path, protocols="mse", thresholds={"bds": 0.9, "drf": 0.5})
    full = scperteval.calibrate(path, protocols="mse", thresholds=Thresholds(0.9, 0.5))
    assert short.thresholds == full.thresholds == Thresholds(bds_min=0.9, drf_min=0.5)
    pd.testing.assert_frame_equal(short.calibration, full.calibration)


def test_calibrate_refuses_a_sample_of_one_cell(small):
    import scperteval

    with pytest.raises(SpecError, match=r"sample_cells must be a whole number of at least 2"):
        scperteval.calibrate(small[0], protocols="energy_pca", sample_cells=1)


def test_de_refuses_a_wrong_reference_before_reading_the_data(tmp_path):
    import scperteval

    # The path does not exist: a refusal naming the reference shows it came first.
    with pytest.raises(SpecError, match=r"unknown reference 'ctrl'; valid: rest, control"):
        scperteval.de(tmp_path / "absent.h5ad", reference="ctrl")
    with pytest.raises(SpecError, match=r"progress must be None, True or False"):
        scperteval.de(tmp_path / "absent.h5ad", progress="yes")


@pytest.fixture(scope="module")
def stored_run(small, tmp_path_factory) -> Path:
    import scperteval

    path, table = small
    folder = tmp_path_factory.mktemp("stored") / "run"
    scperteval.score(path, {"m": table}, protocols="mse", out=folder, progress=False)
    return folder


REPORT_OPTION_CASES = [
    ("folders as a number", {"folders": 5}, r"folders must be a results folder"),
    ("an unknown aggregate", {"aggregate": "mode"}, r"aggregate must be 'mean' or 'median'"),
    ("an unknown correction", {"correction": "x"}, r"correction must be 'bonferroni' or 'bh'"),
    ("figures as a word", {"figures": "no"}, r"figures must be True or False"),
    ("no perturbation needed", {"min_perturbations": 0}, r"whole number of at least 1, got 0"),
    ("perturbations as text", {"min_perturbations": "3"}, r"at least 1, got '3'"),
]


@pytest.mark.parametrize(
    ("options", "pattern"),
    [pytest.param(options, pattern, id=case) for case, options, pattern in REPORT_OPTION_CASES],
)
def test_report_refuses_an_option_of_the_wrong_type(stored_run, options, pattern):
    import scperteval

    options = {"folders": stored_run, "progress": False, **options}
    with pytest.raises(SpecError, match=pattern):
        scperteval.report(**options)


def test_report_thresholds_as_a_mapping_equal_the_thresholds_object(stored_run, tmp_path):
    import scperteval
    from scperteval import Thresholds

    mapped = scperteval.report(stored_run, out=tmp_path / "a", thresholds={"bds": 0.5})
    typed = scperteval.report(stored_run, out=tmp_path / "b", thresholds=Thresholds(bds_min=0.5))
    pd.testing.assert_frame_equal(mapped.calibration, typed.calibration)
    assert mapped.thresholds == Thresholds(bds_min=0.5)


def test_a_context_reads_a_path_as_load_dataset_does(small, tmp_path):
    import scperteval

    path, _ = small
    context = scperteval.Context(path)
    expected = scperteval.Context(scperteval.load_dataset(path))
    np.testing.assert_array_equal(context.centroids(), expected.centroids())
    with pytest.raises(DatasetError, match=r"absent\.h5ad: file not found"):
        scperteval.Context(tmp_path / "absent.h5ad")
