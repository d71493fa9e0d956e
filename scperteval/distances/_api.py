"""``pairwise`` and ``onesided``: distances between groups of cells.

Every distance function reads its cells from an AnnData, an ``.h5ad`` path or an
open :class:`~scperteval.data.dataset.Dataset` (:func:`distance_input`), with the
reading options of the other entry points that apply to groups of cells
(``layer``, ``covariate_key``, ``subset``, ``normalize``, ``backed``).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from scperteval.data.dataset import Dataset
from scperteval.data.h5ad import StoredAnnData
from scperteval.data.labels import listing
from scperteval.data.matrix_io import open_data
from scperteval.distances._base import Distance, Group, resolve_distance
from scperteval.distances._features import ALL, GroupedCells, group_cells
from scperteval.distances._kernel import PairKernelDistance
from scperteval.errors import DatasetError, ScpertevalWarning, SpecError
from scperteval.kernels.threads import available_cores

__all__ = ["distance_input", "onesided", "pairwise"]


def _groups_of(cells: GroupedCells) -> dict[str, Group]:
    """Every group shifted by the mean of all cells compared together."""
    arrays = [cells.cells[label] for label in cells.groups]
    total = sum(a.shape[0] for a in arrays)
    shift = sum(a.sum(axis=0) for a in arrays) / total if total else None
    return {label: Group(cells.cells[label], shift) for label in cells.groups}


def _pairwise_only(metric: Any, where: str) -> Distance:
    """The distance of ``metric``, refused if defined only over all groups at once."""
    distance = resolve_distance(metric)
    if hasattr(distance, "onesided_all"):
        raise SpecError(
            f"{distance.name} compares all groups at once: onesided() has it, {where}() not"
        )
    return distance


def _between(task: tuple[Distance, Group, Group]) -> float:
    measure, x, y = task
    return measure.between(x, y)


def _batchable(measure: Distance) -> bool:
    return isinstance(measure, PairKernelDistance) and measure.batched() and measure.symmetric


def _stack(measure: PairKernelDistance, groups: Sequence[Group]) -> tuple[np.ndarray, np.ndarray]:
    """The groups' cells one after the other, and the row where each starts (and the end)."""
    used = [measure.cells_of(g) for g in groups]
    stacked = np.vstack(used) if used else np.zeros((0, 0))
    offsets = np.concatenate([[0], np.cumsum([u.shape[0] for u in used])]).astype(np.int64)
    return stacked, offsets


def _batched_table(
    measure: PairKernelDistance, groups: Sequence[Group], n_jobs: int | None
) -> np.ndarray:
    """The symmetric table, each row's cross sums from one batched call."""
    stacked, offsets = _stack(measure, groups)
    count = len(groups)
    table = np.zeros((count, count))

    def row(i: int) -> None:
        first = int(offsets[i + 1])
        sums = measure.cross_sums(groups[i], stacked[first:], offsets[i + 1 : count] - first)
        for k, j in enumerate(range(i + 1, count)):
            table[i, j] = table[j, i] = measure.from_cross(float(sums[k]), groups[i], groups[j])

    with measure.threads.single_threaded_blas():
        _run(list(range(count)), row, n_jobs)
    return table


def _batched_column(
    measure: PairKernelDistance, groups: Sequence[Group], reference: Group
) -> list[float]:
    """``d(group, reference)`` for every group, the cross sums from one batched call."""
    stacked, offsets = _stack(measure, groups)
    with measure.threads.single_threaded_blas():
        sums = measure.cross_sums(reference, stacked, offsets[:-1], measure.threads)
    return [measure.from_cross(float(sums[k]), group, reference) for k, group in enumerate(groups)]


def check_n_jobs(n_jobs: Any) -> None:
    """Refuse a thread count that is not ``None`` or a whole number of at least 1.

    Parameters
    ----------
    n_jobs
        The ``n_jobs`` option of a distance function.

    Raises
    ------
    SpecError
        For 0, a negative or fractional number, a flag or a string.

    """
    if n_jobs is not None and (
        isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs < 1
    ):
        raise SpecError(f"n_jobs must be a whole number of at least 1 or None, got {n_jobs!r}")


def _run(tasks: Sequence[Any], function: Any, n_jobs: int | None) -> list[Any]:
    workers = available_cores() if n_jobs is None else int(n_jobs)
    if workers <= 1 or len(tasks) <= 1:
        return [function(task) for task in tasks]
    with cf.ThreadPoolExecutor(workers, thread_name_prefix="scperteval-distance") as pool:
        return list(pool.map(function, tasks))


def _prepare(distance: Distance, groups: Mapping[str, Group], n_jobs: int | None) -> None:
    for label, group in groups.items():
        if group.n < distance.min_cells:
            raise DatasetError(
                f"group {label!r} has {group.n} cell(s); {distance.name} needs at least "
                f"{distance.min_cells}"
            )
    single = [label for label, group in groups.items() if group.n == 1]
    if single:
        warnings.warn(
            f"{len(single)} group(s) of one cell: {listing(single, limit=5)}; their "
            f"{distance.name} rests on that cell alone",
            ScpertevalWarning,
            stacklevel=3,
        )
    _run(list(groups.values()), distance.prepare, n_jobs)


def _index(
    covariate_key: str | None, covariate: str, labels: Sequence[str], groupby: str
) -> pd.Index:
    if covariate_key is None:
        return pd.Index(list(labels), name=groupby)
    return pd.MultiIndex.from_product([[covariate], list(labels)], names=[covariate_key, groupby])


def _group_list(groups: Any) -> list[str] | None:
    """``groups`` as a list of labels: one label given as a string is a list of one."""
    if groups is None:
        return None
    if isinstance(groups, str):
        return [groups]
    if not isinstance(groups, (Sequence, np.ndarray, pd.Index, pd.Series)):
        kind = type(groups).__name__
        raise SpecError(f"groups must be a list of group labels or None, got {kind}")
    return [str(g) for g in groups]


def _compared(
    distance: Distance,
    data: Any,
    groupby: str,
    groups: Sequence[str] | None,
    reading: tuple[Any, ...],
    n_jobs: int | None,
    reference: str | None = None,
) -> Iterator[tuple[str | None, GroupedCells, dict[str, Group], Distance, list[str]]]:
    """Per covariate value, what every distance function compares, summaries prepared.

    ``reading`` holds the reading options of :func:`_reading` after ``data``. Yields the
    covariate column, the cells, their groups by label, the distance fitted on them and
    the labels of ``groups`` (all by default) that the covariate value has; the
    ``reference``, when given, is read and prepared too, and must have cells.
    """
    check_n_jobs(n_jobs)
    adata, options = _reading(data, *reading)
    groups = _group_list(groups)
    wanted = groups
    if reference is not None and groups is not None:
        wanted = list(dict.fromkeys([*map(str, groups), reference]))
    for cells in group_cells(adata, groupby, groups=wanted, **options):
        covariate_key = options["covariate_key"]
        if reference is not None and reference not in cells.cells:
            where = "" if cells.covariate == ALL else f" in {covariate_key}={cells.covariate!r}"
            raise DatasetError(f"reference group {reference!r} has no cell{where}")
        by_label = _groups_of(cells)
        # A data-driven parameter (a bandwidth) is resolved on the groups compared.
        fit = getattr(distance, "fit", None)
        measure = fit(list(by_label.values())) if fit is not None else distance
        labels = [g for g in cells.groups if groups is None or g in set(map(str, groups))]
        used = dict.fromkeys(labels if reference is None else [*labels, reference])
        _prepare(measure, {label: by_label[label] for label in used}, n_jobs)
        yield covariate_key, cells, by_label, measure, labels


def against_reference(
    distance: Distance,
    data: Any,
    groupby: str,
    reference: str,
    groups: Sequence[str] | None,
    reading: tuple[Any, ...],
    n_jobs: int | None,
    rows_of: Any,
    columns: list[str],
) -> pd.DataFrame:
    """One row per group tested against ``reference``, indexed like :func:`onesided`.

    ``rows_of(covariate, by_label, measure, labels)`` gives the rows (dicts over
    ``columns``) of ``labels``, the groups of one covariate value other than the
    reference; the other arguments are those of :func:`_compared`. The table's
    ``attrs`` name the distance and the reference.
    """
    rows: list[dict[str, Any]] = []
    keys: list[Any] = []
    covariate_key = reading[3]
    for covariate_key, cells, by_label, measure, labels in _compared(
        distance, data, groupby, groups, reading, n_jobs, reference
    ):
        others = [label for label in labels if label != reference]
        rows.extend(rows_of(cells.covariate, by_label, measure, others))
        keys.extend(o if covariate_key is None else (cells.covariate, o) for o in others)
    table = pd.DataFrame(rows, columns=columns)
    if covariate_key is None:
        table.index = pd.Index(keys, name=groupby)
    else:
        table.index = pd.MultiIndex.from_tuples(keys, names=[covariate_key, groupby])
    table.attrs.update({"metric": distance.name, "reference": reference})
    return table


def pairwise(
    adata: Any,
    groupby: str,
    metric: Any = "edistance",
    *,
    groups: Sequence[str] | None = None,
    obsm_key: str | None = None,
    layer: str | None = None,
    space: str | None = None,
    covariate_key: str | None = None,
    subset: Mapping[str, Any] | None = None,
    n_jobs: int | None = None,
    normalize: bool = False,
    backed: bool | str = "auto",
) -> pd.DataFrame:
    """Distance between every two groups of cells.

    Parameters
    ----------
    adata
        An :class:`anndata.AnnData`, a path to an ``.h5ad`` file, or a
        :class:`~scperteval.data.dataset.Dataset` (see :func:`distance_input`).
    groupby
        ``obs`` column of the group labels.
    metric
        A distance name (:data:`~scperteval.distances.DISTANCES`) or spec with options, e.g.
        ``"mmd(kernel='linear')"``, or a :class:`Distance`.
    groups
        The groups to compare, in this order (all by default, in order of appearance).
    obsm_key, layer, space
        The feature space (see :func:`~scperteval.distances.group_cells`): an
        ``obsm`` embedding, a layer, or ``"pca(k=50)"`` / ``"hvg(k=2000)"`` /
        ``"full"`` fitted on ``X`` (or ``layer``). By default ``obsm["X_pca"]`` when
        present, else ``"pca(k=50)"``.
    covariate_key
        Compare groups only within each value of this ``obs`` column.
    subset
        Keep only cells whose ``obs`` values match, e.g. ``{"dataset": "norman19"}``.
    n_jobs
        Threads (default: the cores available to scperteval's kernels).
    normalize
        ``normalize_total(1e4)`` then ``log1p`` of raw counts, as for ``calibrate``.
    backed
        For a path: ``True`` leaves the matrices on disk and reads the groups' rows,
        ``False`` loads the file, ``"auto"`` (default) leaves them on disk when the
        file is over a third of the available memory.

    Returns
    -------
    pandas.DataFrame
        Groups x groups, 0 on the diagonal; row ``x``, column ``y`` holds
        ``d(x, y)`` (both orders computed for asymmetric distances). With
        ``covariate_key``, the rows are indexed by (covariate, group) and groups
        absent from a covariate are NaN.

    Raises
    ------
    SpecError
        For an unknown distance, option or feature space.
    DatasetError
        For a missing column or group, too few cells, or non-finite values.

    Examples
    --------
    >>> import numpy as np, anndata as ad, pandas as pd
    >>> from scperteval.distances import pairwise
    >>> a = ad.AnnData(np.array([[0.0], [0.0], [3.0], [3.0]]))
    >>> a.obs["g"] = pd.Categorical(["a", "a", "b", "b"])
    >>> pairwise(a, "g", "euclidean", layer=None, space="full").loc["a", "b"]
    3.0

    """
    distance = _pairwise_only(metric, "pairwise")
    reading = (obsm_key, layer, space, covariate_key, subset, normalize, backed)
    frames = []
    for covariate_key, cells, by_label, measure, labels in _compared(
        distance, adata, groupby, groups, reading, n_jobs
    ):
        if _batchable(measure):
            table = _batched_table(measure, [by_label[g] for g in labels], n_jobs)  # type: ignore[arg-type]
        else:
            ordered = itertools.combinations if measure.symmetric else itertools.permutations
            pairs = list(ordered(range(len(labels)), 2))
            tasks = [(measure, by_label[labels[i]], by_label[labels[j]]) for i, j in pairs]
            table = np.zeros((len(labels), len(labels)))
            for (i, j), value in zip(pairs, _run(tasks, _between, n_jobs), strict=True):
                table[i, j] = value
                if measure.symmetric:
                    table[j, i] = value
        index = _index(covariate_key, cells.covariate, labels, groupby)
        frames.append(pd.DataFrame(table, index=index, columns=pd.Index(labels, name=groupby)))
    result = frames[0] if len(frames) == 1 else pd.concat(frames)
    if covariate_key is not None:
        order = list(dict.fromkeys(label for frame in frames for label in frame.columns))
        result = result.reindex(columns=order)
    result.attrs["metric"] = distance.name
    return result


def distance_input(data: Any, backed: bool | str = "auto") -> Any:
    """The AnnData the distances read from ``data``.

    Parameters
    ----------
    data
        An :class:`anndata.AnnData` (returned as is), a path to an ``.h5ad``
        file (opened by :func:`~scperteval.data.h5ad.open_h5ad`), or a
        :class:`~scperteval.data.dataset.Dataset` (its ``adata``).
    backed
        For a path, whether its matrices stay on disk (``True``, ``False`` or
        ``"auto"``, as for :class:`~scperteval.data.dataset.Dataset`).

    Returns
    -------
    anndata.AnnData
        With the file's embeddings (``obsm``) too, which only an AnnData holds: a
        file read by h5py is completed by anndata (its matrices shared, not read
        again); a backed one is opened by anndata in its backed mode.

    Raises
    ------
    DatasetError
        If ``data`` is of another type, or a path is missing or not a readable
        ``.h5ad`` file.

    """
    data = data.adata if isinstance(data, Dataset) else open_data(data, backed)
    return data.to_anndata() if isinstance(data, StoredAnnData) else data


def _reading(
    data: Any,
    obsm_key: str | None,
    layer: str | None,
    space: str | None,
    covariate_key: str | None,
    subset: Mapping[str, Any] | None,
    normalize: bool,
    backed: bool | str,
) -> tuple[Any, dict[str, Any]]:
    """The AnnData to read and the options of :func:`group_cells`.

    A Dataset's own ``layer``, ``covariate_key``, ``subset`` and ``normalize`` are
    used; another value given for one of them is refused.
    """
    names = ("layer", "covariate_key", "subset", "normalize")
    given = dict(zip(names, (layer, covariate_key, subset, normalize or None), strict=True))
    if isinstance(data, Dataset):
        own = (data.layer, data.covariate_key, data.subset or None, data.normalize or None)
        for (name, value), mine in zip(given.items(), own, strict=True):
            if value is not None and value != mine:
                raise SpecError(
                    f"{name}={value!r} differs from the Dataset's {mine!r}; "
                    "give the Dataset's reading options when opening it"
                )
        given = dict(zip(names, own, strict=True))
    options = {"obsm_key": obsm_key, "space": space, **given, "normalize": bool(given["normalize"])}
    return distance_input(data, backed), options


def onesided(
    adata: Any,
    groupby: str,
    reference: str,
    metric: Any = "edistance",
    *,
    groups: Sequence[str] | None = None,
    obsm_key: str | None = None,
    layer: str | None = None,
    space: str | None = None,
    covariate_key: str | None = None,
    subset: Mapping[str, Any] | None = None,
    n_jobs: int | None = None,
    normalize: bool = False,
    backed: bool | str = "auto",
) -> pd.Series:
    """Distance from every group to one reference group (e.g. the controls).

    Only the pairs (group, reference) are computed, and the reference's own
    summaries once.

    Parameters
    ----------
    adata, groupby, metric, obsm_key, layer, space, covariate_key, subset, n_jobs
        As for :func:`pairwise`.
    normalize, backed
        As for :func:`pairwise`.
    reference
        The reference group's label; with ``covariate_key`` it must have cells in
        every covariate value.
    groups
        The groups to measure (all by default); the reference is always read.

    Returns
    -------
    pandas.Series
        ``d(group, reference)`` per group, the reference itself at 0; indexed by
        group, or by (covariate, group) with ``covariate_key``.

    Raises
    ------
    SpecError
        For an unknown distance, option or feature space.
    DatasetError
        For a missing reference or group, too few cells, or non-finite values.

    """
    distance = resolve_distance(metric)
    if not isinstance(reference, (str, int, np.integer)):
        raise SpecError(f"reference must be one group label, got {type(reference).__name__}")
    reference = str(reference)
    reading = (obsm_key, layer, space, covariate_key, subset, normalize, backed)
    parts = []
    for covariate_key, cells, by_label, measure, labels in _compared(
        distance, adata, groupby, groups, reading, n_jobs, reference
    ):
        others = [label for label in labels if label != reference]
        joint = getattr(measure, "onesided_all", None)
        if joint is not None:
            value_of = joint(by_label, reference, others)
        else:
            ref = by_label[reference]
            if _batchable(measure):
                values = _batched_column(measure, [by_label[g] for g in others], ref)  # type: ignore[arg-type]
            else:
                values = _run([(measure, by_label[g], ref) for g in others], _between, n_jobs)
            value_of = dict(zip(others, values, strict=True))
        index = _index(covariate_key, cells.covariate, labels, groupby)
        parts.append(pd.Series([value_of.get(g, 0.0) for g in labels], index=index, dtype=float))
    result = parts[0] if len(parts) == 1 else pd.concat(parts)
    result.name = f"{distance.name} to {reference}"
    return result
