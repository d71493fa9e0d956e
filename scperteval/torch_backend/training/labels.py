"""From a batch's perturbation (and covariate) labels to condition indices."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import torch

from scperteval.data.labels import unmatched_listing
from scperteval.errors import SpecError
from scperteval.torch_backend.weights import _ConditionIndex

__all__ = ["ConditionLabels", "is_missing"]


def is_missing(label: Any) -> bool:
    """Whether a label marks a row to skip (``None``, NaN, ``pd.NA``)."""
    if label is None:
        return True
    if isinstance(label, float) and math.isnan(label):
        return True
    return label is pd.NA or label is pd.NaT


class ConditionLabels:
    """Condition indices of labels, for the conditions of a plan.

    Parameters
    ----------
    covariates, perturbations
        Per condition, its covariate group and perturbation label.
    ignored
        Labels whose rows are skipped (index ``-1``).

    """

    def __init__(
        self, covariates: Sequence[str], perturbations: Sequence[str], ignored: Iterable[str] = ()
    ) -> None:
        self.n_conditions = len(perturbations)
        self._ignored = frozenset(map(str, ignored))
        index = _ConditionIndex(list(zip(covariates, perturbations, strict=True)))
        self._index, self._by_label = index.by_pair, index.by_name

    def __call__(self, perturbations: Any, covariates: Any = None) -> torch.Tensor:
        """Condition indices of a batch's labels, as :meth:`PerturbationMetrics.condition_index`."""
        if isinstance(perturbations, torch.Tensor) and not perturbations.is_floating_point():
            index = perturbations.to(torch.int64).reshape(-1)
            if index.numel() and int(index.max()) >= self.n_conditions:
                last = self.n_conditions - 1
                raise SpecError(f"condition index {int(index.max())} outside 0..{last}")
            return index
        labels = _label_list(perturbations, "perturbations")
        groups = None if covariates is None else _label_list(covariates, "covariates")
        if groups is not None and len(groups) != len(labels):
            raise SpecError(f"{len(groups)} covariates for {len(labels)} perturbation labels")
        found = []
        for row, label in enumerate(labels):
            if is_missing(label) or str(label) in self._ignored:
                found.append(-1)
                continue
            if groups is not None:
                if is_missing(groups[row]):
                    found.append(-1)
                    continue
                key = (str(groups[row]), str(label))
                if key not in self._index:
                    raise SpecError(f"unknown condition {key[1]!r} in covariate group {key[0]!r}")
                found.append(self._index[key])
                continue
            matches = self._by_label.get(str(label))
            if not matches:
                raise SpecError(
                    f"unknown perturbation {unmatched_listing([str(label)], list(self._by_label))}"
                )
            if len(matches) > 1:
                raise SpecError(
                    f"perturbation {label!r} occurs in {len(matches)} covariate groups; "
                    "pass covariates="
                )
            found.append(matches[0])
        return torch.tensor(found, dtype=torch.int64)


def _label_list(values: Any, name: str) -> list[Any]:
    """A batch's labels as a list; one label given as a string is a list of one, not letters."""
    if isinstance(values, (str, bytes)):
        return [values.decode() if isinstance(values, bytes) else values]
    if hasattr(values, "tolist"):
        listed = values.tolist()
        return listed if isinstance(listed, list) else [listed]
    if not isinstance(values, Iterable):
        raise SpecError(f"{name} must be a list of labels, got {type(values).__name__}")
    return list(values)
