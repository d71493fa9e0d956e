"""The per-population cell cap of population protocols.

Energy distance, MMD and Sinkhorn compare two clouds of cells, and their cost
grows with the product of the clouds' sizes: Sinkhorn holds ``n x m`` cost
matrices, the fast path's stored pairs ``4 n^2`` bytes. A population protocol
therefore sees at most ``max_population_cells`` cells of each population (the
truth, the technical duplicate, the other-cells and control-cells samples, a
model's predicted cells), as scPerturBench subsamples each population to 2,000
cells before its distribution distances.

The rule, written so that a reader can reproduce it: a population of ``n`` cells,
in their order in the dataset (ascending positions; a model's cells in the order
of its rows), with ``n > cap`` keeps the cells at the indices

    ``numpy.sort(numpy.random.default_rng(derive_seed(seed, "population",
    covariate, perturbation, source)).choice(n, cap, replace=False))``

where :func:`~scperteval.data.halves.derive_seed` hashes the run seed with the
names, ``covariate`` is the covariate group's name (``"all"`` without a
covariate column) and ``source`` the candidate's name (``"truth"``, a source
such as ``"technical_duplicate"``, or a model's name). The draw depends on
nothing else, so the same cells are used by every protocol, for any number of
workers, and whether a protocol runs alone or in a suite. A population of at most
``cap`` cells is used whole, exactly as without a cap. Centroid, DE and rank
protocols always use every cell: their cost is linear in the cells.
"""

from __future__ import annotations

import numbers
from collections import Counter
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from scperteval.context import Context
from scperteval.data.halves import derive_seed
from scperteval.engine.sources import SourceData
from scperteval.errors import SpecError

__all__ = [
    "DEFAULT_MAX_POPULATION_CELLS",
    "NO_CAP",
    "cap_source",
    "check_max_population_cells",
    "population_subset",
    "subsampled_summary",
]

#: Cells a population protocol uses of each population, by default (scPerturBench's 2,000).
DEFAULT_MAX_POPULATION_CELLS = 2000
#: The word that turns the cap off (``--max-population-cells all``).
NO_CAP = "all"
#: Smallest cap: the unbiased estimates need two cells of each population.
MIN_POPULATION_CELLS = 2

#: A subsampled population: (covariate, perturbation, source, cells before the cap).
Subsampled = tuple[str, str, str, int]


class CapEngine(Protocol):
    """What :func:`cap_source` reads of the run's engine."""

    context: Context
    max_population_cells: int | None

    @property
    def seed(self) -> int:
        """The run's seed."""
        ...  # pragma: no cover


def check_max_population_cells(value: Any) -> int | None:
    """The cap as a number of cells, or ``None`` for no cap; an error for anything else.

    Parameters
    ----------
    value
        A whole number of at least 2 (or such a number written as text), ``None``
        or ``"all"`` (no cap).

    Returns
    -------
    int or None
        The cap.

    Raises
    ------
    SpecError
        For zero, negative or fractional numbers, booleans and other text.

    Examples
    --------
    >>> check_max_population_cells("all") is None
    True
    >>> check_max_population_cells("500")
    500

    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == NO_CAP:
            return None
        if text.isdigit():
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SpecError(
            f"max_population_cells must be a whole number of at least {MIN_POPULATION_CELLS} "
            f"or {NO_CAP!r} (no cap), got {value!r}"
        )
    if value < MIN_POPULATION_CELLS:
        raise SpecError(
            f"max_population_cells must be at least {MIN_POPULATION_CELLS} "
            f"(or {NO_CAP!r} for no cap), got {value}"
        )
    return int(value)


def population_subset(
    seed: int, covariate: str, perturbation: str, source: str, n_cells: int, cap: int | None
) -> np.ndarray | None:
    """Indices of the cells a population protocol keeps of one population.

    Parameters
    ----------
    seed
        The run's seed.
    covariate, perturbation, source
        The population's identity: covariate group name, perturbation label and
        candidate name.
    n_cells
        The population's size.
    cap
        At most this many cells are kept; ``None`` keeps all.

    Returns
    -------
    numpy.ndarray or None
        ``cap`` sorted indices into ``range(n_cells)`` drawn without replacement
        (the rule of this module), or ``None`` when the population is kept whole.

    """
    if cap is None or n_cells <= cap:
        return None
    rng = np.random.default_rng(derive_seed(seed, "population", covariate, perturbation, source))
    return np.sort(rng.choice(n_cells, cap, replace=False))


def cap_source(
    engine: CapEngine, condition: int, name: str, source: SourceData
) -> tuple[SourceData, Subsampled | None]:
    """The cells of a source that a population protocol sees, under the engine's cap.

    Parameters
    ----------
    engine
        The run's engine (its seed and ``max_population_cells``).
    condition
        Condition index (gives the covariate group and perturbation names).
    name
        The candidate's name (``"truth"``, a source or a model).
    source
        The candidate's data.

    Returns
    -------
    tuple
        ``(source, record)``: ``source`` itself when it has at most the cap's cells
        (or none), else a copy whose cells (``positions``, ``rows`` and ``sample``
        alike) are the chosen subset; its ``centroid`` and ``moments`` stay those
        of all the cells, which population views do not read. ``record`` is
        ``(covariate, perturbation, name, cells before the cap)`` for a subsampled
        population, else ``None``.

    """
    if source.rows is not None:
        n_cells = int(source.rows.shape[0])
    elif source.positions is not None:
        n_cells = int(source.positions.size)
    else:
        return source, None
    target = engine.context.layout.conditions[condition]
    keep = population_subset(
        engine.seed,
        target.covariate,
        target.perturbation,
        name,
        n_cells,
        engine.max_population_cells,
    )
    if keep is None:
        return source, None
    changes: dict[str, Any] = {"moments": None}
    if source.rows is not None:
        changes["rows"] = source.rows[keep]
    if source.positions is not None:
        changes["positions"] = source.positions[keep]
    if source.sample is not None and source.rows is None:
        covariate, index = source.sample
        changes["sample"] = (covariate, index[keep])
    return replace(source, **changes), (target.covariate, target.perturbation, name, n_cells)


def subsampled_summary(cap: int | None, subsampled: set[Subsampled]) -> dict[str, Any]:
    """What ``run.json`` records of the cap: its value and the populations it cut.

    Parameters
    ----------
    cap
        The run's ``max_population_cells`` (``None``: no cap).
    subsampled
        The populations subsampled during the run.

    Returns
    -------
    dict
        ``max_population_cells`` (a number, or ``"all"``), ``n_subsampled``,
        ``by_source`` (counts per candidate name) and ``populations`` (one entry per
        subsampled population with its size before the cap), sorted.

    """
    ordered = sorted(subsampled)
    by_source = Counter(source for _, _, source, _ in ordered)
    return {
        "max_population_cells": NO_CAP if cap is None else int(cap),
        "n_subsampled": len(ordered),
        "by_source": dict(sorted(by_source.items())),
        "populations": [
            {"covariate": c, "perturbation": p, "source": s, "cells": n} for c, p, s, n in ordered
        ],
    }
