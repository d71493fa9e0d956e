"""Kernels split over threads give the values of one thread."""

from __future__ import annotations

import threading

import numpy as np
import scipy.sparse as sp

from scperteval.data.dataset import _scan
from scperteval.kernels.threads import (
    claim_cores,
    claim_cores_when_parallel,
    dealt_back_and_forth,
    kernel_threads,
    limit_kernel_threads,
    run_ranges,
    serial_kernels,
    wait_for_cores,
)
from scperteval.stats.groups import GroupStats


def test_run_ranges_keeps_order_and_skips_empty_ranges():
    seen = []

    def work(start, stop):
        seen.append(threading.get_ident())
        return list(range(start, stop))

    assert run_ranges(work, [0, 3, 3, 7, 10]) == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]
    assert run_ranges(work, [5, 5]) == []
    assert run_ranges(work, [0, 4]) == [[0, 1, 2, 3]]


def test_serial_kernels_is_local_to_the_thread():
    outside = kernel_threads()
    inside = []
    with serial_kernels():
        assert kernel_threads() == 1
        other = threading.Thread(target=lambda: inside.append(kernel_threads()))
        other.start()
        other.join()
    assert inside == [outside]
    assert kernel_threads() == outside


def test_group_moments_do_not_depend_on_the_threads(monkeypatch):
    rng = np.random.default_rng(5)
    matrix = sp.random(3000, 40, density=0.3, format="csr", random_state=6) * 4.0
    codes = rng.integers(0, 37, size=3000)
    with serial_kernels():
        one = GroupStats.from_chunk(matrix, codes, 37)
    monkeypatch.setattr("scperteval.kernels.threads.available_cores", lambda: 4)
    assert kernel_threads() == 4
    several = GroupStats.from_chunk(matrix, codes, 37)
    np.testing.assert_array_equal(several.mean, one.mean)
    np.testing.assert_array_equal(several.m2, one.m2)


def test_scan_over_blocks_equals_numpy(monkeypatch):
    monkeypatch.setattr("scperteval.kernels.threads.available_cores", lambda: 3)
    values = np.random.default_rng(7).normal(size=300_000).astype(np.float32)
    values[[10, 200_000]] = np.nan
    values[250_000] = np.inf
    finite = values[np.isfinite(values)]
    assert _scan(values) == (3, float(finite.min()), float(finite.max()), False)
    assert _scan(np.round(finite[:1000]).astype(np.float64))[3] is True
    assert _scan(np.zeros(0)) == (0, np.inf, -np.inf, True)


def test_limit_kernel_threads_nests_and_restores():
    outside = kernel_threads()
    with limit_kernel_threads(3):
        assert kernel_threads() == 3
        with serial_kernels():
            assert kernel_threads() == 1
        assert kernel_threads() == 3
    assert kernel_threads() == outside


def test_even_bounds_cover_the_items_in_at_most_the_allowed_ranges():
    from scperteval.kernels.threads import even_bounds, limit_kernel_threads

    with limit_kernel_threads(3):
        assert even_bounds(10, 100) == [0, 3, 6, 10]
        assert even_bounds(10, 2) == [0, 5, 10]
        assert even_bounds(10, 0) == [0, 10]
        assert even_bounds(0, 5) == [0, 0, 0, 0]
    with limit_kernel_threads(1):
        assert even_bounds(7, 100) == [0, 7]


def test_a_claim_on_the_cores_holds_back_other_threads_until_released():
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
    passed = threading.Event()

    def task():
        wait_for_cores()
        passed.set()

    with limit_kernel_threads(1), claim_cores_when_parallel():
        alone = threading.Thread(target=task)
        alone.start()
        assert passed.wait(10)  # one kernel thread: nothing claimed
    alone.join(10)
    passed.clear()
    with limit_kernel_threads(2), claim_cores_when_parallel():
        held = threading.Thread(target=task)
        held.start()
        assert not passed.wait(0.3)
    assert passed.wait(10)
    held.join(10)
