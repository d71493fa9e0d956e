"""Permutation tests: a slow loop with the same seed, p-value bounds, the corrected family."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from scperteval.data.halves import derive_seed
from scperteval.distances import (
    bootstrap,
    bootstrap_draws,
    permutation_test,
    resolve_distance,
)
from scperteval.errors import DatasetError, SpecError

N_PERMUTATIONS = 150


@pytest.fixture(scope="module")
def screen() -> ad.AnnData:
    rng = np.random.default_rng(11)
    sizes = {"ctrl": 24, "strong": 15, "weak": 30, "none": 12}
    shifts = {"ctrl": 0.0, "strong": 2.0, "weak": 0.35, "none": 0.0}
    cells = np.vstack([rng.normal(size=(n, 4)) + shifts[g] for g, n in sizes.items()])
    adata = ad.AnnData(cells)
    adata.obs["g"] = pd.Categorical(np.concatenate([[g] * n for g, n in sizes.items()]))
    adata.obsm["X_pca"] = cells
    return adata


def _slow_pvalues(adata: ad.AnnData, metric: str, seed: int) -> dict[str, float]:
    """Textbook loop: relabel the pooled cells, recompute the distance each time."""
    distance = resolve_distance(metric)
    cells, labels = adata.obsm["X_pca"], adata.obs["g"].to_numpy()
    reference = cells[labels == "ctrl"]
    out = {}
    for group in ("strong", "weak", "none"):
        x = cells[labels == group]
        pooled = np.vstack([x, reference])
        observed = distance(x, reference)
        rng = np.random.default_rng(derive_seed(seed, "all", group))
        exceed = 0
        for _ in range(N_PERMUTATIONS):
            order = rng.permutation(len(pooled))
            if distance(pooled[order[: len(x)]], pooled[order[len(x) :]]) >= observed:
                exceed += 1
        out[group] = (exceed + 1) / (N_PERMUTATIONS + 1)
    return out


@pytest.mark.parametrize(
    "metric",
    [
        "edistance",
        "energy_distance",
        "mmd(bandwidth=1.2)",
        "mmd(bandwidth='pair_median')",
        "mmd(kernel='poly', coef0=1.0)",
        "mmd(kernel='linear')",
        "euclidean",
        "t_test",
    ],
)
def test_pvalues_equal_a_slow_loop_with_the_same_seed(screen, metric: str) -> None:
    expected = _slow_pvalues(screen, metric, seed=7)
    for max_bytes in (1 << 26, 1):  # the stored pooled matrix, and tiles without it
        table = permutation_test(
            screen,
            "g",
            "ctrl",
            metric,
            n_permutations=N_PERMUTATIONS,
            seed=7,
            max_matrix_bytes=max_bytes,
        )
        assert list(table.index) == ["strong", "weak", "none"]
        for group, pvalue in expected.items():
            assert table.loc[group, "pvalue"] == pytest.approx(pvalue, abs=1e-15), (
                group,
                max_bytes,
            )


def test_pvalue_bounds_and_table(screen) -> None:
    table = permutation_test(screen, "g", "ctrl", n_permutations=99, seed=0, correction="none")
    assert "ctrl" not in table.index
    # No relabelling comes near a shift of two standard deviations: the smallest p.
    assert table.loc["strong", "pvalue"] == pytest.approx(1 / 100)
    assert (table["pvalue"] >= 1 / 100).all() and (table["pvalue"] <= 1).all()
    assert table.loc["strong", "significant"]
    np.testing.assert_array_equal(table["pvalue_adj"], table["pvalue"])
    assert table["n_cells"].tolist() == [15, 30, 12] and set(table["n_reference"]) == {24}
    distance = resolve_distance("edistance")
    cells, labels = screen.obsm["X_pca"], screen.obs["g"].to_numpy()
    expected = distance(cells[labels == "weak"], cells[labels == "ctrl"])
    assert table.loc["weak", "distance"] == pytest.approx(expected, rel=1e-12)


def test_seeded_and_independent_of_the_other_groups(screen) -> None:
    first = permutation_test(screen, "g", "ctrl", n_permutations=60, seed=3)
    again = permutation_test(screen, "g", "ctrl", n_permutations=60, seed=3, n_jobs=1)
    pd.testing.assert_frame_equal(first, again)
    alone = permutation_test(screen, "g", "ctrl", n_permutations=60, seed=3, groups=["weak"])
    assert alone.loc["weak", "pvalue"] == first.loc["weak", "pvalue"]
    other = permutation_test(screen, "g", "ctrl", n_permutations=60, seed=4)
    assert not np.array_equal(other["pvalue"], first["pvalue"])


def test_reference_is_not_in_the_family(screen) -> None:
    table = permutation_test(
        screen, "g", "ctrl", n_permutations=40, seed=1, correction="bonferroni"
    )
    np.testing.assert_allclose(table["pvalue_adj"], np.minimum(3 * table["pvalue"], 1.0))


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"n_permutations": 0}, SpecError, "n_permutations"),
        ({"correction": "sidak"}, SpecError, "unknown correction"),
        ({"alpha": 1.5}, SpecError, "alpha"),
        ({"reference": "nope"}, DatasetError, "reference group 'nope'"),
    ],
)
def test_bad_options(screen, options, error, pattern) -> None:
    arguments = {"reference": "ctrl", **options}
    with pytest.raises(error, match=pattern):
        permutation_test(screen, "g", **arguments)


# ------------------------------------------------------------------ bootstrap


@pytest.mark.parametrize(
    "metric", ["edistance", "energy_distance", "mmd(bandwidth=1.1)", "mmd(kernel='poly')", "mse"]
)
def test_bootstrap_equals_a_slow_loop_with_the_same_draws(screen, metric: str) -> None:
    table = bootstrap(screen, "g", "ctrl", metric, n_bootstrap=40, seed=2, confidence=0.9)
    slow = bootstrap(
        screen, "g", "ctrl", metric, n_bootstrap=40, seed=2, confidence=0.9, max_matrix_bytes=1
    )
    distance = resolve_distance(metric)
    cells, labels = screen.obsm["X_pca"], screen.obs["g"].to_numpy()
    reference = cells[labels == "ctrl"]
    ref_draws = bootstrap_draws(2, "all", "ctrl", len(reference), 40)
    for group in ("strong", "weak", "none"):
        x = cells[labels == group]
        draws = bootstrap_draws(2, "all", group, len(x), 40)
        pairs = zip(draws, ref_draws, strict=True)
        values = np.array([distance(x[d], reference[r]) for d, r in pairs])
        for frame in (table, slow):
            assert frame.loc[group, "mean"] == pytest.approx(values.mean(), rel=1e-9)
            assert frame.loc[group, "std"] == pytest.approx(values.std(ddof=1), rel=1e-7)
            assert frame.loc[group, "low"] == pytest.approx(np.quantile(values, 0.05), rel=1e-9)
            assert frame.loc[group, "high"] == pytest.approx(np.quantile(values, 0.95), rel=1e-9)
        assert table.loc[group, "distance"] == pytest.approx(distance(x, reference), rel=1e-12)


def test_bootstrap_draws_keep_group_sizes() -> None:
    draws = bootstrap_draws(0, "all", "g", 17, 5)
    assert draws.shape == (5, 17) and draws.min() >= 0 and draws.max() < 17
    with pytest.raises(SpecError, match="n_bootstrap"):
        bootstrap(ad.AnnData(np.zeros((2, 1))), "g", "a", n_bootstrap=1)
