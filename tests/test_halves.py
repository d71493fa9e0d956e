"""Seeded truth / duplicate halves: reproducible, name-seeded, floor(n/2), a partition."""

from __future__ import annotations

import numpy as np
import pytest

from scperteval.data.dataset import Dataset
from scperteval.data.halves import derive_seed, split_halves
from scperteval.data.layout import GroupLayout

PERT = "perturbation"
COV = "cell_line"


def make_dataset(adata, **kwargs) -> Dataset:
    kwargs.setdefault("perturbation_key", PERT)
    kwargs.setdefault("covariate_key", COV)
    return Dataset(adata, **kwargs)


def halves_by_name(dataset: Dataset, seed: int) -> dict[tuple[str, str], tuple[set, set]]:
    """Cell names of every condition's truth half and duplicate."""
    layout = GroupLayout.build(dataset, seed)
    names = dataset.adata.obs_names[dataset.cell_index]
    result = {}
    for k, condition in enumerate(layout.conditions):
        truth = set(names[layout.positions(k, "truth")])
        duplicate = set(names[layout.positions(k, "duplicate")])
        result[(condition.covariate, condition.perturbation)] = (truth, duplicate)
    return result


@pytest.fixture
def odd_adata(sim_adata):
    """The generated data with one cell less for some perturbations (odd cell counts)."""
    obs = sim_adata.obs
    drop = []
    for label in ["G1", "G1+G9", "G17+G32", "control"]:
        in_line = (obs[COV] == "cell_line_0").to_numpy()
        rows = np.flatnonzero((obs[PERT] == label).to_numpy() & in_line)
        if rows.size:
            drop.append(rows[0])
    keep = np.setdiff1d(np.arange(sim_adata.n_obs), drop)
    return sim_adata[keep].copy()


def test_reproducible(sim_adata):
    first = GroupLayout.build(make_dataset(sim_adata), seed=7)
    second = GroupLayout.build(make_dataset(sim_adata.copy()), seed=7)
    np.testing.assert_array_equal(first.codes, second.codes)
    assert first.conditions == second.conditions
    assert halves_by_name(make_dataset(sim_adata), 7) == halves_by_name(make_dataset(sim_adata), 7)


def test_partition_and_floor_sizes(odd_adata):
    dataset = make_dataset(odd_adata)
    layout = GroupLayout.build(dataset, seed=0)
    labels = dataset.perturbation_labels
    covariates = dataset.covariate_labels
    sizes = set()
    for k, condition in enumerate(layout.conditions):
        members = np.flatnonzero(
            (labels == condition.perturbation) & (covariates == condition.covariate)
        )
        truth = layout.positions(k, "truth")
        duplicate = layout.positions(k, "duplicate")
        assert np.intersect1d(truth, duplicate).size == 0
        np.testing.assert_array_equal(np.union1d(truth, duplicate), members)
        np.testing.assert_array_equal(layout.positions(k, "all"), members)
        assert truth.size == members.size // 2
        assert duplicate.size == members.size - members.size // 2
        sizes.add(members.size % 2)
    assert sizes == {0, 1}  # both even and odd perturbations were checked
    # Controls get their covariate group's code, never a half.
    for c, name in enumerate(layout.covariates):
        controls = np.flatnonzero((labels == dataset.control_label) & (covariates == name))
        np.testing.assert_array_equal(layout.control_positions(c), controls)
    assert np.all(layout.codes >= 0)
    with pytest.raises(ValueError, match="unknown half"):
        layout.positions(0, "both")


@pytest.mark.parametrize("n", range(0, 12))
def test_split_halves_sizes(n):
    positions = np.arange(100, 100 + 3 * n, 3)
    truth, duplicate = split_halves(positions, 0, "c", "p")
    assert truth.size == n // 2 and duplicate.size == n - n // 2
    np.testing.assert_array_equal(np.sort(np.concatenate([truth, duplicate])), positions)
    assert np.all(np.diff(truth) > 0) and np.all(np.diff(duplicate) > 0)


def test_independent_of_other_perturbations(sim_adata):
    full = halves_by_name(make_dataset(sim_adata), seed=3)
    kept_labels = ["control", "G9", "G17+G32", "G48"]
    mask = sim_adata.obs[PERT].isin(kept_labels).to_numpy()
    smaller = halves_by_name(make_dataset(sim_adata[mask].copy()), seed=3)
    via_subset = halves_by_name(make_dataset(sim_adata, subset={PERT: kept_labels}), seed=3)
    assert set(smaller) == {key for key in full if key[1] in kept_labels}
    for key, halves in smaller.items():
        assert halves == full[key]
        assert via_subset[key] == full[key]
    # Only one covariate group present: the other group's halves are unaffected too.
    one_group = sim_adata[(sim_adata.obs[COV] == "cell_line_1").to_numpy()].copy()
    alone = halves_by_name(make_dataset(one_group), seed=3)
    for key, halves in alone.items():
        assert halves == full[key]


def test_left_out_perturbation_cells_have_no_group(sim_adata):
    obs = sim_adata.obs
    g1 = np.flatnonzero((obs[PERT] == "G1").to_numpy() & (obs[COV] == "cell_line_0").to_numpy())
    keep = np.setdiff1d(np.arange(sim_adata.n_obs), g1[3:])  # 3 cells of G1 left in line 0
    adata = sim_adata[keep].copy()
    dataset = make_dataset(adata, min_cells=4)
    layout = GroupLayout.build(dataset, seed=0)
    few = (dataset.perturbation_labels == "G1") & (dataset.covariate_labels == "cell_line_0")
    assert few.sum() == 3
    assert np.all(layout.codes[few] == -1)
    assert np.all(layout.codes[~few] >= 0)
    # The others keep the halves they have with G1 present.
    full = halves_by_name(make_dataset(sim_adata), seed=0)
    for key, halves in halves_by_name(dataset, seed=0).items():
        assert halves == full[key]
    _check_positions_by_group(layout)


def _check_positions_by_group(layout: GroupLayout) -> None:
    """Each group's cells are the cells with its code, ascending, whatever is left out."""
    for k in range(layout.n_conditions):
        for half, codes in (
            ("truth", [2 * k]),
            ("duplicate", [2 * k + 1]),
            ("all", [2 * k, 2 * k + 1]),
        ):
            found = layout.positions(k, half)
            np.testing.assert_array_equal(found, np.flatnonzero(np.isin(layout.codes, codes)))
            found[:] = -5  # a copy: the layout is unchanged
    for c in range(len(layout.covariates)):
        expected = np.flatnonzero(layout.codes == layout.control_group(c))
        np.testing.assert_array_equal(layout.control_positions(c), expected)
    np.testing.assert_array_equal(
        layout.positions(0, "all"), np.flatnonzero(np.isin(layout.codes, [0, 1]))
    )
    with pytest.raises(ValueError, match="unknown half"):
        layout.positions(0, "neither")


def test_different_seeds_differ(sim_adata):
    dataset = make_dataset(sim_adata)
    first = halves_by_name(dataset, seed=0)
    second = halves_by_name(dataset, seed=1)
    assert first.keys() == second.keys()
    differing = [key for key in first if first[key][0] != second[key][0]]
    # 60 cells per perturbation: two seeds agree on a half with probability ~1e-17.
    assert len(differing) == len(first)


def test_same_name_in_two_covariate_groups_splits_differently(sim_adata):
    layout = GroupLayout.build(make_dataset(sim_adata), seed=0)
    # Same perturbation, different covariate group: shuffles are seeded by the group name.
    ranks_0 = _truth_ranks(layout, "cell_line_0", "G9")
    ranks_1 = _truth_ranks(layout, "cell_line_1", "G9")
    assert ranks_0.size == ranks_1.size == 15
    assert not np.array_equal(ranks_0, ranks_1)


def _truth_ranks(layout: GroupLayout, covariate: str, perturbation: str) -> np.ndarray:
    k = layout.index_of(covariate, perturbation)
    return np.searchsorted(layout.positions(k, "all"), layout.positions(k, "truth"))


@pytest.mark.parametrize("chunk_cells", [1, 17, 1000, 10**6])
def test_independent_of_chunk_size(sim_adata, chunk_cells):
    reference = GroupLayout.build(make_dataset(sim_adata), seed=5)
    layout = GroupLayout.build(make_dataset(sim_adata, chunk_cells=chunk_cells), seed=5)
    np.testing.assert_array_equal(layout.codes, reference.codes)


def test_derive_seed_is_stable_and_name_sensitive():
    assert derive_seed(0, "halves", "a", "p") == derive_seed(0, "halves", "a", "p")
    seeds = {
        derive_seed(0, "halves", "a", "p"),
        derive_seed(1, "halves", "a", "p"),
        derive_seed(0, "halves", "b", "p"),
        derive_seed(0, "halves", "a", "q"),
        derive_seed(0, "halves", "ap"),
    }
    assert len(seeds) == 5
    assert all(0 <= s < 2**64 for s in seeds)
