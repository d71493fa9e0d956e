"""A split's folds on a dataset's conditions: which are scored, and what each one trains on.

Under a split, every source that pools perturbations other than the evaluated one
(the dataset mean, the linear baseline, the samples of other perturbed cells) pools
the *training* perturbations of the fold that holds the evaluated one out, within
its covariate group, instead of all the others (see the science notes, "Scoring
under a split").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scperteval.data.layout import GroupLayout
from scperteval.splits.split import Split

__all__ = ["FoldPlan"]


@dataclass(frozen=True)
class FoldPlan:
    """A split resolved to condition indices.

    Attributes
    ----------
    split
        The split.
    fold_of
        Fold index of each condition (into ``split.folds``), -1 where no fold holds it out.
    training
        ``training[fold][covariate]``: sorted indices of the conditions of the group
        that the fold trains on.

    """

    split: Split
    fold_of: np.ndarray
    training: tuple[tuple[np.ndarray, ...], ...]

    @classmethod
    def build(cls, split: Split, layout: GroupLayout) -> FoldPlan:
        """Resolve ``split`` on ``layout``.

        Perturbations of the split that the layout lacks (left out for too few
        cells) are ignored; checking the split against the data is
        :func:`~scperteval.splits.reading.read_split`'s.
        """
        folds = split.folds
        names = [(c.covariate, c.perturbation) for c in layout.conditions]
        held_out = [split.fold_of(name) for name in names]
        fold_of = np.array([-1 if f is None else folds.index(f) for f in held_out], dtype=np.int64)
        groups = [layout.condition_covariate == c for c in range(len(layout.covariates))]
        training = []
        for fold in folds:
            trains = np.array([name in split.train[fold] for name in names], dtype=bool)
            per_group = [np.flatnonzero(trains & in_group) for in_group in groups]
            for members in per_group:
                members.flags.writeable = False
            training.append(tuple(per_group))
        fold_of.flags.writeable = False
        return cls(split, fold_of, tuple(training))

    def scored(self) -> np.ndarray:
        """Indices of the conditions some fold holds out (the ones scored)."""
        return np.flatnonzero(self.fold_of >= 0)

    def fold_name(self, condition: int) -> str:
        """The name of the fold that holds ``condition`` out."""
        return self.split.folds[self._fold(condition)]

    def training_of(self, condition: int, covariate: int) -> np.ndarray:
        """Training conditions of the fold holding ``condition`` out, in its group."""
        return self.training[self._fold(condition)][covariate]

    def _fold(self, condition: int) -> int:
        fold = int(self.fold_of[condition])
        if fold < 0:
            raise KeyError(f"condition {condition} is held out by no fold")
        return fold
