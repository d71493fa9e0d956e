"""Default thread count of calibrate and score."""

from __future__ import annotations

import os

import pytest

from scperteval.engine.dispatch import MAX_DEFAULT_WORKERS, default_workers, resolve_workers
from scperteval.kernels import threads


def test_default_workers_follow_the_cpu_affinity():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert default_workers() == max(1, min(int(expected or 1), MAX_DEFAULT_WORKERS))


def test_default_workers_are_capped(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert default_workers() == MAX_DEFAULT_WORKERS
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert default_workers() == 1


def test_resolve_workers():
    assert resolve_workers(None) == default_workers()
    assert resolve_workers(3) == 3
    with pytest.raises(ValueError, match="at least 1"):
        resolve_workers(0)


def test_values_are_bit_identical_for_any_worker_count_and_run():
    import numpy as np

    import scperteval

    adata = scperteval.simulate(
        n_perturbations=8, n_genes=80, cells_per_perturbation=40, n_covariates=2, seed=8
    )
    protocols = "energy_pca,mmd_pca,rank_pca,pearson_delta_ctrl"
    tables = [
        scperteval.calibrate(adata, protocols, covariate_key="cell_line", workers=w).results
        for w in (1, 2, 4, 4)
    ]
    first = tables[0]["value"].to_numpy()
    assert np.isfinite(first).mean() > 0.9
    for table in tables[1:]:
        np.testing.assert_array_equal(table["value"].to_numpy(), first)


def test_a_pool_fits_each_shared_space_once_per_covariate_group(monkeypatch):
    import scperteval
    from scperteval.engine import _pca as pca
    from scperteval.engine import spaces

    fits = []

    def counted(sample, k, threads):
        fits.append(sample.shape)
        return pca.principal_axes(sample, k, threads=threads)

    monkeypatch.setattr(spaces, "principal_axes", counted)
    adata = scperteval.simulate(
        n_perturbations=6, n_genes=60, cells_per_perturbation=30, n_covariates=2, seed=3
    )
    # Protocols on the PCA space mixed with others: the fit runs as a pool task.
    protocols = "energy_pca,pearson_delta_ctrl,rank_pca,mse,mmd_pca"
    scperteval.calibrate(adata, protocols, covariate_key="cell_line", workers=3)
    assert len(fits) == 2


def test_an_executor_runs_every_task_once_with_the_same_values():
    import concurrent.futures as cf

    import numpy as np

    import scperteval
    from scperteval.engine import dispatch

    adata = scperteval.simulate(
        n_perturbations=8, n_genes=60, cells_per_perturbation=30, n_covariates=2, seed=4
    )
    protocols = "pearson_delta_ctrl,mse,rank_full,de_auroc"
    expected = scperteval.calibrate(adata, protocols, covariate_key="cell_line", workers=2)
    tasks = (dispatch._perturbation_task, dispatch._dataset_task, dispatch._protocols_task)
    submitted = []

    class CountingPool(cf.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            if fn in tasks:
                # A task of several protocols of one space holds a tuple of them.
                names = [p.name for p in args[1]] if isinstance(args[1], tuple) else [args[1].name]
                submitted.extend((fn.__name__, name, args[2]) for name in names)
            return super().submit(fn, *args, **kwargs)

    with CountingPool(max_workers=2) as pool:
        found = scperteval.calibrate(
            adata, protocols, covariate_key="cell_line", workers=2, executor=pool
        )
    np.testing.assert_array_equal(found.results["value"].to_numpy(), expected.results["value"])
    assert found.results.equals(expected.results)
    # Each task once: 16 perturbations x 3 protocols, and the dataset protocol once
    # per covariate group.
    assert len(submitted) == len(set(submitted)) == 16 * 3 + 2


def test_dataset_tasks_run_beside_a_large_fit_and_one_at_a_time():
    import threading

    from scperteval.context import Context
    from scperteval.data.dataset import Dataset
    from scperteval.engine import dispatch
    from scperteval.engine.candidates import CONTROLS
    from scperteval.engine.engine import Engine
    from scperteval.simulation import simulate

    adata = simulate(n_perturbations=4, n_genes=40, cells_per_perturbation=30, seed=2)
    engine = Engine(Context(Dataset(adata), seed=1))
    (rank_full,) = _suite_protocols("rank_full")
    rows = []

    def dataset_task():
        rows.extend(dispatch._dataset_task(engine, rank_full, 0, CONTROLS))

    with engine.threads.large_fit_lock:  # a large fit running
        beside = threading.Thread(target=dataset_task)
        beside.start()
        beside.join(60)
        assert not beside.is_alive() and rows  # ran beside it
        other_fit = threading.Thread(target=dispatch._fit_task, args=(engine, "pca", 0))
        other_fit.start()
        other_fit.join(0.5)
        assert other_fit.is_alive()  # large fits run one at a time
    other_fit.join(60)
    assert not other_fit.is_alive()
    with engine.threads.dataset_task_lock:  # another dataset task running
        waiting = threading.Thread(target=dataset_task)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()
    waiting.join(60)
    assert not waiting.is_alive()


def test_dataset_tasks_waiting_for_a_large_fit_are_queued_after_the_others(monkeypatch):
    import scperteval
    from scperteval.engine import dispatch

    adata = scperteval.simulate(n_perturbations=5, n_genes=40, cells_per_perturbation=30, seed=3)
    order = []
    real = dispatch.dataset_rows

    def noted(engine, protocol, covariate, candidates):
        order.append(protocol.name)
        return real(engine, protocol, covariate, candidates)

    monkeypatch.setattr(dispatch, "dataset_rows", noted)
    scperteval.calibrate(adata, "rank_pca,rank_full,nir", workers=1)
    # rank_pca comes first in the list but needs the PCA: it would hold the others
    # back while the fit runs.
    assert order == ["rank_full", "nir", "rank_pca"]


def _two_kernel_threads(init):
    """``Threads.__init__`` giving a new run two kernel threads even on one core."""

    def two(self, cores=None):
        init(self, 2 if cores is None else cores)

    return two


def test_tasks_wait_while_a_fit_builds_its_gram_matrix_on_every_core(monkeypatch):
    import time

    import numpy as np

    import scperteval
    from scperteval.engine import _pca as pca
    from scperteval.kernels.threads import Threads

    adata = scperteval.simulate(n_perturbations=12, n_genes=60, cells_per_perturbation=30, seed=5)
    protocols = "pearson_delta_ctrl,mse,cosine_delta_ctrl,rank_pca"
    # The Gram route and parallel tiles even for this small sample and on one core.
    monkeypatch.setattr(pca, "SMALL_SIDE", 10)
    monkeypatch.setattr(Threads, "__init__", _two_kernel_threads(Threads.__init__))
    # Compiled kernels loaded first: on a cold cache the fit would compile them for
    # seconds before its Gram matrix, and every task could finish meanwhile.
    scperteval.calibrate(adata, protocols, workers=2)
    task_starts = []
    real_wait = Threads.wait_for_cores

    def noted_wait(self):
        real_wait(self)
        task_starts.append(time.perf_counter())
        # Each task takes a moment, so that some are still to start when the fit
        # claims the cores (else they could all start first, and nothing is tested).
        time.sleep(0.01)

    windows = []
    real_add = pca._add_outer_products

    def slow_add(*args, **kwargs):
        start = time.perf_counter()
        real_add(*args, **kwargs)
        time.sleep(0.4)
        windows.append((start, time.perf_counter()))

    monkeypatch.setattr(Threads, "wait_for_cores", noted_wait)
    monkeypatch.setattr(pca, "_add_outer_products", slow_add)
    found = scperteval.calibrate(adata, protocols, workers=2).results
    assert windows and np.isfinite(found["value"]).mean() > 0.9
    # A task that passed its wait just before the claim may note it a moment late.
    inside = [t for t in task_starts for a, b in windows if a + 0.1 < t < b]
    assert inside == []
    assert sum(t > windows[-1][1] for t in task_starts) > 0  # the rest ran after


def test_a_cheap_shared_space_never_waits_behind_a_large_fit():
    import threading

    from scperteval.context import Context
    from scperteval.data.dataset import Dataset
    from scperteval.engine import dispatch
    from scperteval.engine.engine import Engine
    from scperteval.engine.spaces import space_has_large_fit
    from scperteval.simulation import simulate

    assert space_has_large_fit("pca(k=5)") and not space_has_large_fit("heg(k=5)")
    assert not space_has_large_fit("top_k(k=5)")  # per perturbation: never fitted ahead
    adata = simulate(n_perturbations=4, n_genes=40, cells_per_perturbation=30, seed=2)
    engine = Engine(Context(Dataset(adata), seed=1))
    with engine.threads.large_fit_lock:  # a large fit running
        cheap = threading.Thread(target=dispatch._fit_task, args=(engine, "heg(k=5)", 0))
        cheap.start()
        cheap.join(10)
        assert not cheap.is_alive()
    # Large fits are handed out first, so that no worker takes a cheap one and then
    # the next large one while another large fit holds the lock.
    protocols = _suite_protocols("pearson_delta_ctrl_heg,rank_pca,energy_pca")
    fits = dispatch._shared_space_fits(engine, protocols)
    assert [space_has_large_fit(space) for space, _ in fits] == sorted(
        (space_has_large_fit(space) for space, _ in fits), reverse=True
    )
    assert {space for space, _ in fits} == {"heg(k=1000)", "pca(k=50)"}


def _suite_protocols(names):
    """Protocols of the default suite by name."""
    from scperteval.engine.suites import resolve_protocols

    return resolve_protocols(names)


def test_protocols_of_one_space_resolve_it_once_per_perturbation(monkeypatch):
    from collections import Counter

    import numpy as np

    import scperteval
    from scperteval.engine import dispatch

    adata = scperteval.simulate(n_perturbations=6, n_genes=50, cells_per_perturbation=30, seed=4)
    resolved = Counter()
    real_resolve = dispatch.resolve_space

    def counted(engine, spec, condition):
        resolved[(spec, condition)] += 1
        return real_resolve(engine, spec, condition)

    protocols = "de_auprc,de_auroc,de_topk_overlap"
    expected = scperteval.calibrate(adata, protocols, workers=2).results
    monkeypatch.setattr(dispatch, "resolve_space", counted)
    found = scperteval.calibrate(adata, protocols, workers=2).results
    # One task per perturbation runs the three protocols of the "expressed" space.
    assert resolved and set(resolved.values()) == {1}
    assert {spec for spec, _ in resolved} == {"expressed"}
    np.testing.assert_array_equal(found["value"].to_numpy(), expected["value"].to_numpy())


def test_de_protocols_of_one_perturbation_share_each_sources_view(monkeypatch):
    from collections import Counter

    import numpy as np
    import pandas as pd

    import scperteval
    from scperteval.engine import dispatch

    adata = scperteval.simulate(n_perturbations=6, n_genes=50, cells_per_perturbation=30, seed=5)
    protocols = ["de_auprc", "de_auroc", "de_topk_overlap"]
    made = Counter()
    real_make = dispatch.make_view

    def counted(engine, protocol, condition, source, space, reference, cache_key=None):
        made[condition] += 1
        return real_make(engine, protocol, condition, source, space, reference, cache_key)

    monkeypatch.setattr(dispatch, "make_view", counted)
    together = scperteval.calibrate(adata, ",".join(protocols), workers=2).results
    # Each source's DE view (the truth and every candidate) is made once per
    # perturbation, not once per protocol.
    candidates = together.groupby(["protocol", "perturbation"]).size()
    assert set(candidates) == {2}
    assert len(made) == adata.obs["perturbation"].nunique() - 1
    assert set(made.values()) == {1 + 2}
    alone = pd.concat([scperteval.calibrate(adata, name, workers=1).results for name in protocols])
    key = ["covariate", "protocol", "perturbation", "source", "source_name"]
    merged = together.merge(alone, on=key, suffixes=("", "_alone"))
    assert len(merged) == len(together) == len(alone)
    np.testing.assert_array_equal(merged["value"].to_numpy(), merged["value_alone"].to_numpy())
    assert np.isfinite(together["value"]).mean() > 0.5


def test_rank_metrics_of_one_space_share_each_candidates_distances(monkeypatch):
    from collections import Counter

    import numpy as np

    import scperteval
    from scperteval.engine import dataset_scope

    adata = scperteval.simulate(
        n_perturbations=8, n_genes=60, cells_per_perturbation=30, n_covariates=2, seed=6
    )
    protocols = "rank_full,transpose_rank,nir,pds"
    computed = Counter()
    real = dataset_scope.prediction_truth_distances

    def counted(gt, pred, distance, **options):
        computed[distance] += 1
        return real(gt, pred, distance, **options)

    real_squared = dataset_scope.sqeuclidean_to_truths

    def counted_squared(pred, truths, **options):
        computed["sqeuclidean"] += 1
        return real_squared(pred, truths, **options)

    monkeypatch.setattr(dataset_scope, "prediction_truth_distances", counted)
    monkeypatch.setattr(dataset_scope, "sqeuclidean_to_truths", counted_squared)
    shared = scperteval.calibrate(adata, protocols, covariate_key="cell_line").results
    # Two candidates (positive and negative control) x two covariate groups, once each
    # for the three protocols of the full space; pds (target genes left out) apart.
    assert computed == {"sqeuclidean": 4}
    monkeypatch.setattr(dataset_scope, "_distance_function", lambda protocol: None)
    alone = scperteval.calibrate(adata, protocols, covariate_key="cell_line").results
    np.testing.assert_array_equal(shared["value"].to_numpy(), alone["value"].to_numpy())
    assert shared.drop(columns="value").equals(alone.drop(columns="value"))
    assert np.isfinite(shared["value"]).mean() > 0.9
