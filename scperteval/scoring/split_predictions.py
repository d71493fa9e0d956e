"""Models' predictions under a split: per fold, or one file for every held-out perturbation.

A model under a split is given either as one prediction that holds every held-out
perturbation once (its fold read from the split), or per fold: a mapping
``{fold: prediction}`` or a folder whose prediction files are named by the folds
(``0.h5ad``, ``1.h5ad``, ...). A fold's file predicts that fold's test
perturbations only. Predictions of a perturbation that is only trained on are
refused: the model saw its cells.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from scperteval.data.dataset import Dataset
from scperteval.engine.folds import FoldPlan
from scperteval.errors import DatasetError, SpecError
from scperteval.scoring.predictions import Prediction, _by_stem, load_predictions, prediction_inputs

__all__ = ["load_split_predictions"]


def load_split_predictions(
    spec: Any,
    dataset: Dataset,
    layout: Any,
    folds: FoldPlan,
    allow_missing: bool = False,
    deltas: Collection[str] = (),
    control: str = "measured",
) -> list[Prediction]:
    """Read every model's predictions of the split's held-out perturbations.

    Parameters
    ----------
    spec
        The models, as for :func:`~scperteval.scoring.predictions.load_predictions`;
        a model's value may also be ``{fold: prediction}`` or a folder of one
        prediction file per fold, named by the fold.
    dataset, layout
        The truth and its group layout.
    folds
        The split resolved on the layout.
    allow_missing
        Score models that miss held-out perturbations (NaN there).
    deltas, control
        As for :func:`~scperteval.scoring.predictions.load_predictions`.

    Returns
    -------
    list of Prediction
        One per model, its rows for held-out perturbations only; ``missing`` lists
        the held-out perturbations it lacks.

    Raises
    ------
    DatasetError
        A prediction of a perturbation no fold holds out (a training perturbation),
        a fold's file predicting another fold's perturbation, per-fold files that are
        not the split's folds, or (without ``allow_missing``) a held-out perturbation
        not predicted.
    SpecError
        Per-fold files with ``control="predicted"``.

    """
    models = []
    for name, value in prediction_inputs(spec).items():
        per_fold = _per_fold_inputs(name, value, folds)
        if per_fold is not None and control == "predicted":
            raise SpecError(
                f"prediction {name!r}: per-fold prediction files cannot give the predicted "
                "control (--control-from-predictions); give one file for every fold"
            )
        parts = []
        # One prediction for every fold is checked as the file of no particular fold.
        inputs = {None: value} if per_fold is None else per_fold
        for fold, part_value in inputs.items():
            part = _load_one(name, part_value, dataset, layout, deltas, control)
            _refuse_training(part, layout, folds, fold)
            parts.append(part)
        model = parts[0] if per_fold is None else _merged(name, parts)
        _set_missing(model, layout, folds, allow_missing)
        models.append(model)
    return models


def _load_one(
    name: str, value: Any, dataset: Dataset, layout: Any, deltas: Collection[str], control: str
) -> Prediction:
    delta = (name,) if name in deltas else ()
    return load_predictions({name: value}, dataset, layout, True, deltas=delta, control=control)[0]


def _per_fold_inputs(name: str, value: Any, folds: FoldPlan) -> dict[str | None, Any] | None:
    """``{fold: prediction}`` of a model given per fold, or ``None`` for one prediction."""
    expected = folds.split.folds
    if isinstance(value, Mapping):
        given = {str(fold): part for fold, part in value.items()}
        where = "the mapping"
    elif isinstance(value, (str, Path)) and Path(value).is_dir():
        given = _by_stem(
            value,
            lambda stem: f"prediction {name!r}: two files for fold {stem!r} in folder {value}",
        )
        where = f"folder {value}"
    else:
        return None
    unknown = sorted(set(given) - set(expected))
    lacking = [fold for fold in expected if fold not in given]
    if unknown or lacking:
        parts = [f"{', '.join(map(repr, unknown))} not a fold of the split"] if unknown else []
        parts += [f"no file for fold(s) {', '.join(map(repr, lacking))}"] if lacking else []
        raise DatasetError(
            f"prediction {name!r}: the per-fold files in {where} do not match the split's "
            f"folds ({', '.join(map(repr, expected))}): {'; '.join(parts)}"
        )
    return {fold: given[fold] for fold in expected}


def _refuse_training(model: Prediction, layout: Any, folds: FoldPlan, fold: str | None) -> None:
    """Refuse rows of perturbations that are not held out (by ``fold``, when given)."""
    for condition in sorted(model.rows):
        held_by = int(folds.fold_of[condition])
        target = layout.conditions[condition]
        label = (
            repr(target.perturbation)
            if target.covariate == "all"
            else f"{target.perturbation!r} ({target.covariate})"
        )
        if held_by < 0:
            raise DatasetError(
                f"prediction {model.name!r} predicts {label}, which no fold of the split holds "
                "out (a training perturbation): predict held-out perturbations only"
            )
        owner = folds.split.folds[held_by]
        if fold is not None and owner != fold:
            trains = (target.covariate, target.perturbation) in folds.split.train[fold]
            trained = " (a training perturbation of that fold)" if trains else ""
            raise DatasetError(
                f"prediction {model.name!r}: the file for fold {fold!r} predicts {label}{trained}, "
                f"held out by fold {owner!r}: each fold's file predicts that fold's test "
                "perturbations only"
            )


def _merged(name: str, parts: list[Prediction]) -> Prediction:
    """One prediction of the rows of every fold's file."""
    matrices = [part.matrix for part in parts]
    if any(sp.issparse(m) for m in matrices):
        matrix: Any = sp.vstack([sp.csr_matrix(m) for m in matrices], format="csr")
    else:
        matrix = np.vstack([np.asarray(m) for m in matrices])
    # Each file's row numbers follow those of the files before it.
    starts = np.cumsum([0, *(part.matrix.shape[0] for part in parts)]).tolist()
    rows = {k: r + s for p, s in zip(parts, starts, strict=False) for k, r in p.rows.items()}
    notes = list(dict.fromkeys(note for part in parts for note in part.notes))
    return Prediction(
        name=name,
        matrix=matrix,
        rows=rows,
        pseudobulk=bool(rows) and all(r.size == 1 for r in rows.values()),
        delta=parts[0].delta,
        description=f"{len(parts)} per-fold files: " + "; ".join(p.description for p in parts),
        notes=notes,
    )


def _set_missing(model: Prediction, layout: Any, folds: FoldPlan, allow_missing: bool) -> None:
    """The held-out perturbations the model lacks; an error unless ``allow_missing``."""
    missing = [
        (layout.conditions[k].covariate, layout.conditions[k].perturbation)
        for k in folds.scored().tolist()
        if k not in model.rows
    ]
    if missing and not allow_missing:
        shown = ", ".join(p if c == "all" else f"{p} ({c})" for c, p in missing[:10])
        raise DatasetError(
            f"prediction {model.name!r}: {len(missing)} held-out perturbation(s) not "
            f"predicted: {shown}{' ...' if len(missing) > 10 else ''}; pass "
            "allow_missing=True (CLI: --allow-missing) to score the rest"
        )
    model.missing[:] = missing
