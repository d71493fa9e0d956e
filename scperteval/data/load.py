"""Opening a dataset from the options every entry point shares.

:func:`load_dataset` takes the data in any accepted form (an AnnData, an
``.h5ad`` path or an open :class:`~scperteval.data.dataset.Dataset`) and the
reading options of :class:`DatasetOptions`, so that the entry points list those
options once rather than each repeating them.

A file may hold several screens (datasets, cell lines, conditions) that reuse
the same perturbation labels, each with its own control cells. Read as one
screen, the cells of ``MAPK1`` in one are averaged with those in another and
compared with a control mean of both: the scores and the trust verdicts then
describe neither screen. :func:`pooled_columns` finds the ``obs`` columns that
split the evaluated cells so, and :func:`check_pooling` stops the run with the
two ways to evaluate them apart (or ``pool=True`` to pool them knowingly).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, Unpack

import numpy as np
import pandas as pd

from scperteval.data.dataset import Dataset
from scperteval.data.labels import listing
from scperteval.errors import DatasetError, SpecError
from scperteval.registry import did_you_mean

__all__ = ["DATASET_OPTIONS", "DatasetOptions", "check_pooling", "load_dataset", "pooled_columns"]


class DatasetOptions(TypedDict, total=False):
    """How to read a perturbation dataset; see :class:`~scperteval.data.dataset.Dataset`.

    Every key is optional and defaults as for :class:`~scperteval.data.dataset.Dataset`:
    ``perturbation_key`` (``"perturbation"``), ``control_label`` (``"control"``),
    ``covariate_key``, ``layer``, ``min_cells`` (4), ``normalize``, ``subset``,
    ``backed`` (``"auto"``) and ``chunk_cells``; ``pool`` (``False``) evaluates
    cells that an ``obs`` column splits into screens sharing perturbation labels
    as one screen instead of refusing them (:func:`check_pooling`).
    """

    perturbation_key: str
    control_label: str
    covariate_key: str | None
    layer: str | None
    min_cells: int
    normalize: bool
    subset: Mapping[str, Any] | None
    backed: bool | str
    chunk_cells: int | None
    pool: bool


#: The names of the reading options, in the order of :class:`DatasetOptions`.
DATASET_OPTIONS: tuple[str, ...] = tuple(DatasetOptions.__annotations__)

# Options a Dataset keeps unchanged as attributes, so an open Dataset can be checked
# against them; the others are normalised when the Dataset is built.
_COMPARABLE = ("perturbation_key", "control_label", "covariate_key", "layer", "min_cells")


def load_dataset(data: Any, **options: Unpack[DatasetOptions]) -> Dataset:
    """Open and validate a perturbation dataset.

    Parameters
    ----------
    data
        An :class:`anndata.AnnData`, a path to an ``.h5ad`` file, or a
        :class:`~scperteval.data.dataset.Dataset` (returned as it is).
    **options
        How to read it: the keys of :class:`DatasetOptions`
        (``perturbation_key``, ``control_label``, ``covariate_key``, ``layer``,
        ``min_cells``, ``normalize``, ``subset``, ``backed``, ``chunk_cells``,
        ``pool``).

    Returns
    -------
    Dataset
        The validated dataset.

    Raises
    ------
    TypeError
        For an option that does not exist (with the closest name).
    SpecError
        If ``data`` is an open Dataset read with different options.
    DatasetError
        If the data cannot be evaluated as given, or (without ``pool=True``) an
        ``obs`` column splits its cells into screens that reuse the same labels.

    Examples
    --------
    >>> import scperteval
    >>> adata = scperteval.simulate(n_perturbations=3, n_genes=20, seed=1)
    >>> scperteval.load_dataset(adata, perturbation_key="perturbation").n_genes
    20

    """
    given: dict[str, Any] = dict(options)
    unknown = [name for name in given if name not in DATASET_OPTIONS]
    if unknown:
        hint = did_you_mean(unknown[0], list(DATASET_OPTIONS))
        raise TypeError(f"unknown dataset option {unknown[0]!r}{hint}")
    pool = given.pop("pool", False)
    if not isinstance(pool, bool):
        raise SpecError(f"pool must be True or False, got {pool!r}")
    if isinstance(data, Dataset):
        for name in _COMPARABLE:
            if name in given and given[name] != getattr(data, name):
                raise SpecError(
                    f"{name}={given[name]!r} differs from the open Dataset's "
                    f"{getattr(data, name)!r}; pass reading options to Dataset(...) instead"
                )
        dataset = data
    else:
        dataset = Dataset(data, **given)
    if not pool:
        check_pooling(dataset)
    return dataset


#: Columns with more distinct values than this among the cells are identifiers
#: (cell barcodes, guides), not screens.
MAX_GROUPS = 50


class PooledColumn:
    """An ``obs`` column whose values split a covariate group into screens.

    Parameters
    ----------
    column
        The column's name.
    values
        Its values that hold control cells and share perturbation labels, sorted.
    shared
        Perturbation labels found in at least two of those values, sorted.

    """

    def __init__(self, column: str, values: list[str], shared: list[str]) -> None:
        self.column = column
        self.values = values
        self.shared = shared


def pooled_columns(dataset: Any) -> list[PooledColumn]:
    """The ``obs`` columns that split the evaluated cells into screens sharing labels.

    A column is reported when, within one covariate group, at least two of its
    values each hold control cells (2 or more) and at least one perturbation label
    has ``min_cells`` cells under two of them. The perturbation and covariate
    columns and the columns of ``subset`` are not examined.

    Parameters
    ----------
    dataset
        A :class:`~scperteval.data.dataset.Dataset`.

    Returns
    -------
    list of PooledColumn
        In the order of the ``obs`` columns; empty when nothing is pooled.

    """
    skipped = {dataset.perturbation_key, dataset.covariate_key, *dataset.subset}
    obs = dataset.adata.obs
    labels = dataset.perturbation_labels
    covariates = dataset.covariate_labels
    is_control = labels == dataset.control_label
    found = []
    for column in obs.columns:
        values = obs[column]
        if column in skipped or pd.api.types.is_float_dtype(values):
            continue
        kept = values.iloc[dataset.cell_index].astype(str).to_numpy()
        if not 2 <= len(set(kept.tolist())) <= MAX_GROUPS:
            continue
        pooled = _pooled_in_groups(kept, labels, covariates, is_control, dataset.min_cells)
        if pooled is not None:
            found.append(PooledColumn(str(column), *pooled))
    return found


def _pooled_in_groups(
    values: np.ndarray,
    labels: np.ndarray,
    covariates: np.ndarray,
    is_control: np.ndarray,
    min_cells: int,
) -> tuple[list[str], list[str]] | None:
    """The values holding controls and the labels they share, in the first group with both."""
    frame = pd.DataFrame({"covariate": covariates, "value": values, "label": labels})
    for _, group in frame.groupby("covariate", sort=True):
        controls = group[is_control[group.index]]["value"].value_counts()
        with_controls = sorted(str(v) for v, n in controls.items() if n >= 2)
        if len(with_controls) < 2:
            continue
        perturbed = group[~is_control[group.index] & group["value"].isin(with_controls)]
        counts = perturbed.groupby(["label", "value"]).size()
        enough = counts[counts >= min_cells].reset_index()
        per_label = enough.groupby("label")["value"].nunique()
        shared = sorted(str(label) for label, n in per_label.items() if n >= 2)
        if shared:
            holding = sorted(set(enough["value"].astype(str)) & set(with_controls))
            return holding, shared
    return None


def check_pooling(dataset: Any) -> None:
    """Refuse a dataset whose cells pool several screens under the same labels.

    Parameters
    ----------
    dataset
        A :class:`~scperteval.data.dataset.Dataset`.

    Raises
    ------
    DatasetError
        Naming the first column found, its screens, labels they share, and the
        fixes: ``subset`` to one value, the column as ``covariate_key``, or ``pool``.

    """
    found = pooled_columns(dataset)
    if not found:
        return
    first = found[0]
    others = [p.column for p in found[1:]]
    also = f" (so do {listing(others)})" if others else ""
    raise DatasetError(
        f"obs column {first.column!r} splits the cells into {len(first.values)} groups "
        f"({listing(first.values, limit=3)}) that each hold control cells and share "
        f"perturbation labels ({listing(first.shared, limit=3)}){also}, which would be "
        f"scored as one screen; keep one with --subset {first.column}={first.values[0]} "
        f"(Python: subset={{{first.column!r}: {first.values[0]!r}}}), evaluate each "
        f"apart with --covariate-key {first.column} (covariate_key={first.column!r}), or "
        "pool them with --pool (pool=True)"
    )
