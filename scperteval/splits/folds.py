"""Seeded K-fold splits of a dataset's perturbations, drawn within each covariate group.

The algorithm, so that a split can be redrawn without scperteval:

1. The covariate groups are taken in sorted order, and within each group its
   perturbation labels in sorted order (Python's string order).
2. One generator, ``numpy.random.default_rng(seed)``, draws
   ``rng.permutation(n)`` for each group in turn (``n`` its number of
   perturbations); the group's labels are taken in that permuted order.
3. The labels are dealt round-robin to folds ``"0"``, ``"1"``, ..., ``"K-1"``. The
   deal continues across groups where the previous group stopped, so that every
   group's folds differ in size by at most one and so do the folds overall.

Every perturbation is in the test set of exactly one fold, and each fold trains on
the perturbations the other folds hold out (:meth:`Split.from_folds`).
Combinations (``A+B``) are dealt like any other perturbation; how many of their
singles a fold trains on is :meth:`Split.category`.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

from scperteval.data.dataset import ALL_COVARIATES, Dataset
from scperteval.errors import SpecError
from scperteval.splits.split import Perturbation, Split

__all__ = ["make_folds", "perturbations_of", "check_folds", "check_seed"]


def make_folds(dataset_or_labels: Any, folds: int = 5, seed: int = 0) -> Split:
    """K-fold split of the perturbations of each covariate group.

    Parameters
    ----------
    dataset_or_labels
        A :class:`~scperteval.data.dataset.Dataset` (its evaluated perturbations),
        or perturbations as labels (covariate ``"all"``) or ``(covariate, label)`` pairs.
    folds
        Number of folds ``K``, at least 2 and at most the number of perturbations
        of the smallest covariate group.
    seed
        Seed of the permutation (a whole number, at least 0).

    Returns
    -------
    Split
        Folds ``"0"`` .. ``"K-1"``, drawn as the module describes, with ``seed`` recorded.

    Raises
    ------
    SpecError
        On a number of folds or a seed that cannot be used.

    """
    check_seed(seed)
    groups = _by_covariate(perturbations_of(dataset_or_labels))
    check_folds(folds, groups)
    rng = np.random.default_rng(seed)
    fold_of: dict[Perturbation, str] = {}
    dealt = 0
    for covariate in sorted(groups):
        labels = sorted(groups[covariate])
        for position in rng.permutation(len(labels)):
            fold_of[(covariate, labels[position])] = str(dealt % folds)
            dealt += 1
    return Split.from_folds(fold_of, seed=int(seed), origin="generated")


def perturbations_of(dataset_or_labels: Any) -> list[Perturbation]:
    """``(covariate, label)`` of a dataset's perturbations, or of labels or pairs given.

    Parameters
    ----------
    dataset_or_labels
        As for :func:`make_folds`.

    Returns
    -------
    list of (str, str)
        The perturbations, without repeats, in the order given.

    Raises
    ------
    SpecError
        When nothing is given, or an item is neither a label nor a pair.

    """
    if isinstance(dataset_or_labels, Dataset):
        return [(c.covariate, c.perturbation) for c in dataset_or_labels.conditions]
    if isinstance(dataset_or_labels, (str, bytes)) or not isinstance(dataset_or_labels, Iterable):
        raise SpecError(
            "make_folds needs a Dataset or a list of perturbation labels, got "
            f"{type(dataset_or_labels).__name__} {dataset_or_labels!r}"
        )
    found: dict[Perturbation, None] = {}
    for item in dataset_or_labels:
        if isinstance(item, str):
            found[(ALL_COVARIATES, item)] = None
        elif isinstance(item, tuple) and len(item) == 2 and all(isinstance(v, str) for v in item):
            found[(item[0], item[1])] = None
        else:
            raise SpecError(
                f"make_folds: {item!r} is neither a perturbation label nor a "
                "(covariate, label) pair"
            )
    if not found:
        raise SpecError("make_folds: no perturbations to split")
    return list(found)


def check_seed(seed: Any) -> None:
    """Refuse a seed that is not a whole number of at least 0."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or int(seed) < 0:
        raise SpecError(f"the split's seed must be a whole number of at least 0, got {seed!r}")


def check_folds(folds: Any, groups: dict[str, list[str]]) -> None:
    """Refuse a number of folds below 2, or above the smallest group's perturbations."""
    if isinstance(folds, bool) or not isinstance(folds, numbers.Integral) or folds < 2:
        raise SpecError(
            f"the number of folds must be a whole number of at least 2, got {folds!r}; "
            "each fold trains on the perturbations the other folds hold out"
        )
    smallest = min(groups, key=lambda covariate: (len(groups[covariate]), covariate))
    if int(folds) > len(groups[smallest]):
        where = "" if smallest == ALL_COVARIATES else f" in covariate group {smallest!r}"
        raise SpecError(
            f"{folds} folds but only {len(groups[smallest])} perturbation(s){where}: "
            "some fold would hold none of them out; use at most "
            f"{len(groups[smallest])} folds"
        )


def _by_covariate(perturbations: Iterable[Perturbation]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for covariate, label in perturbations:
        groups.setdefault(covariate, []).append(label)
    return groups
