"""Differential expression against exact two-pass statistics, scanpy and scipy."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy import stats

from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.errors import SpecError
from scperteval.metrics.weights import deg_weights_from_statistic as deg_weights
from scperteval.stats.diffexp import (
    DE_COLUMNS,
    PARALLEL_PVALUES,
    DEResult,
    welch_t_test,
)

T_TESTS = ("t-test", "t-test_overestim_var")
REFERENCES = ("rest", "control")
EXACT = {"rtol": 1e-9, "atol": 1e-12}
SCANPY = {"rtol": 1e-6, "atol": 1e-12}
# Real-data acceptance runs with a min_cells that leaves out one perturbation
# (A172 PLK4, 46 cells), so that "rest" must exclude its cells.
DEVEL_MIN_CELLS = 50


# ---------------------------------------------------------------- references
def dense(matrix) -> np.ndarray:
    if sp.issparse(matrix):
        matrix = matrix.toarray()
    return np.asarray(matrix, dtype=np.float64)


def exact_welch(target: np.ndarray, reference: np.ndarray, overestimate: bool):
    """Two-pass Welch t-test per column with scipy, with scanpy's zero-variance rule."""
    mean_t, mean_r = target.mean(axis=0), reference.mean(axis=0)
    var_t, var_r = target.var(axis=0, ddof=1), reference.var(axis=0, ddof=1)
    n_t = target.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        if overestimate:
            t, p = stats.ttest_ind_from_stats(
                mean_t, np.sqrt(var_t), n_t, mean_r, np.sqrt(var_r), n_t, equal_var=False
            )
        else:
            t, p = stats.ttest_ind(target, reference, axis=0, equal_var=False)
    t, p = np.asarray(t, dtype=float), np.asarray(p, dtype=float)
    # scanpy's rule for 0/0 (zero variance, equal means); scipy already gives
    # t = +-inf, p = 0 for zero variance with different means.
    return np.where(np.isnan(t), 0.0, t), np.where(np.isnan(p), 1.0, p)


def scanpy_log_fold_change(mean_target: np.ndarray, mean_reference: np.ndarray) -> np.ndarray:
    """scanpy's logfoldchanges for log1p data."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.log2((np.expm1(mean_target) + 1e-9) / (np.expm1(mean_reference) + 1e-9))


def bh_by_hand(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg step-up adjustment of one vector."""
    n = p.size
    order = np.argsort(p)
    scaled = p[order] * n / np.arange(1, n + 1)
    adjusted = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty(n)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def cell_sets(context: Context, k: int, reference: str, half: str):
    """Rows (into the AnnData) of condition k's target and reference cells, from labels."""
    dataset = context.dataset
    condition = context.layout.conditions[k]
    labels = dataset.perturbation_labels
    covariates = dataset.covariate_labels
    in_group = covariates == condition.covariate
    if half == "all":
        target = dataset.cell_index[np.flatnonzero(in_group & (labels == condition.perturbation))]
    else:  # the seeded half, as the layout defines it
        target = dataset.cell_index[context.layout.positions(k, half)]
    if reference == "control":
        ref = in_group & (labels == dataset.control_label)
    else:
        counts = (
            pd.Series(1, index=pd.MultiIndex.from_arrays([covariates, labels]))
            .groupby(level=[0, 1])
            .sum()
        )
        kept = counts[counts >= dataset.min_cells].index
        evaluated = pd.MultiIndex.from_arrays([covariates, labels]).isin(kept)
        ref = in_group & (labels != dataset.control_label) & (labels != condition.perturbation)
        ref &= evaluated
    return target, dataset.cell_index[np.flatnonzero(ref)]


def check_against_two_pass(
    context: Context, values: np.ndarray, method: str, reference: str, half: str
) -> None:
    result = context.de(method=method, reference=reference, half=half)
    assert result.statistic.shape == (len(context.layout.conditions), values.shape[1])
    for k in range(len(result.conditions)):
        target_rows, reference_rows = cell_sets(context, k, reference, half)
        target, ref = values[target_rows], values[reference_rows]
        t, p = exact_welch(target, ref, method == "t-test_overestim_var")
        np.testing.assert_allclose(result.statistic[k], t, **EXACT)
        np.testing.assert_allclose(result.pvalue[k], p, **EXACT)
        means = {"rtol": 1e-12, "atol": 1e-14}
        np.testing.assert_allclose(result.mean_target[k], target.mean(axis=0), **means)
        np.testing.assert_allclose(result.mean_reference[k], ref.mean(axis=0), **means)
        lfc = scanpy_log_fold_change(target.mean(axis=0), ref.mean(axis=0))
        np.testing.assert_allclose(result.log_fold_change[k], lfc, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(result.pvalue_adj[k], bh_by_hand(p), **EXACT)


# ------------------------------------------------------------ real data (devel)
@pytest.fixture(scope="module")
def devel(_devel_adata):
    adata = _devel_adata.copy()
    dataset = Dataset(
        adata, perturbation_key="condition", covariate_key="cell_type", min_cells=DEVEL_MIN_CELLS
    )
    return Context(dataset), dense(adata.X)


def test_devel_dataset_layout(devel):
    context, _ = devel
    dataset = context.dataset
    assert dataset.covariates == ["A172", "T98G", "U87MG", "k562"]
    assert [(c.covariate, c.perturbation, n) for c, n in dataset.dropped] == [("A172", "PLK4", 46)]
    assert len(dataset.conditions) == 59


@pytest.mark.slow
@pytest.mark.parametrize("reference", REFERENCES)
@pytest.mark.parametrize("method", T_TESTS)
def test_devel_t_tests_equal_two_pass(devel, method, reference):
    context, values = devel
    check_against_two_pass(context, values, method, reference, "all")


@pytest.fixture
def one_numba_thread():
    """scanpy's sparse kernels crawl when their threads compete with other processes."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


def scanpy_tables(adata, method: str, reference: str) -> dict[str, pd.DataFrame]:
    """Per group: scanpy's scores, pvals, pvals_adj and logfoldchanges indexed by gene."""
    import scanpy as sc

    adata.obs["condition"] = adata.obs["condition"].astype(str).astype("category")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pd.errors.PerformanceWarning)
        sc.tl.rank_genes_groups(
            adata,
            "condition",
            groups="all",
            reference=reference,
            method=method,
            n_genes=adata.n_vars,
        )
    table = sc.get.rank_genes_groups_df(adata, group=None)
    return {
        str(group): frame.set_index("names")
        for group, frame in table.groupby("group", observed=True)
    }


@pytest.mark.slow
@pytest.mark.parametrize("reference", REFERENCES)
@pytest.mark.parametrize("method", T_TESTS)
def test_devel_t_tests_equal_scanpy(devel, _devel_adata, method, reference, one_numba_thread):
    context, _ = devel
    dataset = context.dataset
    result = context.de(method=method, reference=reference)
    obs = _devel_adata.obs
    labels = obs["condition"].astype(str).to_numpy()
    covariates = obs["cell_type"].astype(str).to_numpy()
    dropped = {(c.covariate, c.perturbation) for c, _ in dataset.dropped}
    left_out = np.array([(c, p) in dropped for c, p in zip(covariates, labels, strict=True)])
    compared = 0
    for covariate in dataset.covariates:
        in_group = (covariates == covariate) & ~left_out
        if reference == "rest":
            in_group &= labels != "control"  # scanpy's rest: every other cell passed
        adata = _devel_adata[in_group].copy()
        tables = scanpy_tables(adata, method, reference)
        for k, condition in enumerate(result.conditions):
            if condition.covariate != covariate:
                continue
            table = tables[condition.perturbation].loc[result.genes]
            np.testing.assert_allclose(result.statistic[k], table["scores"], **SCANPY)
            np.testing.assert_allclose(result.pvalue[k], table["pvals"], **SCANPY)
            np.testing.assert_allclose(result.pvalue_adj[k], table["pvals_adj"], **SCANPY)
            np.testing.assert_allclose(
                result.log_fold_change[k], table["logfoldchanges"], rtol=1e-6, atol=1e-6
            )
            compared += 1
    assert compared == len(result.conditions) == 59


# ----------------------------------------------------------- generated data
@pytest.fixture(scope="module")
def generated(_sim_adata):
    adata = _sim_adata.copy()
    dataset = Dataset(adata, perturbation_key="perturbation", covariate_key="cell_line")
    assert len(dataset.combinations()) == 4  # 2 combinations x 2 cell lines
    return Context(dataset, seed=11), dense(adata.X)


@pytest.mark.parametrize("half", ["all", "truth", "duplicate"])
@pytest.mark.parametrize("reference", REFERENCES)
@pytest.mark.parametrize("method", T_TESTS)
def test_generated_t_tests_equal_two_pass(generated, method, reference, half):
    context, values = generated
    check_against_two_pass(context, values, method, reference, half)


@pytest.mark.filterwarnings("ignore:overflow encountered in expm1:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log2:RuntimeWarning")
def test_rest_reference_under_cancellation():
    """A gene at 9 +- 1e-5 in every cell but one perturbation's, where it is 0."""
    import anndata as ad

    rng = np.random.default_rng(0)
    labels = np.repeat(["control", "A", "B", "C"], [40, 30, 35, 25])
    values = np.column_stack(
        [
            9.0 + rng.normal(0.0, 1e-5, labels.size),
            rng.gamma(2.0, 1.0, labels.size),
        ]
    )
    values[labels == "C", 0] = 0.0
    order = rng.permutation(labels.size)
    adata = ad.AnnData(
        X=sp.csr_matrix(values[order]),
        obs=pd.DataFrame({"perturbation": labels[order]}, index=[f"c{i}" for i in order]),
        var=pd.DataFrame(index=["big", "ordinary"]),
    )
    context = Context(Dataset(adata, chunk_cells=16))
    x = values[order]
    check_against_two_pass(context, x, "t-test", "rest", "all")
    check_against_two_pass(context, x, "t-test_overestim_var", "rest", "all")
    k = context.layout.index_of("all", "C")
    rest = x[np.isin(labels[order], ["A", "B"])]
    variance = context.rest_stats().variance()[k]
    np.testing.assert_allclose(variance, rest.var(axis=0, ddof=1), rtol=1e-9)


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")
def test_zero_variance_rule_matches_scanpy():
    import anndata as ad

    labels = np.repeat(["control", "A", "B"], [4, 5, 6])
    values = np.zeros((labels.size, 4))
    values[:, 1] = np.where(labels == "A", 2.0, 1.0)  # constant within groups, means differ
    values[:, 2] = np.linspace(0.5, 2.0, labels.size)  # ordinary
    values[:, 3] = 3.0  # constant everywhere
    adata = ad.AnnData(
        X=values,
        obs=pd.DataFrame({"perturbation": labels}, index=[f"c{i}" for i in range(15)]),
        var=pd.DataFrame(index=["zero", "step", "ramp", "flat"]),
    )
    adata.uns["log1p"] = {"base": None}
    result = Context(Dataset(adata)).de(reference="rest")
    a = result.row("all", "A")
    np.testing.assert_array_equal(result.statistic[a, [0, 1, 3]], [0.0, np.inf, 0.0])
    np.testing.assert_array_equal(result.pvalue[a, [0, 1, 3]], [1.0, 0.0, 1.0])
    step = values[:, 1]
    scipy_step = stats.ttest_ind(step[labels == "A"], step[labels == "B"], equal_var=False)
    assert (scipy_step.statistic, scipy_step.pvalue) == (np.inf, 0.0)
    perturbed = adata[labels != "control"].copy()
    perturbed.obs["condition"] = perturbed.obs["perturbation"]
    table = scanpy_tables(perturbed, "t-test", "rest")["A"].loc[result.genes]
    np.testing.assert_allclose(result.statistic[a], table["scores"], rtol=1e-6)
    np.testing.assert_allclose(result.pvalue[a], table["pvals"], rtol=1e-6)


def test_welch_from_moments_toy():
    # Two groups of 3: [1, 2, 3] and [0, 1, 2] -> t = 1 / sqrt(2/3), df = 4.
    t, p = welch_t_test(
        np.array(3.0), np.array(2.0), np.array(1.0), np.array(3.0), np.array(1.0), np.array(1.0)
    )
    expected = stats.ttest_ind([1.0, 2.0, 3.0], [0.0, 1.0, 2.0], equal_var=False)
    assert t == pytest.approx(1.0 / np.sqrt(2.0 / 3.0), rel=1e-14)
    assert t == pytest.approx(expected.statistic, rel=1e-14)
    assert p == pytest.approx(expected.pvalue, rel=1e-12)
    assert p == pytest.approx(2 * stats.t.sf(t, 4), rel=1e-12)


# -------------------------------------------------------------- BH and frames
def test_bh_adjustment_per_row(generated):
    context, _ = generated
    result = context.de(method="t-test", reference="control")
    for k in range(result.pvalue.shape[0]):
        np.testing.assert_allclose(
            result.pvalue_adj[k], stats.false_discovery_control(result.pvalue[k]), rtol=1e-12
        )
        np.testing.assert_allclose(result.pvalue_adj[k], bh_by_hand(result.pvalue[k]), rtol=1e-12)
    try:
        from statsmodels.stats.multitest import multipletests
    except ImportError:
        return
    for k in range(result.pvalue.shape[0]):
        expected = multipletests(result.pvalue[k], method="fdr_bh")[1]
        np.testing.assert_allclose(result.pvalue_adj[k], expected, rtol=1e-12)


def test_to_frame_columns_and_rows(generated):
    context, _ = generated
    result = context.de(reference="rest", half="truth")
    frame = result.to_frame()
    expected_columns = [
        "covariate",
        "perturbation",
        "gene",
        "statistic",
        "pvalue",
        "pvalue_adj",
        "log_fold_change",
        "mean_target",
        "mean_reference",
    ]
    assert list(frame.columns) == expected_columns == list(DE_COLUMNS)
    n_conditions, n_genes = result.statistic.shape
    assert len(frame) == n_conditions * n_genes
    k = result.row("cell_line_1", "G17+G32")
    rows = frame[(frame["covariate"] == "cell_line_1") & (frame["perturbation"] == "G17+G32")]
    assert rows["gene"].astype(str).tolist() == list(result.genes)
    np.testing.assert_array_equal(rows["statistic"].to_numpy(), result.statistic[k])
    np.testing.assert_array_equal(rows["pvalue_adj"].to_numpy(), result.pvalue_adj[k])
    np.testing.assert_array_equal(rows["mean_reference"].to_numpy(), result.mean_reference[k])
    one = result.for_condition("cell_line_1", "G17+G32", genes=["G5", "G0"])
    assert one.index.tolist() == ["G5", "G0"]
    assert one.loc["G5", "statistic"] == result.statistic[k, list(result.genes).index("G5")]
    with pytest.raises(KeyError, match="nope"):
        result.for_condition("cell_line_1", "G17+G32", genes=["nope"])
    with pytest.raises(KeyError, match="G999"):
        result.row("cell_line_1", "G999")
    assert isinstance(result, DEResult) and result.half == "truth" and result.reference == "rest"


def test_invalid_choices_raise(generated):
    context, _ = generated
    with pytest.raises(SpecError, match="unknown DE method 'anova'; valid names: t-test"):
        context.de(method="anova")
    with pytest.raises(SpecError, match="unknown reference 'others'; valid: rest, control"):
        context.de(reference="others")
    with pytest.raises(SpecError, match="unknown half 'first'"):
        context.de(half="first")


# ------------------------------------------------------------------ wilcoxon
def exact_mann_whitney(target: np.ndarray, reference: np.ndarray):
    """scipy's asymptotic Mann-Whitney p and the tie-corrected z of its U statistic."""
    n1, n2 = target.shape[0], reference.shape[0]
    result = stats.mannwhitneyu(
        target, reference, method="asymptotic", use_continuity=False, axis=0
    )
    pooled = np.concatenate([target, reference])
    correction = np.array([stats.tiecorrect(stats.rankdata(col)) for col in pooled.T])
    with np.errstate(divide="ignore", invalid="ignore"):
        sigma = np.sqrt(n1 * n2 * (n1 + n2 + 1) / 12.0 * correction)
        z = (result.statistic - n1 * n2 / 2.0) / sigma
    constant = correction == 0
    return np.where(constant, 0.0, z), np.where(constant, 1.0, result.pvalue)


@pytest.mark.parametrize(
    ("reference", "half"), [("rest", "all"), ("control", "all"), ("rest", "truth")]
)
def test_wilcoxon_equals_scipy(generated, reference, half):
    context, values = generated
    result = context.de(method="wilcoxon", reference=reference, half=half)
    for k in range(len(result.conditions)):
        target_rows, reference_rows = cell_sets(context, k, reference, half)
        z, p = exact_mann_whitney(values[target_rows], values[reference_rows])
        np.testing.assert_allclose(result.statistic[k], z, **EXACT)
        np.testing.assert_allclose(result.pvalue[k], p, **EXACT)
        np.testing.assert_allclose(result.pvalue_adj[k], bh_by_hand(p), **EXACT)


# --------------------------------------------------------------- DEG weights
def test_deg_weights_toy():
    raw = np.array([1.0, 0.25, 0.015625, 0.00390625, 0.0])
    weights = deg_weights([-8.0, 4.0, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(weights, raw / raw.sum(), rtol=1e-15)
    assert weights.sum() == pytest.approx(1.0, rel=1e-15)
    # Exponent 1: min-max normalised |t| directly.
    np.testing.assert_allclose(
        deg_weights([-8.0, 4.0, 1.0, 0.5, 0.0], exponent=1.0),
        np.array([1.0, 0.5, 0.125, 0.0625, 0.0]) / 1.6875,
    )
    # Non-finite statistics get weight 0 and take no part in the min-max.
    np.testing.assert_allclose(deg_weights([np.inf, np.nan, 2.0, 1.0]), [0.0, 0.0, 1.0, 0.0])
    np.testing.assert_allclose(deg_weights([0.0, 0.0, 0.0, 3.0]), [0.0, 0.0, 0.0, 1.0])
    # No informative gene: all-zero weights, on which the weighted metrics are NaN.
    assert np.all(deg_weights([2.0, -2.0, 2.0]) == 0.0)


def test_context_deg_weights_follow_gene_names(_sim_adata):
    adata = _sim_adata.copy()
    rng = np.random.default_rng(0)
    shuffled = adata[:, rng.permutation(adata.n_vars)].copy()
    first = Context(Dataset(adata, covariate_key="cell_line"), seed=2)
    second = Context(Dataset(shuffled, covariate_key="cell_line"), seed=2)
    assert list(first.genes) != list(second.genes)
    a = pd.DataFrame(first.deg_weights(), columns=first.genes)
    b = pd.DataFrame(second.deg_weights(), columns=second.genes)[a.columns]
    np.testing.assert_allclose(b.to_numpy(), a.to_numpy(), rtol=1e-12, atol=1e-15)
    mask_a = pd.DataFrame(first.deg_mask(), columns=first.genes)
    mask_b = pd.DataFrame(second.deg_mask(), columns=second.genes)[a.columns]
    np.testing.assert_array_equal(mask_a.to_numpy(), mask_b.to_numpy())

    # Independently: |t| of the truth half vs rest from scipy, min-max, squared, sum 1.
    values = dense(shuffled.X)
    for k in range(len(second.layout.conditions)):
        target_rows, reference_rows = cell_sets(second, k, "rest", "truth")
        t, p = exact_welch(values[target_rows], values[reference_rows], False)
        magnitude = np.abs(t)
        raw = ((magnitude - magnitude.min()) / (magnitude.max() - magnitude.min())) ** 2
        np.testing.assert_allclose(second.deg_weights()[k], raw / raw.sum(), rtol=1e-9, atol=1e-15)
        np.testing.assert_array_equal(second.deg_mask()[k], bh_by_hand(p) < 0.05)
    assert second.deg_mask().any()


def test_pvalues_in_row_blocks_equal_one_call():
    from scipy import special

    from scperteval.kernels.threads import Threads
    from scperteval.stats.diffexp import two_sided_t_pvalues

    rng = np.random.default_rng(4)
    shape = (7, PARALLEL_PVALUES // 5)  # above the threshold: computed in two blocks
    statistic = rng.normal(scale=4.0, size=shape)
    dof = rng.uniform(1.5, 300.0, size=shape)
    statistic[0, :3] = [np.nan, np.inf, 0.0]
    got = two_sided_t_pvalues(dof, statistic, Threads(2))
    np.testing.assert_array_equal(two_sided_t_pvalues(dof, statistic, Threads(1)), got)
    np.testing.assert_allclose(got, 2.0 * special.stdtr(dof, -np.abs(statistic)), rtol=1e-12)
    small = two_sided_t_pvalues(dof[:, :10], statistic[:, :10])
    np.testing.assert_array_equal(small, got[:, :10])
    assert np.isnan(got[0, 0]) and got[0, 1] == 0.0 and got[0, 2] == 1.0


@pytest.mark.parametrize("overestimate", [False, True])
def test_welch_statistic_between_equals_welch_between(overestimate):
    from scperteval.stats.diffexp import welch_between, welch_statistic_between
    from scperteval.stats.groups import GroupStats

    rng = np.random.default_rng(4)
    values = rng.poisson(0.7, size=(60, 9)).astype(float)
    values[:, 0] = 0.0  # zero variance in both groups: t = 0 by rule
    target = GroupStats.from_chunk(values[:20], rng.integers(0, 2, 20), 2)
    reference = GroupStats.from_chunk(values[20:], rng.integers(0, 2, 40), 2)
    statistic, _ = welch_between(target, reference, overestimate)
    np.testing.assert_array_equal(
        welch_statistic_between(target, reference, overestimate), statistic
    )
