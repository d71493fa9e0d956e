"""The split model: folds, training sets, refusals and a content digest."""

from __future__ import annotations

import pytest

from scperteval.errors import SpecError
from scperteval.splits import Split


def _five_fold() -> Split:
    labels = [f"G{i}" for i in range(10)]
    return Split.from_folds({("all", g): str(i % 5) for i, g in enumerate(labels)}, seed=42)


def test_k_fold_holds_every_perturbation_out_once_and_trains_on_the_rest():
    split = _five_fold()
    everything = split.held_out()
    assert len(everything) == 10
    for fold in split.folds:
        assert split.test[fold] | split.train[fold] == everything
        assert not split.test[fold] & split.train[fold]
        assert all(split.fold_of(p) == fold for p in split.test[fold])
    assert sum(len(split.test[f]) for f in split.folds) == 10


def test_roles_split_keeps_validation_out_of_both_sets():
    split = Split.from_roles({("all", "A"): "train", ("all", "B"): "val", ("all", "C"): "test"})
    assert split.folds == ("test",)
    assert split.test["test"] == {("all", "C")}
    assert split.train["test"] == {("all", "A")}
    assert split.fold_of(("all", "B")) is None


def test_digest_depends_on_content_not_order():
    forward = _five_fold()
    mapping = {("all", f"G{i}"): str(i % 5) for i in reversed(range(10))}
    assert Split.from_folds(mapping).digest() == forward.digest()
    moved = dict(mapping)
    moved[("all", "G0")] = "1"
    assert Split.from_folds(moved).digest() != forward.digest()


@pytest.mark.parametrize(
    "test, train, message",
    [
        ({"a": {("all", "A")}, "b": {("all", "A")}}, {"a": set(), "b": set()}, "must not overlap"),
        ({"a": {("all", "A")}}, {"a": {("all", "A")}}, "trains on its own test"),
        ({"a": {("all", "A")}}, {"b": set()}, "both a test and a training set"),
    ],
)
def test_inconsistent_folds_are_refused(test, train, message):
    with pytest.raises(SpecError, match=message):
        Split(
            test={k: frozenset(v) for k, v in test.items()},
            train={k: frozenset(v) for k, v in train.items()},
        )


def test_unknown_role_is_refused():
    with pytest.raises(SpecError, match="expected 'train', 'val' or 'test'"):
        Split.from_roles({("all", "A"): "training"})
