"""Distances between groups: toy values, scipy / scikit-learn on the same input, properties."""

from __future__ import annotations

import math

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import cosine, mahalanobis, pdist
from scipy.stats import ks_2samp, pearsonr, spearmanr, ttest_ind
from sklearn.metrics import pairwise_distances, r2_score
from sklearn.metrics.pairwise import polynomial_kernel, rbf_kernel
from sklearn.neighbors import KernelDensity

from scperteval.distances import DISTANCES, onesided, pairwise, resolve_distance
from scperteval.errors import DatasetError, SpecError


def _cells(seed: int, n: int, d: int, shift: float = 0.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d)) + shift


@pytest.fixture(scope="module")
def clouds() -> tuple[np.ndarray, np.ndarray]:
    return _cells(1, 23, 6), _cells(2, 31, 6, shift=0.4) * 1.3


# ------------------------------------------------------------------- toy values

TOY_X = np.array([[0.0, 0.0], [2.0, 0.0]])
TOY_Y = np.array([[0.0, 4.0], [2.0, 4.0]])
ROOT5 = math.sqrt(5.0)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        # Cross distances 4, 4, sqrt(20), sqrt(20): mean 2 + sqrt(5); within 2 per pair.
        ("edistance", 2 * (2 + ROOT5) - 1 - 1),
        ("energy_distance", 2 * (2 + ROOT5) - 2 - 2),
        ("mean_pairwise", 2 + ROOT5),
        # Means (1, 0) and (1, 4).
        ("euclidean", 4.0),
        ("root_mean_squared_error", 4.0 / math.sqrt(2.0)),
        ("root_mean_squared_error(pertpy=True)", 4.0),
        ("mse", 8.0),
        ("mean_absolute_error", 2.0),
        ("cosine_distance", 1.0 - 1.0 / math.sqrt(17.0)),
        ("mmd(kernel='linear', unbiased=False)", 16.0),
        # Sq. Euclidean V-form: 2 |mx - my|^2.
        ("edistance(cell_wise_metric='sqeuclidean')", 32.0),
    ],
)
def test_toy_values(metric: str, expected: float) -> None:
    assert resolve_distance(metric)(TOY_X, TOY_Y) == pytest.approx(expected, rel=1e-12)


def test_toy_rbf_mmd() -> None:
    # sigma = 1: k = exp(-d^2 / 2); within pairs at d = 2, cross at 4 and sqrt(20).
    within = math.exp(-2.0)
    cross = (2 * math.exp(-8.0) + 2 * math.exp(-10.0)) / 4
    biased = 2 * (2 + 2 * within) / 4 - 2 * cross
    unbiased = 2 * within - 2 * cross
    assert resolve_distance("mmd(bandwidth=1.0, unbiased=False)")(TOY_X, TOY_Y) == pytest.approx(
        biased, rel=1e-12
    )
    assert resolve_distance("mmd(bandwidth=1.0)")(TOY_X, TOY_Y) == pytest.approx(
        unbiased, rel=1e-12
    )


# ------------------------------------------------------- against scipy / scikit-learn


def test_energy_distances_against_sklearn(clouds) -> None:
    x, y = clouds
    n, m = len(x), len(y)
    dxx, dyy, dxy = (pairwise_distances(a, b) for a, b in ((x, x), (y, y), (x, y)))
    pertpy_form = 2 * dxy.mean() - dxx.mean() - dyy.mean()
    unbiased = 2 * dxy.mean() - dxx.sum() / (n * (n - 1)) - dyy.sum() / (m * (m - 1))
    assert resolve_distance("edistance")(x, y) == pytest.approx(pertpy_form, rel=1e-10)
    assert resolve_distance("energy_distance")(x, y) == pytest.approx(unbiased, rel=1e-10)
    assert resolve_distance("mean_pairwise")(x, y) == pytest.approx(dxy.mean(), rel=1e-10)
    sq = [pairwise_distances(a, b, metric="sqeuclidean") for a, b in ((x, x), (y, y), (x, y))]
    sq_form = 2 * sq[2].mean() - sq[0].mean() - sq[1].mean()
    assert resolve_distance("edistance(cell_wise_metric='sqeuclidean')")(x, y) == pytest.approx(
        sq_form, rel=1e-10
    )
    sq_unbiased = 2 * sq[2].mean() - sq[0].sum() / (n * (n - 1)) - sq[1].sum() / (m * (m - 1))
    spec = "energy_distance(cell_wise_metric='sqeuclidean')"
    assert resolve_distance(spec)(x, y) == pytest.approx(sq_unbiased, rel=1e-10)


def _mmd(kxx: np.ndarray, kyy: np.ndarray, kxy: np.ndarray, unbiased: bool) -> float:
    if not unbiased:
        return kxx.mean() + kyy.mean() - 2 * kxy.mean()
    n, m = len(kxx), len(kyy)
    return (
        (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
        + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        - 2 * kxy.mean()
    )


@pytest.mark.parametrize("unbiased", [False, True])
def test_mmd_kernels_against_sklearn(clouds, unbiased: bool) -> None:
    x, y = clouds
    flag = f"unbiased={unbiased}"
    gamma = 0.07
    rbf = [rbf_kernel(a, b, gamma=gamma) for a, b in ((x, x), (y, y), (x, y))]
    assert resolve_distance(f"mmd(gamma={gamma}, {flag})")(x, y) == pytest.approx(
        _mmd(*rbf, unbiased), rel=1e-10
    )
    sigma = 1.0 / math.sqrt(2 * gamma)
    assert resolve_distance(f"mmd(bandwidth={sigma!r}, {flag})")(x, y) == pytest.approx(
        _mmd(*rbf, unbiased), rel=1e-10
    )
    linear = [a @ b.T for a, b in ((x, x), (y, y), (x, y))]
    assert resolve_distance(f"mmd(kernel='linear', {flag})")(x, y) == pytest.approx(
        _mmd(*linear, unbiased), rel=1e-9, abs=1e-12
    )
    poly = [
        polynomial_kernel(a, b, degree=3, gamma=0.5, coef0=1.0) for a, b in ((x, x), (y, y), (x, y))
    ]
    spec = f"mmd(kernel='poly', degree=3, gamma=0.5, coef0=1.0, {flag})"
    assert resolve_distance(spec)(x, y) == pytest.approx(_mmd(*poly, unbiased), rel=1e-9)


def test_mmd_pertpy_defaults_are_linear_biased(clouds) -> None:
    x, y = clouds
    gap = x.mean(axis=0) - y.mean(axis=0)
    assert resolve_distance("mmd(pertpy=True)")(x, y) == pytest.approx(gap @ gap, rel=1e-10)
    rbf = [rbf_kernel(a, b, gamma=1.0) for a, b in ((x, x), (y, y), (x, y))]
    assert resolve_distance("mmd(pertpy=True, kernel='rbf')")(x, y) == pytest.approx(
        _mmd(*rbf, False), rel=1e-10
    )


def test_mmd_median_bandwidths(clouds) -> None:
    x, y = clouds
    pooled = np.vstack([x, y])
    sigma = float(np.median(pdist(pooled)))
    rbf = [rbf_kernel(a, b, gamma=1 / (2 * sigma**2)) for a, b in ((x, x), (y, y), (x, y))]
    expected = _mmd(*rbf, True)
    assert resolve_distance("mmd(bandwidth='pair_median')")(x, y) == pytest.approx(
        expected, rel=1e-10
    )
    # The table-wide rule on two groups is the same median.
    adata = _adata({"a": x, "b": y})
    value = onesided(adata, "g", "a", "mmd", obsm_key="X_pca").loc["b"]
    assert value == pytest.approx(expected, rel=1e-10)


def test_mean_profile_distances_against_scipy(clouds) -> None:
    x, y = clouds
    mx, my = x.mean(axis=0), y.mean(axis=0)
    d = len(mx)
    cases = {
        "euclidean": np.linalg.norm(mx - my),
        "root_mean_squared_error": math.sqrt(np.mean((mx - my) ** 2)),
        "mse": np.mean((mx - my) ** 2),
        "mean_absolute_error": np.mean(np.abs(mx - my)),
        "pearson_distance": 1 - pearsonr(mx, my)[0],
        "spearman_distance": 1 - spearmanr(mx, my)[0],
        "cosine_distance": cosine(mx, my),
        "r2_distance": 1 - r2_score(mx, my),
    }
    # Kendall tau distance: the number of discordant pairs (no ties here).
    discordant = sum(
        (mx[i] - mx[j]) * (my[i] - my[j]) < 0 for i in range(d) for j in range(i + 1, d)
    )
    cases["kendalltau_distance"] = float(discordant)
    for metric, expected in cases.items():
        assert resolve_distance(metric)(x, y) == pytest.approx(expected, rel=1e-10), metric


def test_mahalanobis_against_scipy(clouds) -> None:
    x, y = clouds
    mx, my = x.mean(axis=0), y.mean(axis=0)
    first = mahalanobis(mx, my, np.linalg.inv(np.cov(x.T)))
    assert resolve_distance("mahalanobis(pertpy=True)")(x, y) == pytest.approx(first, rel=1e-10)
    assert resolve_distance("mahalanobis(covariance='first')")(x, y) == pytest.approx(
        first, rel=1e-10
    )
    second = mahalanobis(mx, my, np.linalg.inv(np.cov(y.T)))
    assert resolve_distance("mahalanobis(covariance='second')")(x, y) == pytest.approx(
        second, rel=1e-10
    )
    n, m = len(x), len(y)
    pooled = ((n - 1) * np.cov(x.T) + (m - 1) * np.cov(y.T)) / (n + m - 2)
    expected = mahalanobis(mx, my, np.linalg.inv(pooled))
    assert resolve_distance("mahalanobis")(x, y) == pytest.approx(expected, rel=1e-10)


def test_per_feature_distances_against_scipy(clouds) -> None:
    x, y = clouds
    features = range(x.shape[1])
    welch = np.mean([abs(ttest_ind(x[:, g], y[:, g], equal_var=False)[0]) for g in features])
    assert resolve_distance("t_test(epsilon=0.0)")(x, y) == pytest.approx(welch, rel=1e-10)
    ks = np.mean([ks_2samp(x[:, g], y[:, g]).statistic for g in features])
    assert resolve_distance("ks_test")(x, y) == pytest.approx(ks, rel=1e-12)
    total = 0.0
    for g in features:
        # Closed form of KL(N(m1, s1^2) || N(m2, s2^2)), both ways.
        m1, s1, m2, s2 = x[:, g].mean(), x[:, g].std(), y[:, g].mean(), y[:, g].std()
        total += math.log(s2 / s1) + (s1**2 + (m1 - m2) ** 2) / (2 * s2**2) - 0.5
        total += math.log(s1 / s2) + (s2**2 + (m1 - m2) ** 2) / (2 * s1**2) - 0.5
    expected = total / x.shape[1]
    assert resolve_distance("sym_kldiv(epsilon=0.0)")(x, y) == pytest.approx(expected, rel=1e-10)


def test_mean_var_distribution_against_sklearn_kde() -> None:
    rng = np.random.default_rng(5)
    x = rng.poisson(rng.uniform(0.5, 5.0, size=40), size=(60, 40)).astype(float)
    y = rng.poisson(rng.uniform(0.5, 8.0, size=40), size=(50, 40)).astype(float)

    def points(cells: np.ndarray) -> np.ndarray:
        mean, var = cells.mean(axis=0), cells.var(axis=0)
        keep = (mean > 0) & (var > 0)
        return np.column_stack([np.log(mean[keep]), np.log(var[keep])])

    px, py = points(x), points(y)
    pooled = np.vstack([px, py])

    def grid(values: np.ndarray, n_points: int = 100) -> np.ndarray:
        step = (values.max() - values.min()) / (n_points - 2)
        return np.arange(values.min() - 0.5 * step, values.max() + 0.75 * step, step)[:n_points]

    mesh = np.array(np.meshgrid(grid(pooled[:, 0]), grid(pooled[:, 1]))).T.reshape(-1, 2)
    kde = {
        name: KernelDensity(bandwidth="silverman", kernel="exponential").fit(p)
        for name, p in (("x", px), ("y", py))
    }
    expected = np.mean(
        (np.exp(kde["x"].score_samples(mesh)) - np.exp(kde["y"].score_samples(mesh))) ** 2
    )
    value = resolve_distance("mean_var_distribution")(x, y)
    assert value == pytest.approx(expected, rel=1e-8)


def test_wasserstein_is_debiased_and_exact_for_translations(clouds) -> None:
    x, _ = clouds
    shift = np.array([0.5, -0.2, 0.1, 0.0, 0.3, 0.0])
    distance = resolve_distance("wasserstein")
    assert distance(x, x) == pytest.approx(0.0, abs=1e-7)
    assert distance(x, x + shift) == pytest.approx(np.linalg.norm(shift), rel=1e-6)


# -------------------------------------------------------------------- the API


def _adata(groups: dict[str, np.ndarray], covariate: list[str] | None = None) -> ad.AnnData:
    cells = np.vstack(list(groups.values()))
    labels = np.concatenate([[name] * len(v) for name, v in groups.items()])
    adata = ad.AnnData(cells.copy())
    adata.obs["g"] = pd.Categorical(labels)
    adata.obsm["X_pca"] = cells.copy()
    if covariate is not None:
        adata.obs["line"] = covariate
    return adata


@pytest.fixture(scope="module")
def three_groups() -> ad.AnnData:
    return _adata(
        {"ctrl": _cells(3, 25, 5), "p1": _cells(4, 18, 5, 0.8), "p2": _cells(5, 21, 5, -0.3)}
    )


@pytest.mark.parametrize("metric", ["edistance", "mmd", "euclidean", "t_test", "r2_distance"])
def test_pairwise_matches_each_pair(three_groups, metric: str) -> None:
    table = pairwise(three_groups, "g", metric)
    assert list(table.index) == ["ctrl", "p1", "p2"] and list(table.columns) == list(table.index)
    cells = {g: three_groups.obsm["X_pca"][three_groups.obs["g"] == g] for g in table.index}
    distance = resolve_distance(metric)
    for a in table.index:
        for b in table.columns:
            if a == b:
                assert table.loc[a, b] == 0.0
            elif metric == "mmd":
                continue  # its bandwidth is the table's, checked below
            else:
                assert table.loc[a, b] == pytest.approx(distance(cells[a], cells[b]), rel=1e-10)
    if distance.symmetric:
        np.testing.assert_allclose(table.to_numpy(), table.to_numpy().T, rtol=0, atol=0)
    else:
        assert table.loc["p1", "p2"] != pytest.approx(table.loc["p2", "p1"])


def test_pairwise_mmd_uses_one_bandwidth_for_the_table(three_groups) -> None:
    pooled = three_groups.obsm["X_pca"]
    sigma = float(np.median(pdist(pooled)))
    table = pairwise(three_groups, "g", "mmd")
    fixed = pairwise(three_groups, "g", f"mmd(bandwidth={sigma!r})")
    np.testing.assert_allclose(table.to_numpy(), fixed.to_numpy(), rtol=1e-10)


def test_onesided_is_a_column_of_pairwise(three_groups) -> None:
    table = pairwise(three_groups, "g", "r2_distance")
    series = onesided(three_groups, "g", "ctrl", "r2_distance")
    # d(group, reference): the group is the first argument, as in pertpy.
    np.testing.assert_allclose(series.to_numpy(), table["ctrl"].to_numpy(), rtol=1e-12)
    assert series.loc["ctrl"] == 0.0
    only = onesided(three_groups, "g", "ctrl", "edistance", groups=["p2"])
    assert list(only.index) == ["p2"]


def test_covariates_are_compared_within_each_value() -> None:
    groups = {
        "ctrl": _cells(6, 20, 4),
        "p1": _cells(7, 20, 4, 1.0),
    }
    adata = _adata(groups, covariate=(["A"] * 10 + ["B"] * 10) * 2)
    both = onesided(adata, "g", "ctrl", "energy_distance", covariate_key="line")
    assert list(both.index) == [("A", "ctrl"), ("A", "p1"), ("B", "ctrl"), ("B", "p1")]
    for line in ("A", "B"):
        alone = onesided(adata[adata.obs["line"] == line].copy(), "g", "ctrl", "energy_distance")
        assert both.loc[(line, "p1")] == pytest.approx(alone.loc["p1"], rel=1e-12)
    table = pairwise(adata, "g", "euclidean", covariate_key="line")
    in_b = adata[adata.obs["line"] == "B"].obsm["X_pca"]
    b_labels = adata[adata.obs["line"] == "B"].obs["g"].to_numpy()
    gap = in_b[b_labels == "p1"].mean(axis=0) - in_b[b_labels == "ctrl"].mean(axis=0)
    assert table.loc[("B", "p1"), "ctrl"] == pytest.approx(np.linalg.norm(gap), rel=1e-12)


def test_feature_spaces() -> None:
    rng = np.random.default_rng(9)
    genes = rng.normal(size=(60, 8)) * np.linspace(0.2, 3.0, 8)
    labels = np.repeat(["a", "b", "c"], 20)
    genes[labels == "b"] += 0.7
    adata = ad.AnnData(genes.copy())
    adata.obs["g"] = pd.Categorical(labels)
    adata.layers["twice"] = 2 * genes
    full = onesided(adata, "g", "a", "edistance", space="full")
    # All principal components are a rotation: Euclidean distances are unchanged.
    rotated = onesided(adata, "g", "a", "edistance", space="pca(k=8)")
    np.testing.assert_allclose(rotated.to_numpy(), full.to_numpy(), rtol=1e-10)
    # Without X_pca the default is pca(k=50), all 8 components here.
    np.testing.assert_allclose(onesided(adata, "g", "a").to_numpy(), full.to_numpy(), rtol=1e-10)
    doubled = onesided(adata, "g", "a", "edistance", layer="twice")
    np.testing.assert_allclose(doubled.to_numpy(), 2 * full.to_numpy(), rtol=1e-12)
    top = np.argsort(-genes.var(axis=0))[:3]
    manual = ad.AnnData(genes[:, np.sort(top)].copy())
    manual.obs["g"] = adata.obs["g"].to_numpy()
    hvg = onesided(adata, "g", "a", "euclidean", space="hvg(k=3)")
    np.testing.assert_allclose(
        hvg.to_numpy(), onesided(manual, "g", "a", "euclidean", space="full").to_numpy()
    )
    subset = onesided(adata, "g", "a", "euclidean", space="full", subset={"g": ["a", "b"]})
    assert list(subset.index) == ["a", "b"]


def test_every_distance_is_registered_under_pertpys_names() -> None:
    pertpy_names = {
        "edistance",
        "euclidean",
        "root_mean_squared_error",
        "mse",
        "mean_absolute_error",
        "pearson_distance",
        "spearman_distance",
        "kendalltau_distance",
        "cosine_distance",
        "r2_distance",
        "mean_pairwise",
        "mmd",
        "wasserstein",
        "sym_kldiv",
        "t_test",
        "ks_test",
        "mean_var_distribution",
        "mahalanobis",
    }
    assert pertpy_names <= set(DISTANCES.names())


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda a: pairwise(a, "g", "edistanse"), SpecError, "did you mean 'edistance'"),
        (lambda a: pairwise(a, "g", "mmd(kernal='rbf')"), SpecError, "kernal"),
        (lambda a: pairwise(a, "g", "mmd(kernel='cubic')"), SpecError, "kernel must be"),
        (lambda a: pairwise(a, "g", "mmd(bandwidth=-1.0)"), SpecError, "bandwidth"),
        (lambda a: pairwise(a, "nope"), DatasetError, "groupby column 'nope'"),
        (lambda a: onesided(a, "g", "control"), DatasetError, "reference group 'control'"),
        (
            lambda a: pairwise(a, "g", groups=["p9"]),
            DatasetError,
            r"group\(s\) 'p9' have no cell in column 'g'",
        ),
        (lambda a: pairwise(a, "g", obsm_key="X_umap"), DatasetError, "X_umap"),
        (lambda a: pairwise(a, "g", obsm_key="X_pca", space="pca"), SpecError, "not both"),
        (lambda a: pairwise(a, "g", space="tsne"), SpecError, "unknown space"),
        (lambda a: pairwise(a, "g", space="pca(k=0)"), SpecError, "at least 1"),
        (lambda a: pairwise(a, "g", layer="counts"), DatasetError, "layer 'counts'"),
        (lambda a: pairwise(a, "g", subset={"g": "zzz"}), DatasetError, "no cell matches"),
    ],
)
def test_bad_arguments_raise_package_errors(three_groups, call, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        call(three_groups)


def test_too_few_cells_and_non_finite_values() -> None:
    adata = _adata({"a": _cells(1, 5, 3), "b": _cells(2, 1, 3)})
    with pytest.raises(DatasetError, match="needs at least 2"):
        onesided(adata, "g", "a", "energy_distance")
    assert onesided(adata, "g", "a", "edistance").loc["b"] > 0  # V-form: one cell suffices
    adata.obsm["X_pca"][0, 0] = np.nan
    with pytest.raises(DatasetError, match="NaN"):
        onesided(adata, "g", "a", "euclidean")
