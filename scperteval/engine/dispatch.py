"""Running protocols over perturbations on an executor, into one tidy table.

Work is cut into independent tasks, one per (protocol, perturbation) for
perturbation-scope protocols and one per (protocol, covariate group) for
dataset-scope ones. Each task computes the truth view once and every candidate
(controls, models) against it. Tasks share only the engine's thread-safe
caches, and every random choice is seeded by names, so values do not depend on
the number of workers, the order of protocols or which other protocols ran.
A candidate whose computation fails gets NaN and the reason, never a lost run.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import math
import numbers
import queue
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from scperteval.engine.candidates import CONTROLS, Candidate, candidate_identity
from scperteval.engine.candidates import candidate_key as _candidate_key
from scperteval.engine.control_views import CONTROL_REPRESENTATIONS, candidate_reference
from scperteval.engine.dataset_scope import dataset_rows
from scperteval.engine.distributed import Task, is_dask_client
from scperteval.engine.engine import Engine
from scperteval.engine.fastpath import plan_population, population_value
from scperteval.engine.population_cap import Subsampled, cap_source
from scperteval.engine.protocol import Protocol
from scperteval.engine.result_rows import RESULT_COLUMNS, UNDEFINED_REASON
from scperteval.engine.result_rows import SUBSAMPLED as _SUBSAMPLED
from scperteval.engine.result_rows import failure_reason as _failure
from scperteval.engine.result_rows import result_row as _row
from scperteval.engine.spaces import resolve_space, space_has_large_fit, space_is_per_condition
from scperteval.engine.views import centering_vector, make_view, metric_context
from scperteval.errors import SpecError
from scperteval.kernels.threads import available_cores
from scperteval.metrics import DegenerateInput
from scperteval.stats.groups import GroupStats

__all__ = [
    "Candidate",
    "group_statistics",
    "run_protocols",
    "task_count",
    "RESULT_COLUMNS",
    "UNDEFINED_REASON",
]


def task_count(engine: Engine, protocols: Sequence[Protocol]) -> int:
    """Number of tasks :func:`run_protocols` runs (for progress bars)."""
    groups = len(_scored_groups(engine))
    conditions = engine.scored_conditions().size
    return sum(groups if p.scope == "dataset" else conditions for p in protocols)


def _scored_groups(engine: Engine) -> list[int]:
    """Covariate groups with a scored condition (all of them without a split)."""
    layout = engine.context.layout
    if engine.folds is None:
        return list(range(len(layout.covariates)))
    scored = np.unique(layout.condition_covariate[engine.scored_conditions()])
    return [int(covariate) for covariate in scored]


def run_protocols(
    engine: Engine,
    protocols: Sequence[Protocol],
    candidates: Sequence[Candidate] = CONTROLS,
    workers: int = 1,
    executor: Any = None,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """Score every candidate against the truth for every protocol and perturbation.

    Parameters
    ----------
    engine
        Shared data of the dataset.
    protocols
        Validated protocols.
    candidates
        What to score (default: each protocol's positive and negative control).
    workers
        Threads of the default pool (ignored when ``executor`` is given).
    executor
        Any :class:`concurrent.futures.Executor`, or a :class:`distributed.Client`:
        then the engine and the candidates are shipped to its workers once and the
        tasks run there (see :mod:`scperteval.engine.distributed`).
    progress
        Called with the number of tasks just finished.

    Returns
    -------
    pandas.DataFrame
        Tidy table with columns ``covariate, perturbation, protocol, source,
        source_name, value, reason`` (``reason`` explains a NaN), sorted.

    Notes
    -----
    The run holds BLAS to one thread: a product split over BLAS threads may sum in
    an order that depends on their number, which differs between machines and dask
    workers. The limit is set from the calling thread, because OpenBLAS ignores a
    limit set from a pool's thread while the process-wide setting still applies to
    it; parallel work comes from the tasks and the kernels' own threads instead.
    The engine's :attr:`~scperteval.engine.engine.Engine.threads` hold the limit,
    the core claims and the scheduling locks of the run.

    """
    with engine.threads.single_threaded_blas():
        plan_population(engine, protocols)
        tasks = _ordered_tasks(engine, protocols)
        report = progress if progress is not None else (lambda _: None)
        rows: list[dict[str, Any]] = []
        owned = executor is None and workers > 1
        pool = cf.ThreadPoolExecutor(max_workers=workers) if owned else executor
        if pool is None or is_dask_client(pool):
            # Before the tasks: the fits' values do not depend on where they run (BLAS is
            # held to one thread, the fits' own parallel sums use fixed tiles).
            for space, condition in _shared_space_fits(engine, protocols):
                _fit_task(engine, space, condition)
        if is_dask_client(pool):
            from scperteval.engine.distributed import cluster_session

            conditions = [
                arguments[1] if function in (_perturbation_task, _protocols_task) else None
                for function, arguments in tasks
            ]
            session = cluster_session(pool, engine)
            for finished in session.run(engine, tasks, candidates, conditions):
                rows.extend(finished)
                # A task runs one or more protocols for one perturbation (or group).
                report(max(1, len({row["protocol"] for row in finished})))
            return _sorted_table(engine, rows)
        if pool is None:
            for function, arguments in tasks:
                rows.extend(function(engine, *arguments, candidates))
                report(_task_units(function, arguments))
            return _sorted_table(engine, rows)
        # The shared spaces' fits (a PCA) are submitted first and run beside the tasks
        # that do not need them; the tasks that do wait for the fit. Then the
        # per-perturbation views of dataset-scope protocols against the control, so
        # that they are computed in parallel, not in one task.
        warm: list[cf.Future[Any]] = []
        futures: dict[cf.Future[list[dict[str, Any]]], int] = {}
        completed: queue.SimpleQueue[cf.Future[list[dict[str, Any]]]] = queue.SimpleQueue()
        try:
            warm += [
                pool.submit(_fit_task, engine, space, condition)
                for space, condition in _shared_space_fits(engine, protocols)
            ]
            warm += [
                pool.submit(_warm_task, engine, protocol, condition, candidates)
                for protocol in protocols
                if protocol.scope == "dataset"
                and protocol.representation in CONTROL_REPRESENTATIONS
                for condition in engine.scored_conditions().tolist()
            ]
            for function, arguments in tasks:
                submitted = pool.submit(function, engine, *arguments, candidates)
                futures[submitted] = _task_units(function, arguments)
                submitted.add_done_callback(completed.put)
            for _ in futures:
                finished_task = _next_completed(completed)
                rows.extend(finished_task.result())
                report(futures[finished_task])
            for done in warm:
                done.result()
        except BaseException:
            # Interrupted (Ctrl-C) or failed: queued tasks must not run on after the caller
            # has given up; running ones are abandoned to finish on their own.
            for pending in [*warm, *futures]:
                pending.cancel()
            if owned:
                pool.shutdown(wait=False, cancel_futures=True)
            raise
        if owned:
            pool.shutdown()
        return _sorted_table(engine, rows)


def _ordered_tasks(engine: Engine, protocols: Sequence[Protocol]) -> list[Task]:
    """The run's tasks, those that need no shared space first."""
    ordered: list[tuple[tuple[bool, str, int, int], Task]] = []
    grouped: dict[tuple[bool, str], list[Protocol]] = {}
    for index, protocol in enumerate(protocols):
        # Tasks that need no shared space run first, beside the fits of those spaces.
        later = not space_is_per_condition(protocol.space)
        if protocol.scope == "dataset":
            # Those waiting for a large fit last: they would hold the others back.
            rank = index + (len(protocols) if space_has_large_fit(protocol.space) else 0)
            for covariate in _scored_groups(engine):
                key = (later, "", rank, covariate)
                ordered.append((key, (_dataset_task, (protocol, covariate))))
        elif protocol.representation in ("population", "de"):
            grouped.setdefault((later, protocol.space), []).append(protocol)
        else:
            for condition in engine.scored_conditions().tolist():
                key = (later, "", index, condition)
                ordered.append((key, (_perturbation_task, (protocol, condition))))
    # The population and DE protocols of one space run in one task per perturbation,
    # so that each source's cells are mapped to the space, its statistics (a sample
    # without the perturbation's cells) computed and its pair sums taken once for all
    # of them, by one thread (another would wait for them), and then dropped.
    for (later, space), members in grouped.items():
        for condition in engine.scored_conditions().tolist():
            key = (later, space, condition, 0)
            ordered.append((key, (_protocols_task, (tuple(members), condition))))
    return [task for _, task in sorted(ordered, key=lambda item: item[0])]


def _next_completed(completed: queue.SimpleQueue[cf.Future[Any]]) -> cf.Future[Any]:
    # Waits in short steps so that Ctrl-C is seen at once.
    while True:
        with contextlib.suppress(queue.Empty):
            return completed.get(timeout=0.5)


def _shared_space_fits(engine: Engine, protocols: Sequence[Protocol]) -> list[tuple[str, int]]:
    """(space, condition) pairs that fit each shared space once per covariate group."""
    first_of_group: dict[int, int] = {}
    for condition in engine.scored_conditions().tolist():
        first_of_group.setdefault(engine.covariate_index(condition), condition)
    shared = [space for space in {p.space for p in protocols} if not space_is_per_condition(space)]
    # Large fits first: the cheap ones then never wait behind one for the lock.
    shared.sort(key=lambda space: (not space_has_large_fit(space), space))
    return [(space, condition) for space in shared for condition in first_of_group.values()]


def _fit_task(engine: Engine, space: str, condition: int) -> None:
    # Large fits (a PCA's Gram matrix, 115 MB for 5,000 genes, held for seconds) run
    # one at a time. A cheap shared space (a gene selection) takes no lock: waiting
    # for it behind a fit would idle a worker for the whole fit.
    large = space_has_large_fit(space)
    with engine.threads.large_fit_lock if large else contextlib.nullcontext():
        # Undefined: the tasks record the reason for every perturbation of the group.
        with contextlib.suppress(DegenerateInput):
            resolve_space(engine, space, condition)


#: More threads than this rarely pay: tasks then wait on memory bandwidth.
MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """Threads used when the caller does not choose: the CPU cores this process may use.

    Returns
    -------
    int
        :func:`scperteval.kernels.threads.available_cores`, at most
        :data:`MAX_DEFAULT_WORKERS`.

    """
    return max(1, min(available_cores(), MAX_DEFAULT_WORKERS))


def resolve_workers(workers: int | None) -> int:
    """``workers``, or :func:`default_workers` for ``None``; an error below 1.

    Parameters
    ----------
    workers
        Threads asked for, or ``None``.

    Returns
    -------
    int
        The number of threads to use.

    Raises
    ------
    ValueError
        If ``workers`` is below 1.

    """
    if workers is None:
        return default_workers()
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise SpecError(f"workers must be a whole number of at least 1, got {workers!r}")
    return int(workers)


def group_statistics(engine: Engine, executor: Any = None) -> GroupStats:
    """The dataset's group statistics: on the cluster's workers when ``executor`` is a client.

    Parameters
    ----------
    engine
        Shared data of the dataset.
    executor
        A :class:`distributed.Client` computes one partial summary per chunk on its
        workers (see :mod:`scperteval.engine.distributed`); anything else (or
        ``None``) makes one local pass. The values are identical either way.

    Returns
    -------
    GroupStats
        ``engine.context.group_stats``.

    """
    if is_dask_client(executor):
        from scperteval.engine.distributed import cluster_session

        return cluster_session(executor, engine).group_stats(engine)
    return engine.context.group_stats


def _sorted_table(engine: Engine, rows: list[dict[str, Any]]) -> pd.DataFrame:
    # The populations the cap cut travel with the rows, so that a run on a cluster
    # records them in the caller's engine as a local run does.
    for row in rows:
        engine.subsampled_populations.update(row.pop(_SUBSAMPLED, ()))
    table = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    return table.sort_values(
        ["protocol", "covariate", "perturbation", "source", "source_name"], kind="stable"
    ).reset_index(drop=True)


def _task_units(function: Callable[..., Any], arguments: tuple[Any, ...]) -> int:
    """How many of :func:`task_count`'s tasks one task of the run stands for."""
    return len(arguments[0]) if function is _protocols_task else 1


def _protocols_task(
    engine: Engine,
    protocols: Sequence[Protocol],
    condition: int,
    candidates: Sequence[Candidate],
) -> list[dict[str, Any]]:
    """The rows of several protocols of one space for one perturbation, in turn."""
    # The space is resolved once for all of them (a per-perturbation gene selection
    # is not cached by the engine: it would be kept for every perturbation), and so
    # is each source's DE view, which every DE metric ranks the same way.
    shared: dict[Hashable, Any] = {}
    return [
        row
        for protocol in protocols
        for row in _perturbation_task(engine, protocol, condition, candidates, shared)
    ]


def _perturbation_task(
    engine: Engine,
    protocol: Protocol,
    condition: int,
    candidates: Sequence[Candidate],
    shared: dict[Hashable, Any] | None = None,
) -> list[dict[str, Any]]:
    engine.threads.wait_for_cores()
    shared = {} if shared is None else shared
    # Registered sources are fixed for the engine: sums over their cells may be shared.
    named = [(c.role, *c.resolve(protocol), c.getter is None) for c in candidates]
    subsampled: list[Subsampled] = []

    def capped(name: str, source: Any, records: list[Subsampled]) -> Any:
        # Population protocols see at most the engine's cap of cells of each population.
        if protocol.representation == "population":
            source, record = cap_source(engine, condition, name, source)
            if record is not None:
                records.append(record)
        return source

    def view(identity: Hashable, source: Any, own: Any, key: Hashable | None) -> object:
        if protocol.representation != "de":
            return make_view(engine, protocol, condition, source, space, own, key)
        # A DE view depends on the source and the space only (not on the centering).
        cached = ("de view", protocol.space, identity)
        if cached not in shared:
            shared[cached] = make_view(engine, protocol, condition, source, space, own, key)
        return shared[cached]

    try:
        if ("space", protocol.space) not in shared:
            shared["space", protocol.space] = resolve_space(engine, protocol.space, condition)
        space = shared["space", protocol.space]
        reference = centering_vector(engine, protocol.centering, condition)
        truth_source = capped("truth", engine.source("truth", condition), subsampled)
        truth_view = view("truth", truth_source, reference, "truth")
        ctx = metric_context(engine, protocol, condition, space)
    except Exception as exc:  # noqa: BLE001 - recorded as NaN with its reason
        reason = _failure(exc)
        return [
            _row(engine, condition, protocol, role, name, math.nan, reason)
            for role, name, _, _ in named
        ]
    rows = []
    for role, name, getter, registered in named:
        cut: list[Subsampled] = []
        try:
            source = capped(name, getter(engine, condition), cut)
            own = candidate_reference(protocol.centering, source, reference)
            key = _candidate_key(protocol, name, getter, registered)
            fast = population_value(
                engine,
                protocol,
                condition,
                space,
                own,
                truth_view,
                source,
                cache_key=name if registered else None,
                view_key=key,
            )
            if fast is None:
                identity = candidate_identity(name, getter, registered)
                fast = protocol.metric(truth_view, view(identity, source, own, key), ctx)
            value = float(fast)
            reason = "" if math.isfinite(value) else UNDEFINED_REASON
        except Exception as exc:  # noqa: BLE001 - recorded as NaN with its reason
            value, reason = math.nan, _failure(exc)
        row = _row(engine, condition, protocol, role, name, value, reason)
        row[_SUBSAMPLED] = (*subsampled, *cut)
        rows.append(row)
    return rows


def _warm_task(
    engine: Engine, protocol: Protocol, condition: int, candidates: Sequence[Candidate]
) -> None:
    """Compute (and cache) one condition's views of a dataset-scope protocol.

    Views against the control are cached per source and condition, so the
    dataset task then only reads them. A failure is left for that task to record.
    """
    engine.threads.wait_for_cores()
    named = [("truth", "truth", lambda e, k: e.source("truth", k), True)]
    named += [(c.role, *c.resolve(protocol), c.getter is None) for c in candidates]
    try:
        space = resolve_space(engine, protocol.space, condition)
    except Exception:  # noqa: BLE001 - recorded by the dataset task
        return
    for _, name, getter, registered in named:
        # A failure is recorded by the dataset task.
        with contextlib.suppress(Exception):
            key = _candidate_key(protocol, name, getter, registered)
            make_view(engine, protocol, condition, getter(engine, condition), space, None, key)


def _dataset_task(
    engine: Engine, protocol: Protocol, covariate: int, candidates: Sequence[Candidate]
) -> list[dict[str, Any]]:
    # One dataset-scope task at a time (the run's lock). Such a task stacks every
    # perturbation's vectors (truth and candidate); two at once double that memory and
    # gain no time, being bound by the interpreter and memory bandwidth (four rank
    # protocols on 500 perturbations x 5,000 genes: 2.6 s on one thread, 2.9 s on two).
    # It may run beside a large fit: its stacks are used where they lie (about 45 MB
    # there), and it then fills a core the fit's one-threaded steps leave idle.
    engine.threads.wait_for_cores()
    with engine.threads.dataset_task_lock:
        return dataset_rows(engine, protocol, covariate, candidates)
