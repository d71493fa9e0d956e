"""Context caching: thread safety, computed once, independent of chunking."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from scperteval._memo import Memo
from scperteval.context import Context
from scperteval.data.dataset import Dataset

COV = "cell_line"
REQUESTS = [
    ("de", "t-test", "rest", "all"),
    ("de", "t-test_overestim_var", "control", "truth"),
    ("de", "t-test", "rest", "duplicate"),
    ("de", "wilcoxon", "control", "all"),
    ("group_stats",),
    ("weights",),
]


def ask(context: Context, request: tuple):
    if request[0] == "de":
        _, method, reference, half = request
        return context.de(method=method, reference=reference, half=half)
    if request[0] == "group_stats":
        return context.group_stats
    return context.deg_weights()


def arrays_of(value) -> list[np.ndarray]:
    if isinstance(value, np.ndarray):
        return [value]
    if hasattr(value, "m2"):
        return [value.n, value.mean, value.m2]
    return [
        value.statistic,
        value.pvalue,
        value.pvalue_adj,
        value.log_fold_change,
        value.mean_target,
        value.mean_reference,
    ]


@pytest.fixture
def counted(monkeypatch):
    """Count (and slow down) the expensive computations of every Context."""
    calls: Counter = Counter()
    lock = threading.Lock()
    compute_stats = Context._compute_group_stats
    compute_de = Context._de

    def slow_stats(self):
        with lock:
            calls["group_stats"] += 1
        time.sleep(0.05)  # widen the window in which other threads ask for it
        return compute_stats(self)

    def slow_de(self, method, reference, half):
        with lock:
            calls[("de", method, reference, half)] += 1
        time.sleep(0.02)
        return compute_de(self, method, reference, half)

    monkeypatch.setattr(Context, "_compute_group_stats", slow_stats)
    monkeypatch.setattr(Context, "_de", slow_de)
    return calls


def test_concurrent_calls_compute_once_and_match_serial(sim_adata, counted):
    serial = Context(Dataset(sim_adata, covariate_key=COV), seed=1)
    expected = [ask(serial, r) for r in REQUESTS]
    serial_calls = dict(counted)
    counted.clear()

    shared = Context(Dataset(sim_adata, covariate_key=COV), seed=1)
    n_threads = 8
    barrier = threading.Barrier(n_threads)

    def worker(i: int):
        barrier.wait()
        # Each thread walks the requests from a different starting point.
        order = REQUESTS[i % len(REQUESTS) :] + REQUESTS[: i % len(REQUESTS)]
        return {r: ask(shared, r) for r in order}

    with ThreadPoolExecutor(max_workers=n_threads) as pool:
        results = list(pool.map(worker, range(n_threads)))

    assert counted["group_stats"] == 1
    for request in REQUESTS:
        if request[0] == "de":
            assert counted[request] == 1, request
    assert dict(counted) == serial_calls
    for request, reference in zip(REQUESTS, expected, strict=True):
        first = results[0][request]
        for result in results:
            assert result[request] is first  # one shared object
        for got, want in zip(arrays_of(first), arrays_of(reference), strict=True):
            np.testing.assert_array_equal(got, want)


def test_concurrent_group_stats_only(sim_adata, counted):
    context = Context(Dataset(sim_adata, covariate_key=COV))
    barrier = threading.Barrier(8)

    def worker(_):
        barrier.wait()
        return context.group_stats

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(worker, range(8)))
    assert counted["group_stats"] == 1
    assert all(r is results[0] for r in results)


def test_separate_contexts_on_threads_match_serial():
    """Several contexts computing at once (large chunks use the parallel kernel)."""
    from scperteval.simulation import simulate

    adata = simulate(n_perturbations=8, n_genes=30, cells_per_perturbation=1200, seed=5)
    expected = Context(Dataset(adata, chunk_cells=10_000)).de()

    def run(_):
        return Context(Dataset(adata, chunk_cells=10_000)).de()

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, range(4)))
    for result in results:
        np.testing.assert_array_equal(result.statistic, expected.statistic)
        np.testing.assert_array_equal(result.pvalue, expected.pvalue)


@pytest.mark.parametrize("chunk_cells", [29, 100, 599, 10**6])
def test_results_independent_of_chunk_cells(sim_adata, chunk_cells):
    reference = Context(Dataset(sim_adata, covariate_key=COV), seed=2)
    context = Context(Dataset(sim_adata, covariate_key=COV, chunk_cells=chunk_cells), seed=2)
    np.testing.assert_array_equal(context.layout.codes, reference.layout.codes)
    np.testing.assert_array_equal(context.group_stats.n, reference.group_stats.n)
    np.testing.assert_allclose(
        context.group_stats.mean, reference.group_stats.mean, rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        context.group_stats.m2, reference.group_stats.m2, rtol=1e-10, atol=1e-12
    )
    for method, ref, half in [
        ("t-test", "rest", "all"),
        ("t-test_overestim_var", "control", "truth"),
    ]:
        first = context.de(method=method, reference=ref, half=half)
        second = reference.de(method=method, reference=ref, half=half)
        np.testing.assert_allclose(first.statistic, second.statistic, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(first.pvalue, second.pvalue, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        context.deg_weights(), reference.deg_weights(), rtol=1e-9, atol=1e-15
    )


def test_progress_reports_every_chunk(sim_adata):
    seen: list[tuple[int, int]] = []
    dataset = Dataset(sim_adata, chunk_cells=250)
    context = Context(dataset, progress=lambda done, total: seen.append((done, total)))
    context.group_stats  # noqa: B018
    assert seen == [(250, 600), (500, 600), (600, 600)]
    context.de()
    assert len(seen) == 3  # cached: no second pass


def test_centroids_and_control_means(sim_adata):
    context = Context(Dataset(sim_adata, covariate_key=COV), seed=0)
    x = sim_adata.X.toarray().astype(np.float64)
    labels = sim_adata.obs["perturbation"].astype(str).to_numpy()
    lines = sim_adata.obs[COV].astype(str).to_numpy()
    for k, condition in enumerate(context.layout.conditions):
        cells = (labels == condition.perturbation) & (lines == condition.covariate)
        np.testing.assert_allclose(
            context.centroids()[k], x[cells].mean(axis=0), rtol=1e-12, atol=1e-14
        )
        truth = x[context.layout.positions(k, "truth")].mean(axis=0)
        np.testing.assert_allclose(context.centroids("truth")[k], truth, rtol=1e-12, atol=1e-14)
        controls = (labels == "control") & (lines == condition.covariate)
        np.testing.assert_allclose(
            context.control_means()[k], x[controls].mean(axis=0), rtol=1e-12, atol=1e-14
        )
        perturbed = (labels != "control") & (lines == condition.covariate)
        c = context.layout.condition_covariate[k]
        np.testing.assert_allclose(
            context.perturbed_stats().mean[c], x[perturbed].mean(axis=0), rtol=1e-12, atol=1e-14
        )


def test_memo_computes_once_and_retries_after_failure():
    memo = Memo()
    calls = Counter()
    barrier = threading.Barrier(6)

    def compute():
        calls["value"] += 1
        time.sleep(0.05)
        return object()

    def worker(_):
        barrier.wait()
        return memo.get("key", compute)

    with ThreadPoolExecutor(max_workers=6) as pool:
        values = list(pool.map(worker, range(6)))
    assert calls["value"] == 1 and all(v is values[0] for v in values)
    assert "key" in memo

    def fail():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        memo.get("other", fail)
    assert "other" not in memo
    assert memo.get("other", lambda: 3) == 3
    memo.clear()
    assert "key" not in memo
