from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from scperteval.errors import DatasetError
from scperteval.simulation import (
    NORMALIZED_TOTAL,
    PREDICTION_KINDS,
    simulate,
    simulate_predictions,
)

SMALL = {
    "n_perturbations": 8,
    "n_genes": 60,
    "cells_per_perturbation": 40,
    "n_covariates": 2,
    "n_combinations": 3,
}


@pytest.fixture(scope="module")
def data() -> ad.AnnData:
    return simulate(**SMALL, seed=3)


def dense(matrix) -> np.ndarray:
    return matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)


def truth_row(adata: ad.AnnData, covariate: str, perturbation: str) -> int:
    conditions = adata.uns["simulation"]["conditions"]
    match = (np.asarray(conditions["covariate"]) == covariate) & (
        np.asarray(conditions["perturbation"]) == perturbation
    )
    (rows,) = np.flatnonzero(match)
    return int(rows)


def cells_of(adata: ad.AnnData, covariate: str, perturbation: str) -> np.ndarray:
    obs = adata.obs
    return np.flatnonzero(
        (obs["cell_line"].astype(str) == covariate).to_numpy()
        & (obs["perturbation"].astype(str) == perturbation).to_numpy()
    )


def perturbed_pairs(adata: ad.AnnData) -> set[tuple[str, str]]:
    obs = adata.obs.astype(str)
    perturbed = obs[obs["perturbation"] != "control"]
    return set(zip(perturbed["cell_line"], perturbed["perturbation"], strict=True))


# --- simulate -------------------------------------------------------------------------


def test_same_seed_gives_identical_data_and_other_seed_differs(data: ad.AnnData) -> None:
    again = simulate(**SMALL, seed=3)
    other = simulate(**SMALL, seed=4)
    assert (data.X != again.X).nnz == 0
    assert (data.layers["counts"] != again.layers["counts"]).nnz == 0
    assert data.obs.equals(again.obs)
    np.testing.assert_array_equal(
        data.uns["simulation"]["effects"], again.uns["simulation"]["effects"]
    )
    assert data.X.shape == other.X.shape
    assert (data.X != other.X).nnz > 0


def test_data_does_not_depend_on_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from scperteval.simulation import dataset

    # Small blocks so that several blocks run concurrently.
    monkeypatch.setattr(dataset, "_CELL_BLOCK", 64)
    results = []
    for n_threads in (1, 3):
        monkeypatch.setattr(dataset, "_N_THREADS", n_threads)
        results.append(simulate(n_perturbations=5, n_genes=30, cells_per_perturbation=50, seed=9))
    assert (results[0].layers["counts"] != results[1].layers["counts"]).nnz == 0
    assert (results[0].X != results[1].X).nnz == 0


def test_shapes_obs_and_storage(data: ad.AnnData) -> None:
    n_conditions = SMALL["n_perturbations"] + SMALL["n_combinations"]
    n_controls = 2 * SMALL["cells_per_perturbation"]
    expected_cells = SMALL["n_covariates"] * (
        n_conditions * SMALL["cells_per_perturbation"] + n_controls
    )
    assert data.shape == (expected_cells, SMALL["n_genes"])
    assert list(data.var_names) == [f"G{g}" for g in range(SMALL["n_genes"])]
    assert data.obs_names.is_unique
    for column in ("perturbation", "cell_line", "target_gene"):
        assert isinstance(data.obs[column].dtype, pd.CategoricalDtype)
    for matrix in (data.X, data.layers["counts"]):
        assert sp.issparse(matrix) and matrix.format == "csr"
        assert matrix.dtype == np.float32
        assert matrix.has_sorted_indices
    counts = data.layers["counts"].data
    np.testing.assert_array_equal(counts, np.round(counts))
    assert (counts > 0).all()
    # Perturbations are named by their target; combinations list both targets.
    obs = data.obs.astype(str)
    perturbed = obs[obs["perturbation"] != "control"]
    assert (perturbed["perturbation"] == perturbed["target_gene"]).all()
    assert (obs.loc[obs["perturbation"] == "control", "target_gene"] == "").all()
    combinations = perturbed.loc[perturbed["perturbation"].str.contains("+", regex=False)]
    assert combinations["perturbation"].nunique() == SMALL["n_combinations"]
    parameters = data.uns["simulation"]["parameters"]
    assert parameters["n_control_cells"] == n_controls
    assert parameters["seed"] == 3


def test_single_covariate_still_has_a_covariate_column() -> None:
    adata = simulate(n_perturbations=3, n_genes=20, cells_per_perturbation=5, seed=0)
    assert adata.obs["cell_line"].nunique() == 1
    assert adata.shape == (3 * 5 + 10, 20)


def test_x_is_normalize_total_then_log1p_of_counts(data: ad.AnnData) -> None:
    counts = dense(data.layers["counts"]).astype(np.float64)
    totals = counts.sum(axis=1)
    expressed = totals > 0
    assert expressed.all()
    x = dense(data.X).astype(np.float64)
    np.testing.assert_allclose(np.expm1(x).sum(axis=1), NORMALIZED_TOTAL, rtol=1e-4)
    expected = np.log1p(counts / totals[:, None] * NORMALIZED_TOTAL)
    np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-6)
    assert (data.X.indices == data.layers["counts"].indices).all()


def test_target_knock_down_is_visible(data: ad.AnnData) -> None:
    x = dense(data.X)
    singles = [
        p for p in data.obs["perturbation"].cat.categories if p != "control" and "+" not in p
    ]
    assert len(singles) == SMALL["n_perturbations"]
    for covariate in data.obs["cell_line"].cat.categories:
        controls = cells_of(data, covariate, "control")
        for perturbation in singles:
            target = data.var_names.get_loc(perturbation)
            knocked = x[cells_of(data, covariate, perturbation), target].mean()
            assert knocked < x[controls, target].mean(), (covariate, perturbation)


def test_control_bias_shifts_every_perturbed_cell_and_no_control() -> None:
    adata = simulate(
        n_perturbations=10,
        n_genes=100,
        cells_per_perturbation=60,
        n_control_cells=300,
        control_bias=1.0,
        control_bias_fraction=0.3,
        affected_fraction=0.05,
        seed=11,
    )
    bias = adata.uns["simulation"]["control_bias"]
    biased = bias != 0
    assert biased.sum() == 30
    np.testing.assert_array_equal(np.abs(bias[biased]), 1.0)
    x = dense(adata.X)
    is_control = (adata.obs["perturbation"] == "control").to_numpy()
    shift = x[~is_control].mean(axis=0) - x[is_control].mean(axis=0)
    # Sparse genes compress log-fold-changes, so judge the genes expressed well.
    expressed = x[is_control].mean(axis=0) > 1.0
    assert np.mean(np.sign(shift[biased & expressed]) == np.sign(bias[biased & expressed])) > 0.9
    assert np.median(np.abs(shift[biased & expressed])) > 0.5
    assert np.median(np.abs(shift[~biased & expressed])) < 0.25
    # The noise-free profiles carry the bias for perturbed conditions only.
    truth = adata.uns["simulation"]
    perturbation = np.asarray(truth["conditions"]["perturbation"])
    control_profile = truth["profiles"][perturbation == "control"][0]
    no_bias = simulate(
        n_perturbations=10,
        n_genes=100,
        cells_per_perturbation=60,
        n_control_cells=300,
        control_bias=0.0,
        control_bias_fraction=0.3,
        affected_fraction=0.05,
        seed=11,
    )
    np.testing.assert_array_equal(
        control_profile, no_bias.uns["simulation"]["profiles"][perturbation == "control"][0]
    )


def test_stored_effects_show_in_the_cells() -> None:
    adata = simulate(
        n_perturbations=5,
        n_genes=100,
        cells_per_perturbation=200,
        affected_fraction=0.2,
        effect_size=1.0,
        seed=5,
    )
    x = dense(adata.X)
    controls = cells_of(adata, "cell_line_0", "control")
    expressed = x[controls].mean(axis=0) > 1.0
    for perturbation in adata.obs["perturbation"].cat.categories[1:]:
        effect = adata.uns["simulation"]["effects"][truth_row(adata, "cell_line_0", perturbation)]
        observed = x[cells_of(adata, "cell_line_0", perturbation)].mean(axis=0) - x[controls].mean(
            axis=0
        )
        affected = (effect != 0) & expressed
        assert np.corrcoef(effect[affected], observed[affected])[0, 1] > 0.8


def test_combination_effects_are_additive_without_interaction(data: ad.AnnData) -> None:
    truth = data.uns["simulation"]
    effects = truth["effects"]
    for covariate in data.obs["cell_line"].cat.categories:
        for perturbation in data.obs["perturbation"].cat.categories:
            if "+" not in perturbation:
                continue
            first, second = perturbation.split("+")
            np.testing.assert_allclose(
                effects[truth_row(data, covariate, perturbation)],
                effects[truth_row(data, covariate, first)]
                + effects[truth_row(data, covariate, second)],
                atol=1e-6,
            )
            assert data.obs["target_gene"].astype(str).isin([perturbation]).any()


def test_interaction_acts_on_programmes_and_keeps_singles_unchanged(data: ad.AnnData) -> None:
    interacting = simulate(**SMALL, seed=3, interaction_size=0.5)
    with_truth, without_truth = interacting.uns["simulation"], data.uns["simulation"]
    perturbation = np.asarray(with_truth["conditions"]["perturbation"])
    is_combination = np.char.find(perturbation.astype(str), "+") >= 0
    np.testing.assert_array_equal(
        with_truth["effects"][~is_combination], without_truth["effects"][~is_combination]
    )
    difference = with_truth["effects"][is_combination] - without_truth["effects"][is_combination]
    assert np.abs(difference).max() > 0.1
    for row, name in zip(difference, perturbation[is_combination], strict=True):
        targets = [interacting.var_names.get_loc(t) for t in str(name).split("+")]
        np.testing.assert_array_equal(row[targets], 0.0)


def test_every_covariate_group_has_controls_and_all_perturbations() -> None:
    adata = simulate(n_perturbations=4, n_genes=40, cells_per_perturbation=10, n_covariates=3)
    obs = adata.obs.astype(str)
    table = pd.crosstab(obs["cell_line"], obs["perturbation"])
    assert table.shape == (3, 5)
    assert (table["control"] == 20).all()
    assert (table.drop(columns="control") == 10).all().all()
    truth = adata.uns["simulation"]
    control_profiles = truth["profiles"][
        np.asarray(truth["conditions"]["perturbation"]) == "control"
    ]
    assert control_profiles.shape[0] == 3
    assert not np.allclose(control_profiles[0], control_profiles[1])


def test_truth_survives_h5ad_round_trip(data: ad.AnnData, tmp_path) -> None:
    path = tmp_path / "simulated.h5ad"
    data.write_h5ad(path)
    back = ad.read_h5ad(path)
    written, read = data.uns["simulation"], back.uns["simulation"]
    assert dict(read["parameters"]) == dict(written["parameters"])
    for key in ("effects", "control_bias", "profiles"):
        np.testing.assert_array_equal(read[key], written[key])
        assert read[key].dtype == np.float32
    np.testing.assert_array_equal(read["gene_names"].astype(str), written["gene_names"])
    for key, values in written["conditions"].items():
        np.testing.assert_array_equal(np.asarray(read["conditions"][key]).astype(str), values)
    assert (back.X != data.X).nnz == 0
    assert back.obs.equals(data.obs)

    predicted = simulate_predictions(data, "mean", cells_per_perturbation=3)
    predicted.write_h5ad(tmp_path / "predicted.h5ad")
    predicted_back = ad.read_h5ad(tmp_path / "predicted.h5ad")
    assert dict(predicted_back.uns["prediction"]) == dict(predicted.uns["prediction"])
    assert predicted_back.obs.equals(predicted.obs)


def test_poisson_counts_when_dispersion_is_zero() -> None:
    adata = simulate(n_perturbations=2, n_genes=30, cells_per_perturbation=20, dispersion=0.0)
    assert adata.layers["counts"].nnz > 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"n_perturbations": 50, "n_genes": 20}, "cannot exceed n_genes"),
        ({"n_perturbations": 3, "n_combinations": 4}, "distinct pairs"),
        ({"affected_fraction": 1.5}, "affected_fraction"),
        ({"knockdown_efficiency": 1.0}, "knockdown_efficiency"),
        ({"cells_per_perturbation": 0}, "cells_per_perturbation"),
        ({"n_genes": 2.5}, "n_genes must be an integer"),
        ({"dispersion": float("nan")}, "dispersion"),
        ({"control_label": "G3"}, "also a gene name"),
        ({"covariate_key": "perturbation"}, "must differ"),
    ],
)
def test_invalid_simulation_arguments_raise(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        simulate(**arguments)


# --- simulate_predictions --------------------------------------------------------------


@pytest.mark.parametrize("kind", PREDICTION_KINDS)
def test_predictions_cover_every_perturbation_with_truth_counts(
    data: ad.AnnData, kind: str
) -> None:
    predicted = simulate_predictions(data, kind, seed=1)
    assert list(predicted.var_names) == list(data.var_names)
    assert list(predicted.obs.columns) == ["perturbation", "cell_line", "target_gene"]
    assert perturbed_pairs(predicted) == perturbed_pairs(data)
    observed = predicted.obs.astype(str).value_counts(["cell_line", "perturbation"])
    assert (observed == SMALL["cells_per_perturbation"]).all()
    assert (
        predicted.obs["target_gene"].astype(str) == predicted.obs["perturbation"].astype(str)
    ).all()
    assert predicted.uns["prediction"]["kind"] == kind

    resized = simulate_predictions(data, kind, seed=1, cells_per_perturbation=7)
    assert (resized.obs.astype(str).value_counts(["cell_line", "perturbation"]) == 7).all()

    bulk = simulate_predictions(data, kind, seed=1, pseudobulk=True)
    assert bulk.n_obs == len(perturbed_pairs(data))
    assert perturbed_pairs(bulk) == perturbed_pairs(data)


@pytest.mark.parametrize("kind", PREDICTION_KINDS)
def test_predictions_are_deterministic_per_seed(data: ad.AnnData, kind: str) -> None:
    options = {"noise": 0.2, "scale": 0.5} if kind == "scaled_effect" else {"noise": 0.2}
    first = simulate_predictions(data, kind, seed=5, **options)
    second = simulate_predictions(data, kind, seed=5, **options)
    other = simulate_predictions(data, kind, seed=6, **options)
    np.testing.assert_array_equal(dense(first.X), dense(second.X))
    assert not np.array_equal(dense(first.X), dense(other.X))


def test_noisy_truth_without_noise_is_the_truth(data: ad.AnnData) -> None:
    predicted = simulate_predictions(data, "noisy_truth")
    x = dense(data.X)
    for covariate, perturbation in perturbed_pairs(data):
        rows = (predicted.obs["cell_line"] == covariate) & (
            predicted.obs["perturbation"] == perturbation
        )
        np.testing.assert_array_equal(
            dense(predicted.X[rows.to_numpy()]), x[cells_of(data, covariate, perturbation)]
        )
    bulk = simulate_predictions(data, "noisy_truth", pseudobulk=True)
    first = bulk.obs.iloc[0]
    np.testing.assert_allclose(
        bulk.X[0],
        x[cells_of(data, first["cell_line"], first["perturbation"])].mean(axis=0),
        rtol=1e-6,
    )


def test_noisy_truth_adds_clipped_gaussian_noise(data: ad.AnnData) -> None:
    clean = dense(simulate_predictions(data, "noisy_truth").X)
    noisy = simulate_predictions(data, "noisy_truth", noise=0.3).X
    assert noisy.dtype == np.float32 and (noisy >= 0).all()
    # Away from the clip at 0 the added noise is unbiased with the requested sd.
    away_from_zero = clean > 2.0
    residual = (noisy - clean)[away_from_zero]
    assert abs(residual.mean()) < 0.02
    assert residual.std() == pytest.approx(0.3, rel=0.05)


def test_control_kind_relabels_control_cells_of_the_same_group(data: ad.AnnData) -> None:
    predicted = simulate_predictions(data, "control", seed=2)
    x = dense(data.X)
    predicted_x = dense(predicted.X)
    for covariate in data.obs["cell_line"].cat.categories:
        control_rows = {row.tobytes() for row in x[cells_of(data, covariate, "control")]}
        in_group = (predicted.obs["cell_line"] == covariate).to_numpy()
        assert all(row.tobytes() in control_rows for row in predicted_x[in_group])
    bulk = simulate_predictions(data, "control", pseudobulk=True)
    covariate = bulk.obs["cell_line"].iloc[0]
    np.testing.assert_allclose(
        bulk.X[0], x[cells_of(data, covariate, "control")].mean(axis=0), rtol=1e-6
    )


def test_mean_kind_draws_from_other_perturbations_only(data: ad.AnnData) -> None:
    predicted = simulate_predictions(data, "mean", seed=4)
    x = dense(data.X)
    predicted_x = dense(predicted.X)
    owner = {
        row.tobytes(): (str(c), str(p))
        for row, c, p in zip(x, data.obs["cell_line"], data.obs["perturbation"], strict=True)
    }
    for row, covariate, perturbation in zip(
        predicted_x, predicted.obs["cell_line"], predicted.obs["perturbation"], strict=True
    ):
        source_covariate, source_perturbation = owner[row.tobytes()]
        assert source_covariate == covariate
        assert source_perturbation not in ("control", perturbation)

    bulk = simulate_predictions(data, "mean", pseudobulk=True)
    covariate = "cell_line_1"
    perturbations = [p for c, p in sorted(perturbed_pairs(data)) if c == covariate]
    centroids = {p: x[cells_of(data, covariate, p)].mean(axis=0) for p in perturbations}
    for perturbation in perturbations:
        row = (bulk.obs["cell_line"] == covariate) & (bulk.obs["perturbation"] == perturbation)
        expected = np.mean([centroids[p] for p in perturbations if p != perturbation], axis=0)
        np.testing.assert_allclose(bulk.X[row.to_numpy()][0], expected, rtol=1e-5, atol=1e-6)


def test_mode_collapse_predicts_one_profile_per_group(data: ad.AnnData) -> None:
    predicted = simulate_predictions(data, "mode_collapse", seed=4)
    predicted_x = dense(predicted.X)
    for covariate in data.obs["cell_line"].cat.categories:
        in_group = predicted.obs["cell_line"] == covariate
        blocks = [
            predicted_x[(in_group & (predicted.obs["perturbation"] == p)).to_numpy()]
            for p in predicted.obs.loc[in_group, "perturbation"].unique()
        ]
        for block in blocks[1:]:
            np.testing.assert_array_equal(block, blocks[0])
    bulk = simulate_predictions(data, "mode_collapse", pseudobulk=True)
    first_group = (bulk.obs["cell_line"] == "cell_line_0").to_numpy()
    assert np.ptp(bulk.X[first_group], axis=0).max() == 0


def test_scaled_effect_moves_cells_along_their_effect(data: ad.AnnData) -> None:
    truth = dense(simulate_predictions(data, "noisy_truth").X)
    np.testing.assert_array_equal(simulate_predictions(data, "scaled_effect").X, truth)

    x = dense(data.X).astype(np.float64)
    centers = {
        c: x[cells_of(data, c, "control")].mean(axis=0) for c in ("cell_line_0", "cell_line_1")
    }
    reference = simulate_predictions(data, "noisy_truth")
    center = np.vstack([centers[c] for c in reference.obs["cell_line"].astype(str)])

    flattened = simulate_predictions(data, "scaled_effect", scale=0.0).X
    np.testing.assert_allclose(flattened, center, rtol=1e-6, atol=1e-6)

    doubled = simulate_predictions(data, "scaled_effect", scale=2.0).X
    expected = np.maximum(center + 2.0 * (truth - center), 0.0)
    np.testing.assert_allclose(doubled, expected, rtol=1e-5, atol=1e-5)


def test_predictions_work_without_covariate_and_on_dense_input(data: ad.AnnData) -> None:
    in_group = (data.obs["cell_line"] == "cell_line_0").to_numpy()
    plain = ad.AnnData(
        X=dense(data.X)[in_group],
        obs=data.obs.loc[in_group, ["perturbation"]].copy(),
        var=data.var.copy(),
    )
    for kind in PREDICTION_KINDS:
        predicted = simulate_predictions(plain, kind, seed=0)
        assert list(predicted.obs.columns) == ["perturbation"]
        assert set(predicted.obs["perturbation"]) == set(plain.obs["perturbation"]) - {"control"}


def test_invalid_prediction_arguments_raise(data: ad.AnnData) -> None:
    with pytest.raises(ValueError, match="unknown prediction kind"):
        simulate_predictions(data, "perfect")
    with pytest.raises(ValueError, match="scaled_effect"):
        simulate_predictions(data, "mean", scale=2.0)
    with pytest.raises(ValueError, match="noise"):
        simulate_predictions(data, "noisy_truth", noise=-1.0)
    with pytest.raises(ValueError, match="cells_per_perturbation"):
        simulate_predictions(data, "mean", cells_per_perturbation=0)
    with pytest.raises(DatasetError, match="layer"):
        simulate_predictions(data, "mean", layer="missing")
    with pytest.raises(DatasetError, match="covariate column"):
        simulate_predictions(data, "mean", covariate_key="donor")
    no_controls = data[(data.obs["perturbation"] != "control").to_numpy()]
    with pytest.raises(DatasetError, match="no control cells"):
        simulate_predictions(no_controls, "control")
    first_perturbation = data.obs["perturbation"].cat.categories[1]
    single = data[data.obs["perturbation"].isin(["control", first_perturbation]).to_numpy()]
    with pytest.raises(DatasetError, match="at least two perturbations"):
        simulate_predictions(single, "mean")


def test_combination_pairs_enumerate_the_upper_triangle() -> None:
    from scperteval.simulation.dataset import _pair_of_index

    for n in (2, 3, 7, 30):
        first, second = np.triu_indices(n, k=1)
        expected = list(zip(first.tolist(), second.tolist(), strict=True))
        assert [_pair_of_index(index, n) for index in range(first.size)] == expected
