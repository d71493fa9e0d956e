"""Engine shortcuts for energy distance and MMD: the direct formulas' values, exactly.

The leave-one-out shortcut (shared spaces, ``all_perturbed_sample``) regroups float
sums, so it is compared with the direct formula at 1e-12 of the within-sample term;
every other path must give the direct formula's value bit for bit.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.spatial.distance import cdist

from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.engine.dispatch import CONTROLS, run_protocols, task_count
from scperteval.engine.engine import Engine
from scperteval.engine.fastpath import plan_population, population_value
from scperteval.engine.pairs import NumpyPairs
from scperteval.engine.protocol import Protocol
from scperteval.engine.spaces import resolve_space
from scperteval.engine.views import centering_vector, make_view
from scperteval.kernels.pairs import (
    SQRT,
    StoredPairs,
    pair_sums,
    rbf_transform,
)
from scperteval.metrics import PerturbationContext, population
from scperteval.simulation import simulate

SEED = 2


def cloud(seed, n, dim=5, zeros=0):
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(n, dim)) + 2.0
    points[:zeros] = 0.0  # coinciding cells, as in a sparse top-k space
    return points


# ------------------------------------------------------------------ pair sums


@pytest.mark.parametrize("block", [64, 5000, population.DEFAULT_BLOCK_BYTES])
@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_pair_sums_match_brute_force(n, block):
    x, y = cloud(0, n, zeros=n // 3), cloud(1, 23)
    transforms = [SQRT, rbf_transform(0.7), rbf_transform(3.0)]
    d_xy, d_xx = cdist(x, y), cdist(x, x)
    upper = np.triu_indices(n, k=1)
    expected_cross = [d_xy.sum(), *(np.exp(-(d_xy**2) / (2 * s**2)).sum() for s in (0.7, 3.0))]
    expected_within = [
        d_xx[upper].sum(),
        *(np.exp(-(d_xx[upper] ** 2) / (2 * s**2)).sum() for s in (0.7, 3.0)),
    ]
    np.testing.assert_allclose(
        pair_sums(x, y, transforms, max_block_bytes=block), expected_cross, rtol=1e-12
    )
    within = pair_sums(x, None, transforms, max_block_bytes=block)
    np.testing.assert_allclose(within, expected_within, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("block", [300, population.DEFAULT_BLOCK_BYTES])
def test_each_transform_gets_its_value_alone_and_from_stored_pairs(block):
    x = cloud(2, 2500, dim=4, zeros=200)
    transforms = [rbf_transform(0.3), SQRT, rbf_transform(2.0)]
    together = pair_sums(x, None, transforms, max_block_bytes=block)
    alone = [pair_sums(x, None, [t], max_block_bytes=block)[0] for t in transforms]
    stored = StoredPairs(x, max_block_bytes=block).sums(transforms)
    assert together == alone == stored  # bit for bit


def test_pair_sums_rejects_unknown_transforms():
    with pytest.raises(ValueError, match="unknown pair transform"):
        pair_sums(cloud(0, 3), None, [("cosh", 1.0)])


def test_pair_sums_of_concurrent_runs_equal_those_made_alone():
    from threadpoolctl import threadpool_limits

    from scperteval.kernels.threads import Threads

    alone = [pair_sums(cloud(s, 400), None, [SQRT], threads=Threads()) for s in range(16)]
    with threadpool_limits(2, user_api="blas"), cf.ThreadPoolExecutor(4) as pool:
        # Each call its own run, as two runs of one process are.
        found = list(pool.map(lambda s: pair_sums(cloud(s, 400), None, [SQRT]), range(16)))
    assert found == alone


def test_sinkhorn_on_torch_runs_on_one_thread_and_leaves_it_so():
    torch = pytest.importorskip("torch")
    pytest.importorskip("geomloss")
    saved = torch.get_num_threads()
    context = PerturbationContext("p", device="cpu")
    try:
        values = []
        for _ in range(2):
            torch.set_num_threads(2)  # changed between two runs: set again
            values.append(population.sinkhorn(cloud(0, 12), cloud(1, 10), context))
            # Not restored: a restore could land under another run's sums.
            assert torch.get_num_threads() == 1
        assert values[0] == values[1]
    finally:
        torch.set_num_threads(saved)


# ------------------------------------------------------------ engine fast path


@pytest.fixture(scope="module")
def adata():
    return simulate(
        n_perturbations=8,
        n_genes=80,
        cells_per_perturbation=30,
        n_covariates=2,
        n_combinations=1,
        seed=11,
    )


def make_engine(adata, **options):
    return Engine(Context(Dataset(adata, covariate_key="cell_line"), seed=SEED), **options)


SPECS = {
    "energy_pca": ("energy_distance", "pca(k=6)", "none"),
    "energy_pca_unbiased_false": ("energy_distance(unbiased=False)", "pca(k=6)", "control"),
    "mmd_pca": ("mmd(bandwidth='truth')", "pca(k=6)", "none"),
    "mmd_hvg_fixed": ("mmd(bandwidth=2.5)", "hvg(k=20)", "none"),
    "energy_hvg": ("energy_distance", "hvg(k=20)", "perturbed"),
    "energy_top_k": ("energy_distance", "top_k(k=10)", "none"),
    "mmd_top_k": ("mmd(bandwidth='truth')", "top_k(k=10)", "none"),
    "mmd_top_k_pooled": ("mmd", "top_k(k=10)", "none"),
}


def protocol(name, negative="all_perturbed_sample"):
    metric, space, centering = SPECS[name]
    return Protocol.from_mapping(
        {
            "name": name,
            "metric": metric,
            "space": space,
            "centering": centering,
            "negative": negative,
        }
    )


def direct_and_fast(engine, proto, condition, source_name):
    space = resolve_space(engine, proto.space, condition)
    reference = centering_vector(engine, proto.centering, condition)
    truth = make_view(engine, proto, condition, engine.source("truth", condition), space, reference)
    source = engine.source(source_name, condition)
    view = make_view(engine, proto, condition, source, space, reference)
    direct = float(proto.metric(truth, view))
    fast = population_value(
        engine, proto, condition, space, reference, truth, source, cache_key=source_name
    )
    return direct, fast


def scale_of(engine, proto, condition):
    """Size of the terms of the estimate: the mean pairwise value of the sample."""
    space = resolve_space(engine, proto.space, condition)
    sample = make_view(
        engine, proto, condition, engine.source("all_perturbed_sample", condition), space, None
    )
    if proto.metric.name == "mmd":
        return 1.0
    return float(cdist(sample, sample).mean())


@pytest.mark.parametrize("sample_cells", [8192, 60])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_fast_path_gives_the_direct_value(adata, name, sample_cells):
    engine = make_engine(adata, sample_cells=sample_cells)
    proto = protocol(name)
    plan_population(engine, [protocol(n) for n in SPECS])
    shared = "top_k" not in proto.space
    for condition in range(engine.context.layout.n_conditions):
        for source_name in ("all_perturbed_sample", "technical_duplicate"):
            direct, fast = direct_and_fast(engine, proto, condition, source_name)
            if name == "mmd_top_k_pooled":
                assert fast is None  # pooled bandwidth: left to the metric
                continue
            assert fast is not None
            if shared and source_name == "all_perturbed_sample":
                # Leave-one-out: the sums are regrouped, rounding only.
                tolerance = 1e-12 * scale_of(engine, proto, condition)
                assert abs(fast - direct) <= tolerance, (name, condition)
            else:
                assert fast == direct, (name, condition, source_name)


def test_leave_one_out_is_used_and_stores_are_optional(adata):
    engine = make_engine(adata)
    names = ["energy_pca", "mmd_pca"]
    plan_population(engine, [protocol(n) for n in names])
    values = {}
    for name in names:
        proto = protocol(name)
        values[name] = [
            direct_and_fast(engine, proto, k, "all_perturbed_sample")[1]
            for k in range(engine.context.layout.n_conditions)
        ]
    # The within-sample sums of the whole sample were computed once per group and space.
    keys = [key[-1] for key in engine.context._memo._values if isinstance(key, tuple)]
    assert any(isinstance(key, tuple) and key[:1] == ("sample_within",) for key in keys)
    assert len(engine._pair_store)  # the sample's distances, for the per-truth bandwidths
    # Without room for stored distances: the same values, recomputed.
    small = make_engine(adata)
    small.pair_store_bytes = 0
    plan_population(small, [protocol(n) for n in names])
    for name in names:
        proto = protocol(name)
        again = [
            direct_and_fast(small, proto, k, "all_perturbed_sample")[1]
            for k in range(small.context.layout.n_conditions)
        ]
        assert again == values[name]
    assert not len(small._pair_store)


def test_values_do_not_depend_on_the_plan_or_threads(adata):
    names = ["energy_top_k", "mmd_top_k", "energy_pca", "mmd_pca"]
    together = run_protocols(make_engine(adata), [protocol(n) for n in names], CONTROLS)
    for name in names:
        alone = run_protocols(make_engine(adata), [protocol(name)], CONTROLS)
        inside = together[together["protocol"] == name].reset_index(drop=True)
        assert np.array_equal(alone["value"], inside["value"], equal_nan=True), name
    threaded = run_protocols(
        make_engine(adata), [protocol(n) for n in reversed(names)], CONTROLS, workers=3
    )
    assert np.array_equal(threaded["value"], together["value"], equal_nan=True)
    assert together["value"].notna().all()


def test_sample_views_are_the_cells_own_rows(adata):
    engine = make_engine(adata, sample_cells=70)
    for spec in ("pca(k=6)", "top_k(k=10)", "hvg(k=20)"):
        proto = Protocol.from_mapping(
            {
                "name": "p",
                "metric": "energy_distance",
                "space": spec,
                "negative": "all_perturbed_sample",
            }
        )
        for condition in range(engine.context.layout.n_conditions):
            space = resolve_space(engine, spec, condition)
            for name in ("all_perturbed_sample", "matched_perturbed_sample"):
                source = engine.source(name, condition)
                assert source.sample is not None
                view = make_view(engine, proto, condition, source, space, None)
                rows = engine.context.dataset.rows(source.positions)
                np.testing.assert_array_equal(view, space.matrix(rows))


def test_sample_sources_keep_their_definition(adata):
    engine = make_engine(adata, sample_cells=70)
    layout = engine.context.layout
    for condition in range(layout.n_conditions):
        sample, _ = engine.perturbed_sample(engine.covariate_index(condition))
        own = layout.positions(condition, "all")
        source = engine.source("all_perturbed_sample", condition)
        np.testing.assert_array_equal(source.positions, np.setdiff1d(sample, own))
        rows = engine.context.dataset.rows(source.positions)
        dense = rows.toarray() if sp.issparse(rows) else np.asarray(rows)
        expected = dense.astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(source.centroid, expected, rtol=1e-9, atol=1e-12)


def test_degenerate_inputs_keep_their_reason(adata):
    engine = make_engine(adata, sample_cells=1)
    proto = protocol("energy_pca")
    table = run_protocols(engine, [proto], CONTROLS)
    negatives = table[table["source"] == "negative"]
    reasons = set(negatives["reason"])
    assert all(math.isnan(v) for v in negatives["value"])
    assert all("fewer than 2" in r for r in reasons)


def test_dense_data_takes_the_same_paths(adata):
    dense = adata.copy()
    dense.X = np.asarray(adata.X.toarray() if sp.issparse(adata.X) else adata.X)
    engine = make_engine(dense, sample_cells=60)
    plan_population(engine, [protocol(n) for n in SPECS])
    for name in ("energy_pca", "mmd_pca", "energy_top_k", "mmd_top_k"):
        proto = protocol(name)
        for condition in range(engine.context.layout.n_conditions):
            direct, fast = direct_and_fast(engine, proto, condition, "all_perturbed_sample")
            assert abs(fast - direct) <= 1e-12 * scale_of(engine, proto, condition), name
    sparse_table = run_protocols(make_engine(adata), [protocol("energy_pca")], CONTROLS)
    dense_table = run_protocols(make_engine(dense), [protocol("energy_pca")], CONTROLS)
    np.testing.assert_allclose(dense_table["value"], sparse_table["value"], rtol=1e-9)


class CountingPairs(NumpyPairs):
    """The reference backend, counting the pairs each sum visits."""

    def __init__(self):
        super().__init__()
        self.pairs = 0
        self.passes_by_transforms: Counter[int] = Counter()

    def sums(self, x, y, transforms):
        n = x.shape[0]
        self.pairs += n * (n - 1) // 2 if y is None else n * y.shape[0]
        self.passes_by_transforms[len(transforms)] += 1
        return super().sums(x, y, transforms)


@pytest.mark.parametrize("sample_cells", [8192, 60])
@pytest.mark.parametrize("space", ["pca", "top_k"])
def test_protocols_of_one_space_share_every_pass(adata, space, sample_cells):
    names = [f"energy_{space}", f"mmd_{space}"]
    counted = {}
    tables = {}
    for run in (names, names[:1], names[1:]):
        engine = make_engine(adata, sample_cells=sample_cells)
        engine.pairs = CountingPairs()
        tables[tuple(run)] = run_protocols(engine, [protocol(n) for n in run], CONTROLS, workers=2)
        counted[tuple(run)] = engine.pairs
    together, energy, kernel = (counted[tuple(run)] for run in (names, names[:1], names[1:]))
    # Every pass of the kernel protocol is one the energy distance makes anyway (its
    # sample's own distances apart, which the kernel keeps stored instead of summing).
    assert together.pairs == energy.pairs
    assert kernel.pairs > 0
    assert together.passes_by_transforms[2] > 0
    both = tables[tuple(names)]
    for name in names:
        alone = tables[(name,)]
        inside = both[both["protocol"] == name].reset_index(drop=True)
        assert np.array_equal(alone["value"], inside["value"], equal_nan=True), name


def test_a_task_per_space_and_perturbation_counts_its_protocols(adata):
    names = ["energy_pca", "mmd_pca", "energy_top_k", "mmd_top_k"]
    protocols = [protocol(n) for n in names]
    engine = make_engine(adata)
    steps: list[int] = []
    table = run_protocols(engine, protocols, CONTROLS, workers=2, progress=steps.append)
    assert sum(steps) == task_count(engine, protocols)
    # One task per space and perturbation, each standing for both of its protocols.
    assert steps == [2] * (2 * engine.context.layout.n_conditions)
    assert len(table) == len(names) * engine.context.layout.n_conditions * len(CONTROLS)
