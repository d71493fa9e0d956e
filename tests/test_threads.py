"""Kernels split over threads give the values of one thread; each run has its own threads."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest
import scipy.sparse as sp

from scperteval.data.dataset import _scan
from scperteval.kernels.threads import Threads, available_cores, dealt_back_and_forth
from scperteval.stats.groups import GroupStats


def test_run_ranges_keeps_order_and_skips_empty_ranges():
    seen = []

    def work(start, stop):
        seen.append(threading.get_ident())
        return list(range(start, stop))

    threads = Threads(3)
    assert threads.run_ranges(work, [0, 3, 3, 7, 10]) == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]
    assert threads.run_ranges(work, [5, 5]) == []
    assert threads.run_ranges(work, [0, 4]) == [[0, 1, 2, 3]]


def test_a_serial_view_shares_the_run_but_not_its_limit():
    run = Threads()
    assert run.count == run.cores == available_cores()
    serial = run.serial()
    assert serial.count == 1 and serial.cores == run.cores and run.count == available_cores()
    assert run.limited(3).serial().count == 1 and run.limited(0).count == 1
    assert serial.large_fit_lock is run.large_fit_lock
    assert serial.dataset_task_lock is run.dataset_task_lock
    assert Threads().large_fit_lock is not run.large_fit_lock  # another run


def test_a_copy_in_another_process_is_a_run_of_its_own():
    run = Threads(3)
    run.run_ranges(lambda a, b: None, [0, 1, 2])  # the pool exists
    copied = pickle.loads(pickle.dumps(run))
    # The whole run takes the other machine's cores; a limit travels.
    assert copied.count == available_cores() and copied.large_fit_lock is not run.large_fit_lock
    assert pickle.loads(pickle.dumps(run.limited(2))).count == 2
    assert pickle.loads(pickle.dumps(run.serial())).count == 1


def test_group_moments_do_not_depend_on_the_threads(monkeypatch):
    rng = np.random.default_rng(5)
    matrix = sp.random(3000, 40, density=0.3, format="csr", random_state=6) * 4.0
    codes = rng.integers(0, 37, size=3000)
    one = GroupStats.from_chunk(matrix, codes, 37, Threads().serial())
    several = GroupStats.from_chunk(matrix, codes, 37, Threads(4))
    np.testing.assert_array_equal(several.mean, one.mean)
    np.testing.assert_array_equal(several.m2, one.m2)


def test_scan_over_blocks_equals_numpy():
    threads = Threads(3)
    values = np.random.default_rng(7).normal(size=300_000).astype(np.float32)
    values[[10, 200_000]] = np.nan
    values[250_000] = np.inf
    finite = values[np.isfinite(values)]
    assert _scan(values, threads) == (3, float(finite.min()), float(finite.max()), False)
    assert _scan(values) == _scan(values, threads.serial())
    assert _scan(np.round(finite[:1000]).astype(np.float64), threads)[3] is True
    assert _scan(np.zeros(0), threads) == (0, np.inf, -np.inf, True)


def test_even_bounds_cover_the_items_in_at_most_the_allowed_ranges():
    three = Threads().limited(3)
    assert three.even_bounds(10, 100) == [0, 3, 6, 10]
    assert three.even_bounds(10, 2) == [0, 5, 10]
    assert three.even_bounds(10, 0) == [0, 10]
    assert three.even_bounds(0, 5) == [0, 0, 0, 0]
    assert three.serial().even_bounds(7, 100) == [0, 7]


def test_a_claim_on_the_cores_holds_back_other_threads_until_released():
    run = Threads(2)
    claim_cores, wait_for_cores = run.claim_cores, run.serial().wait_for_cores
    passed = threading.Event()

    def task():
        wait_for_cores()
        passed.set()

    with claim_cores():
        with claim_cores():  # claims nest
            wait_for_cores()  # the claiming thread never waits on its own claim
            waiting = threading.Thread(target=task)
            waiting.start()
            assert not passed.wait(0.3)
        assert not passed.wait(0.1)  # the outer claim still holds
    assert passed.wait(10)
    waiting.join(10)
    wait_for_cores()  # nothing claimed: returns at once


def test_claims_of_two_threads_both_hold_back_a_third():
    run = Threads(2)
    claim_cores, wait_for_cores = run.claim_cores, run.wait_for_cores
    released = [threading.Event(), threading.Event()]
    claimed = [threading.Event(), threading.Event()]
    passed = threading.Event()

    def claimer(index):
        with claim_cores():
            claimed[index].set()
            released[index].wait(10)

    claimers = [threading.Thread(target=claimer, args=(i,)) for i in range(2)]
    for thread in claimers:
        thread.start()
    for event in claimed:
        assert event.wait(10)
    waiting = threading.Thread(target=lambda: (wait_for_cores(), passed.set()))
    waiting.start()
    released[0].set()
    claimers[0].join(10)
    assert not passed.wait(0.3)
    released[1].set()
    assert passed.wait(10)
    for thread in (*claimers, waiting):
        thread.join(10)


def test_dealing_back_and_forth_evens_falling_work():
    for n_items in range(0, 40):
        for n_ranges in (1, 2, 3, 5):
            dealt = dealt_back_and_forth(n_items, n_ranges)
            assert len(dealt) == n_ranges
            assert sorted(item for items in dealt for item in items) == list(range(n_items))
            assert all(items == sorted(items) for items in dealt)
            # Work n_items - i for item i: every full round gives each range the same
            # total, so the ranges differ by less than one item's work.
            work = [sum(n_items - item for item in items) for items in dealt]
            assert max(work) - min(work) <= n_items
    # Dealt in turn, two ranges would get 110 and 100 units of 20 items' work.
    assert [sum(20 - item for item in items) for items in dealt_back_and_forth(20, 2)] == [
        105,
        105,
    ]


def test_cores_are_claimed_only_for_parallel_kernels():
    run = Threads(2)
    passed = threading.Event()

    def task():
        run.wait_for_cores()
        passed.set()

    with run.serial().claim_cores_when_parallel():
        alone = threading.Thread(target=task)
        alone.start()
        assert passed.wait(10)  # one kernel thread: nothing claimed
    alone.join(10)
    passed.clear()
    with run.claim_cores_when_parallel():
        held = threading.Thread(target=task)
        held.start()
        assert not passed.wait(0.3)
    assert passed.wait(10)
    held.join(10)


def test_a_claim_holds_back_the_tasks_of_its_own_run_only():
    run, other = Threads(2), Threads(2)
    passed = threading.Event()
    with run.claim_cores():
        beside = threading.Thread(target=lambda: (other.wait_for_cores(), passed.set()))
        beside.start()
        assert passed.wait(10)  # another run's task does not wait
    beside.join(10)


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_the_blas_limit_is_set_by_every_holder_and_restored_by_none():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(2, user_api="blas"):
        first, second = Threads(), Threads()
        with first.single_threaded_blas():
            assert all(n == 1 for n in _blas_threads())
            with second.single_threaded_blas():
                assert all(n == 1 for n in _blas_threads())
            # The other run left: the setting this run needs is still in place.
            assert all(n == 1 for n in _blas_threads())
        threadpool_limits(2, user_api="blas")  # the user changes it between two products
        with first.single_threaded_blas():
            assert all(n == 1 for n in _blas_threads())


def test_the_torch_limit_is_set_and_left_in_place():
    torch = pytest.importorskip("torch")
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with Threads.single_threaded_torch(torch):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)
