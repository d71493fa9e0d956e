"""Running a dataset's work on a ``dask.distributed`` cluster.

A :class:`ClusterSession` adapts a :class:`distributed.Client` to what
:func:`~scperteval.engine.dispatch.run_protocols` needs. What runs where:

- **Shipped once.** The engine (settings, the dataset's expression matrix or a
  backed file's name, and the cached values computed so far, such as the group
  layout) is scattered to every worker once (``broadcast=True``). Locks, the
  store of pairwise distances and progress callbacks stay behind and are made
  afresh on arrival (the ``__getstate__`` of :class:`~scperteval.engine.engine.Engine`,
  :class:`~scperteval.context.Context`, :class:`~scperteval.data.dataset.Dataset` and
  :class:`~scperteval._memo.Memo`). Before the protocols run, one more object is
  scattered once: the merged group statistics, the plan of shared pair sums and the
  candidates (model predictions included). Tasks receive both by reference.
- **Group statistics on the workers.** One task per chunk of
  :meth:`~scperteval.data.dataset.Dataset.chunk_slices` reads the chunk from the
  worker's copy of the data and returns its partial
  :class:`~scperteval.stats.groups.GroupStats`; the client folds them in chunk order with
  ``combine``, the fold of the local pass, so the statistics are bit for bit
  those of a local run.
- **Protocol tasks on the workers**, one per (protocol, perturbation) or
  (protocol, covariate group), as on a thread pool. The tasks of one perturbation
  prefer one worker (a loose restriction: another may take them when it is idle),
  so that the perturbation's derived data below is computed there only.
- **Derived data where it is used.** DE, PCA fits, cell samples and pair sums are
  computed lazily by each worker the first time one of its tasks asks, then
  shared by that worker's tasks. They are deterministic functions of the shipped
  data and the seed (every random choice is seeded from names, never from the
  worker or the order of tasks), so each worker computes the values a local run
  computes; the cost is that each worker computes them once.

dask and distributed are imported only here and only when a cluster is used.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scperteval.errors import ClusterError, MissingExtraError
from scperteval.stats.groups import GroupStats

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine

__all__ = ["ClusterSession", "cluster_session", "connect", "is_dask_client"]

#: A task of a run: the function and its arguments before the candidates.
Task = tuple[Callable[..., list[dict[str, Any]]], tuple[Any, ...]]

#: Start of the dask key of every protocol task.
_TASK_PREFIX = "protocol-task-"


def is_dask_client(executor: Any) -> bool:
    """Whether ``executor`` is a :class:`distributed.Client` (without importing distributed)."""
    module = sys.modules.get("distributed")
    return module is not None and isinstance(executor, module.Client)


def _distributed() -> Any:
    try:
        import dask  # noqa: F401 - checked with distributed: both are needed
        import distributed
    except ImportError:
        raise MissingExtraError(
            "running on a dask cluster (--scheduler / executor=Client)", "dask", "distributed"
        ) from None
    return distributed


def connect(address: str) -> Any:
    """A :class:`distributed.Client` connected to a running scheduler.

    Parameters
    ----------
    address
        The scheduler's address, e.g. ``tcp://10.0.0.5:8786``.

    Returns
    -------
    distributed.Client
        The connected client (close it when done).

    Raises
    ------
    MissingExtraError
        When dask or distributed is not installed.
    ClusterError
        When no scheduler answers at ``address``.

    """
    client_class = _distributed().Client
    try:
        return client_class(address)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterError(f"cannot connect to a dask scheduler at {address!r}: {exc}") from None


@dataclass(frozen=True)
class _RunInputs:
    """What protocol tasks need beyond the engine, shipped once per run."""

    group_stats: GroupStats
    pair_plan: dict[str, frozenset[Any]]
    candidates: Sequence[Any]


def _chunk_stats(engine: Engine, positions: slice) -> GroupStats:
    return engine.context.chunk_stats(positions)


def _protocol_task(
    function: Callable[..., list[dict[str, Any]]],
    engine: Engine,
    inputs: _RunInputs,
    arguments: tuple[Any, ...],
) -> list[dict[str, Any]]:
    engine.context.adopt_group_stats(inputs.group_stats)
    engine.pair_plan = inputs.pair_plan
    return function(engine, *arguments, inputs.candidates)


class ClusterSession:
    """One engine shipped to a dask cluster, and the runs on it.

    Parameters
    ----------
    client
        A connected :class:`distributed.Client`.
    engine
        The engine to ship; its group layout is computed first so that it travels.

    Notes
    -----
    The session keeps no reference to the engine (which keeps the session, see
    :func:`cluster_session`), only the future of the shipped copy.

    """

    def __init__(self, client: Any, engine: Engine) -> None:
        _distributed()
        self.client = client
        engine.context.layout  # noqa: B018 - computed here so that it is shipped, not redone
        self._engine = client.scatter(engine, broadcast=True, hash=False)

    @property
    def is_usable(self) -> bool:
        """Whether the client is still connected."""
        return str(getattr(self.client, "status", "")) == "running"

    def group_stats(self, engine: Engine) -> GroupStats:
        """The engine's group statistics, computed chunk by chunk on the workers.

        Parameters
        ----------
        engine
            The engine this session shipped (receives the merged statistics).

        Returns
        -------
        GroupStats
            Identical to ``engine.context.group_stats`` computed locally.

        """
        context = engine.context
        if context.has_group_stats:
            return context.group_stats
        chunks = context.dataset.chunk_slices()
        futures = [
            self.client.submit(_chunk_stats, self._engine, positions, pure=False)
            for positions in chunks
        ]
        total = GroupStats.empty(context.layout.n_groups, context.dataset.n_genes)
        # In chunk order, the fold of the local pass: the same sums in the same order.
        for positions, future in zip(chunks, futures, strict=True):
            total = total.combine(future.result())
            future.release()
            if context.progress is not None:
                context.progress(positions.stop, context.dataset.n_cells)
        context.adopt_group_stats(total)
        return context.group_stats

    def run(
        self,
        engine: Engine,
        tasks: Sequence[Task],
        candidates: Sequence[Any],
        conditions: Sequence[int | None],
    ) -> Iterator[list[dict[str, Any]]]:
        """Run protocol tasks on the workers; yield each one's rows as it finishes.

        Parameters
        ----------
        engine
            The engine this session shipped.
        tasks
            ``(function, arguments)``: each runs as ``function(engine, *arguments,
            candidates)`` on a worker.
        candidates
            What every task scores (shipped once).
        conditions
            The perturbation of each task (``None`` for a dataset-scope task): the
            tasks of one perturbation prefer the same worker. Task keys are
            ``protocol-task-{condition}-...``.

        Yields
        ------
        list of dict
            The rows of one task.

        """
        distributed = _distributed()
        inputs = _RunInputs(self.group_stats(engine), dict(engine.pair_plan), tuple(candidates))
        shipped = self.client.scatter(inputs, broadcast=True, hash=False)
        workers = sorted(self.client.scheduler_info().get("workers", {}))
        futures: list[Any] = []
        for (function, arguments), condition in zip(tasks, conditions, strict=True):
            placement: dict[str, Any] = {}
            if condition is not None and workers:
                # A perturbation's tasks go to one worker (others may still take them
                # when it is busy), so that its cells are read, mapped and tested
                # there once rather than once per worker.
                placement = {
                    "workers": [workers[condition % len(workers)]],
                    "allow_other_workers": True,
                }
            futures.append(
                self.client.submit(
                    _protocol_task,
                    function,
                    self._engine,
                    shipped,
                    arguments,
                    pure=False,
                    key=f"{_TASK_PREFIX}{condition if condition is not None else 'dataset'}-"
                    f"{len(futures)}-{uuid.uuid4().hex}",
                    **placement,
                )
            )
        try:
            for future in distributed.as_completed(futures):
                yield future.result()
        finally:
            # Stopped early (an error, or the caller gave up): drop what is still queued.
            self.client.cancel([future for future in futures if not future.done()])
            futures.clear()
            shipped.release()


def cluster_session(client: Any, engine: Engine) -> ClusterSession:
    """The session of ``engine`` on ``client``, shipping the engine on first use.

    Parameters
    ----------
    client
        A connected :class:`distributed.Client`.
    engine
        The engine whose tasks run on the cluster.

    Returns
    -------
    ClusterSession
        Shared by every call for the same engine and client, so the engine travels once.

    """
    session = engine.cluster_session
    if session is None or session.client is not client or not session.is_usable:
        session = engine.cluster_session = ClusterSession(client, engine)
    return session
