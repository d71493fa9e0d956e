"""Cells of several screens under the same labels: refused unless told how to read them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import scperteval
from scperteval.data.load import pooled_columns
from scperteval.errors import DatasetError
from scperteval.simulation import simulate


@pytest.fixture(scope="module")
def two_lines():
    return simulate(
        n_perturbations=5, n_genes=30, cells_per_perturbation=16, n_covariates=2, seed=2
    )


def _shared_labels(adata, column: str, min_cells: int = 4) -> list[str]:
    """Labels with at least ``min_cells`` cells under two values of ``column`` (pandas only)."""
    obs = adata.obs.astype(str)
    perturbed = obs[obs["perturbation"] != "control"]
    counts = pd.crosstab(perturbed["perturbation"], perturbed[column])
    return sorted(counts.index[(counts >= min_cells).sum(axis=1) >= 2])


def test_a_column_splitting_screens_stops_the_run_with_both_fixes(two_lines) -> None:
    shared = _shared_labels(two_lines, "cell_line")
    assert shared
    with pytest.raises(DatasetError) as refused:
        scperteval.load_dataset(two_lines)
    message = str(refused.value)
    assert "obs column 'cell_line' splits the cells into 2 groups" in message
    assert f"share perturbation labels ({shared[0]!r}" in message
    assert "--subset cell_line=cell_line_0" in message
    assert "--covariate-key cell_line" in message and "--pool" in message
    assert "\n" not in message
    found = pooled_columns(scperteval.load_dataset(two_lines, pool=True))
    assert [p.column for p in found] == ["cell_line"]
    assert found[0].shared == shared
    assert found[0].values == ["cell_line_0", "cell_line_1"]


def test_either_fix_or_pool_lets_the_run_go_on(two_lines) -> None:
    apart = scperteval.load_dataset(two_lines, covariate_key="cell_line")
    assert apart.covariates == ["cell_line_0", "cell_line_1"]
    one = scperteval.load_dataset(two_lines, subset={"cell_line": "cell_line_1"})
    assert one.n_cells == int((two_lines.obs["cell_line"] == "cell_line_1").sum())
    pooled = scperteval.load_dataset(two_lines, pool=True)
    assert pooled.n_cells == two_lines.n_obs and pooled.covariates == ["all"]


def test_columns_that_do_not_split_screens_are_left_alone(two_lines) -> None:
    adata = two_lines[two_lines.obs["cell_line"] == "cell_line_0"].copy()
    labels = adata.obs["perturbation"].astype(str).to_numpy()
    # A label-derived column (one value per label) and a column whose second value
    # holds no control cells: neither is two screens.
    adata.obs["kind"] = np.where(labels == "control", "control", "perturbed")
    adata.obs["label_copy"] = labels
    adata.obs["reads"] = np.linspace(0.0, 1.0, adata.n_obs)
    assert _shared_labels(adata, "kind") == []
    dataset = scperteval.load_dataset(adata)
    assert pooled_columns(dataset) == []


def test_the_refusal_comes_from_every_entry_point(two_lines) -> None:
    with pytest.raises(DatasetError, match="splits the cells"):
        scperteval.calibrate(two_lines, protocols="mse")
    with pytest.raises(DatasetError, match="splits the cells"):
        scperteval.de(two_lines)
