"""Opening a dataset from the options every entry point shares.

:func:`load_dataset` takes the data in any accepted form (an AnnData, an
``.h5ad`` path or an open :class:`~scperteval.data.dataset.Dataset`) and the
reading options of :class:`DatasetOptions`, so that the entry points list those
options once rather than each repeating them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, Unpack

from scperteval.data.dataset import Dataset
from scperteval.data.pooling import check_pooling
from scperteval.errors import SpecError
from scperteval.registry import did_you_mean

__all__ = ["DATASET_OPTIONS", "DatasetOptions", "load_dataset"]


class DatasetOptions(TypedDict, total=False):
    """How to read a perturbation dataset; see :class:`~scperteval.data.dataset.Dataset`.

    Every key is optional and defaults as for :class:`~scperteval.data.dataset.Dataset`:
    ``perturbation_key`` (``"perturbation"``), ``control_label`` (``"control"``),
    ``covariate_key``, ``layer``, ``min_cells`` (4), ``normalize``, ``subset``,
    ``backed`` (``"auto"``) and ``chunk_cells``; ``pool`` (``False``) evaluates
    cells that an ``obs`` column splits into screens sharing perturbation labels
    as one screen instead of refusing them (:func:`~scperteval.data.pooling.check_pooling`).
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
