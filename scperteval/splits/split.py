"""Which perturbations each fold of a benchmark holds out, and which it trains on.

A perturbation is named by its covariate group and label, ``(covariate, label)``,
with the covariate ``"all"`` when the dataset has none (as in
:class:`~scperteval.data.layout.GroupLayout`). A fold holds out its *test*
perturbations and trains on its *training* perturbations; a perturbation is in
the test set of at most one fold. Perturbations of a fold that are neither
(a validation set) are kept out of both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from scperteval.data.dataset import COMBINATION_SEPARATOR
from scperteval.errors import SpecError

__all__ = ["Split", "Perturbation"]

#: ``(covariate, label)``: one perturbation of one covariate group.
Perturbation = tuple[str, str]


@dataclass(frozen=True)
class Split:
    """Test and training perturbations of every fold.

    Parameters
    ----------
    test
        ``{fold: perturbations held out by the fold}``; the folds' test sets are
        disjoint.
    train
        ``{fold: perturbations the fold trains on}``; disjoint from the fold's test set.
    seed
        The seed the folds were drawn with, or ``None`` for a split given by the user.
    origin
        Where the split comes from (a file name, ``"generated"`` or an ``obs`` column).

    Raises
    ------
    SpecError
        When the folds differ between ``test`` and ``train``, a perturbation is
        held out by two folds, or a fold trains on one of its test perturbations.

    """

    test: Mapping[str, frozenset[Perturbation]]
    train: Mapping[str, frozenset[Perturbation]]
    seed: int | None = None
    origin: str = "generated"
    _fold_of: dict[Perturbation, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if set(self.test) != set(self.train):
            raise SpecError("split: every fold needs both a test and a training set")
        fold_of: dict[Perturbation, str] = {}
        for fold, held_out in self.test.items():
            for perturbation in held_out:
                if perturbation in fold_of:
                    raise SpecError(
                        f"split: {_name(perturbation)} is in the test set of folds "
                        f"{fold_of[perturbation]!r} and {fold!r}; folds must not overlap"
                    )
                fold_of[perturbation] = fold
            overlap = held_out & self.train[fold]
            if overlap:
                raise SpecError(
                    f"split: fold {fold!r} trains on its own test perturbation "
                    f"{_name(min(overlap))}"
                )
        object.__setattr__(self, "_fold_of", fold_of)

    @classmethod
    def from_folds(
        cls,
        fold_of: Mapping[Perturbation, str],
        *,
        seed: int | None = None,
        origin: str = "generated",
    ) -> Split:
        """K-fold split: each fold trains on every perturbation the other folds hold out.

        Parameters
        ----------
        fold_of
            ``{(covariate, label): fold}`` for every perturbation.
        seed, origin
            As for :class:`Split`.

        Returns
        -------
        Split
            Training sets per covariate group: a fold trains on the other folds'
            perturbations of every group.

        """
        test: dict[str, set[Perturbation]] = {}
        for perturbation, fold in fold_of.items():
            test.setdefault(str(fold), set()).add(perturbation)
        everything = frozenset(fold_of)
        return cls(
            test={fold: frozenset(members) for fold, members in sorted(test.items())},
            train={fold: everything - members for fold, members in sorted(test.items())},
            seed=seed,
            origin=origin,
        )

    @classmethod
    def from_roles(cls, role_of: Mapping[Perturbation, str], *, origin: str = "user") -> Split:
        """A single train/validation/test split, as the one fold ``"test"``.

        Parameters
        ----------
        role_of
            ``{(covariate, label): "train" | "val" | "test"}``.
        origin
            As for :class:`Split`.

        Returns
        -------
        Split
            One fold that holds out the ``test`` perturbations and trains on the
            ``train`` ones; ``val`` perturbations are in neither.

        Raises
        ------
        SpecError
            On a role other than ``train``, ``val`` or ``test``.

        """
        roles: dict[str, set[Perturbation]] = {"train": set(), "val": set(), "test": set()}
        for perturbation, role in role_of.items():
            if role not in roles:
                raise SpecError(
                    f"split: {_name(perturbation)} has role {role!r}; "
                    "expected 'train', 'val' or 'test'"
                )
            roles[role].add(perturbation)
        return cls(
            test={"test": frozenset(roles["test"])},
            train={"test": frozenset(roles["train"])},
            origin=origin,
        )

    @property
    def folds(self) -> tuple[str, ...]:
        """Fold names, in order."""
        return tuple(self.test)

    def fold_of(self, perturbation: Perturbation) -> str | None:
        """The fold that holds ``perturbation`` out, or ``None`` when none does."""
        return self._fold_of.get(perturbation)

    def held_out(self) -> frozenset[Perturbation]:
        """Every perturbation some fold holds out."""
        return frozenset(self._fold_of)

    def category(self, fold: str, perturbation: Perturbation) -> int | None:
        """How many single perturbations of a combination ``A+B`` fold ``fold`` trains on.

        Parameters
        ----------
        fold
            A fold of the split.
        perturbation
            ``(covariate, label)``; a combination's singles are looked up in the
            same covariate group.

        Returns
        -------
        int or None
            ``0``, ``1`` or ``2`` for a two-perturbation combination (its singles
            "seen" in training: none, one, both); ``None`` for a single perturbation.

        Raises
        ------
        SpecError
            For a fold the split does not have.

        """
        if fold not in self.train:
            raise SpecError(f"split: no fold {fold!r}; folds: {', '.join(self.folds)}")
        covariate, label = perturbation
        singles = [part for part in label.split(COMBINATION_SEPARATOR) if part]
        if len(singles) < 2:
            return None
        return sum((covariate, single) in self.train[fold] for single in singles)

    def is_k_fold(self) -> bool:
        """Whether every fold trains on exactly the perturbations the other folds hold out."""
        everything = self.held_out()
        return all(self.train[fold] == everything - self.test[fold] for fold in self.folds)

    def to_frame(self) -> pd.DataFrame:
        """One row per perturbation and fold: ``covariate, perturbation, fold, role``."""
        rows = [
            (covariate, label, fold, role)
            for fold in self.folds
            for role, members in (("test", self.test[fold]), ("train", self.train[fold]))
            for covariate, label in sorted(members)
        ]
        return pd.DataFrame(rows, columns=["covariate", "perturbation", "fold", "role"])

    def digest(self) -> str:
        """SHA-256 of the split's content (folds, roles, members), independent of order."""
        canonical = {
            fold: {"test": sorted(self.test[fold]), "train": sorted(self.train[fold])}
            for fold in sorted(self.folds)
        }
        return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()

    def describe(self) -> dict[str, object]:
        """What ``run.json`` records of the split: origin, seed, folds and digest."""
        return {
            "origin": self.origin,
            "seed": self.seed,
            "folds": {fold: len(self.test[fold]) for fold in self.folds},
            "sha256": self.digest(),
        }


def _name(perturbation: tuple[str, ...]) -> str:
    covariate, label = perturbation
    return repr(label) if covariate == "all" else f"{label!r} ({covariate})"
