"""Built-in baselines, scored like models in every leaderboard.

- ``dataset_mean``: the mean of the other perturbations' centroids.
- ``control_mean``: the control centroid.
- ``technical_duplicate``: the perturbation's cells outside the truth half.
- ``interpolated_duplicate``: the duplicate shrunk towards the dataset mean.
- ``additive`` (when the data has combinations): control mean plus each single's effect.
- ``linear``: a ridge regression from target-gene embeddings to expression
  changes (after Ahlmann-Eltze et al. 2025), see :func:`linear_baseline`.
- ``cell_eval_mean`` (plain runs, ``truth="all"``, only): cell-eval's mean
  baseline, against which the Virtual Cell Challenge scales its score, see
  :func:`cell_eval_mean_baseline`. Not among the defaults: a plain run of the
  challenge's terms adds it (see :mod:`scperteval.scoring.vcc`).

What each baseline sees: the first four and ``additive`` are sources of the
engine (see :mod:`scperteval.engine.sources`) and never use the truth half.
The linear baseline, for a perturbation ``p``, is fitted on the centroids of the
*other* perturbations of the covariate group (all their cells) and on the
control mean; it never sees any cell of ``p``. Under a split, every source and
the linear baseline pool the training perturbations of ``p``'s fold instead of
all the others (the linear baseline is then fitted once per fold and group).
``cell_eval_mean`` is built as cell-eval builds it, from every cell, ``p``'s
included (it is not scored under a split).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import scipy.linalg as sla

from scperteval.engine.dispatch import Candidate
from scperteval.engine.sources import SourceData
from scperteval.metrics import DegenerateInput
from scperteval.stats.groups import GroupStats

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine
    from scperteval.kernels.threads import Threads

__all__ = [
    "baseline_candidates",
    "cell_eval_mean_baseline",
    "fit_linear_baseline",
    "linear_baseline",
    "BASELINES",
    "CELL_EVAL_MEAN",
]

BASELINES = (
    "dataset_mean",
    "control_mean",
    "technical_duplicate",
    "interpolated_duplicate",
    "additive",
    "linear",
)
#: cell-eval's mean baseline: available by name, not among the defaults.
CELL_EVAL_MEAN = "cell_eval_mean"
LINEAR_COMPONENTS = 10
LINEAR_RIDGE = 0.1
T = TypeVar("T")


def baseline_candidates(engine: Engine, names: tuple[str, ...] = BASELINES) -> list[Candidate]:
    """Candidates for the built-in baselines (``additive`` only when combinations exist)."""
    skipped = set()
    if not any(c.is_combination for c in engine.context.layout.conditions):
        skipped.add("additive")
    if engine.truth_half == "all":
        skipped.update(("technical_duplicate", "interpolated_duplicate"))
    own = {"linear": linear_baseline, CELL_EVAL_MEAN: cell_eval_mean_baseline}
    return [
        Candidate("baseline", name, own.get(name) or _source_getter(name))
        for name in names
        if name not in skipped
    ]


def _source_getter(name: str):  # type: ignore[no-untyped-def]
    def getter(engine: Engine, condition: int) -> SourceData:
        return engine.source(name, condition)  # type: ignore[no-any-return]

    return getter


def cell_eval_mean_baseline(engine: Engine, condition: int) -> SourceData:
    """cell-eval's mean baseline: every cell of ``p`` predicted as one mean profile.

    The profile of covariate group ``c`` is the unweighted mean of the centroids
    (all cells) of the group's evaluated perturbations *and of its control cells*:
    cell-eval averages the means of every label of the truth file, the control's
    included. The baseline holds as many cells as ``p`` has, each equal to the
    profile, so that DE against the control can be computed on it; its control is
    the measured one (cell-eval's baseline file copies the measured control cells).
    """
    covariate = engine.covariate_index(condition)

    def profile() -> np.ndarray:
        conditions = engine.conditions_of(covariate)
        centroids = engine.context.centroids("all")[conditions]
        # The control's centroid counts as one more label, as in cell-eval.
        total = centroids.sum(axis=0) + engine.control_mean(condition)
        return total / (len(conditions) + 1)

    centre = engine.memo(("baseline", CELL_EVAL_MEAN, covariate), profile)
    n_cells = engine.positions(condition, "all").size
    rows = np.tile(centre, (n_cells, 1))
    codes = np.zeros(n_cells, dtype=np.int64)
    moments = GroupStats.from_chunk(rows, codes, 1, engine.threads.serial())
    return SourceData(centroid=centre, rows=rows, moments=moments)


def linear_baseline(engine: Engine, condition: int) -> SourceData:
    """Ridge prediction of a perturbation's centroid from its target genes' embeddings.

    Fitted once per perturbation and run, whatever the number of protocols scoring
    it (the fit, or the reason it cannot be made, is kept by the engine); see
    :func:`fit_linear_baseline` for the definition.
    """
    return _kept(
        engine, ("baseline", "linear", condition), lambda: fit_linear_baseline(engine, condition)
    )


def _kept(engine: Engine, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` kept by the engine; a :class:`DegenerateInput` is kept and raised again."""

    def outcome() -> T | DegenerateInput:
        try:
            return compute()
        except DegenerateInput as exc:
            return exc

    kept = engine.memo(key, outcome)
    if isinstance(kept, DegenerateInput):
        raise kept
    return kept


def fit_linear_baseline(engine: Engine, condition: int) -> SourceData:
    """Ridge prediction of a perturbation's centroid from its target genes' embeddings.

    For perturbation ``p`` in covariate group ``c``:

    1. ``D`` = centroids (all cells) of the group's *other* perturbations minus
       the control mean: a (perturbations x genes) matrix of expression changes.
    2. Gene embeddings ``E`` = the first ``k`` right singular vectors of ``D``
       centred on its mean row, scaled by their singular values (genes x k),
       ``k = min(10, rank)``. They are computed from the group's Gram matrix of
       changes, shared by every perturbation's fit, where the top ``k`` singular
       values are well separated from zero, and by the SVD otherwise (equal to
       rounding).
    3. A perturbation is embedded by the mean of its target genes' rows of ``E``
       (components of ``A+B`` included); perturbations with no measured target
       are left out of the fit.
    4. Ridge regression (penalty 0.1) from embeddings to rows of ``D``, with an
       intercept; ``p``'s prediction is the control mean plus the regression at
       its embedding.

    Raises
    ------
    DegenerateInput
        When none of ``p``'s targets is a measured gene or fewer than 3 other
        perturbations have one.

    """
    own_targets = engine.target_genes(condition)
    if own_targets.size == 0:
        raise DegenerateInput("linear baseline: the perturbation's targets are not measured")
    if engine.folds is not None:
        return _fold_prediction(engine, condition, own_targets)
    group = _linear_group(engine, engine.covariate_index(condition))
    own_row = int(np.flatnonzero(group.conditions == condition)[0])
    keep = np.arange(group.conditions.size) != own_row
    others = group.conditions[keep].tolist()
    deltas = group.deltas[keep]
    embedding = _loo_embedding(group, own_row, engine.threads)
    if embedding is None:
        embedding = _svd_embedding(deltas)
    fit = _ridge(engine, embedding, group.control, others, deltas)
    return SourceData(centroid=fit.predict(own_targets))


@dataclass(frozen=True)
class _LinearFit:
    """A fitted linear baseline: embedding, centres and ridge weights."""

    embedding: np.ndarray
    control: np.ndarray
    x_mean: np.ndarray
    y_mean: np.ndarray
    weights: np.ndarray

    def predict(self, targets: np.ndarray) -> np.ndarray:
        """The predicted centroid of a perturbation of the measured target genes ``targets``."""
        query = self.embedding[targets].mean(axis=0)
        prediction = self.control + self.y_mean + (query - self.x_mean) @ self.weights
        return np.asarray(np.maximum(prediction, 0.0))


def _ridge(
    engine: Engine,
    embedding: np.ndarray,
    control: np.ndarray,
    conditions: list[int],
    deltas: np.ndarray,
) -> _LinearFit:
    """The ridge fit on the conditions (rows of ``deltas``) with a measured target."""
    features, targets = [], []
    for row, k in enumerate(conditions):
        genes = engine.target_genes(k)
        if genes.size:
            features.append(embedding[genes].mean(axis=0))
            targets.append(deltas[row])
    if len(features) < 3:
        raise DegenerateInput(
            "linear baseline: fewer than 3 other perturbations with measured targets"
        )
    x = np.asarray(features)
    y = np.asarray(targets)
    x_mean, y_mean = x.mean(axis=0), y.mean(axis=0)
    xc = x - x_mean
    n_components = embedding.shape[1]
    weights = np.linalg.solve(xc.T @ xc + LINEAR_RIDGE * np.eye(n_components), xc.T @ (y - y_mean))
    return _LinearFit(embedding, control, x_mean, y_mean, weights)


def _fold_prediction(engine: Engine, condition: int, own_targets: np.ndarray) -> SourceData:
    """Under a split: the fit on the fold's training perturbations, one per fold and group."""
    covariate = engine.covariate_index(condition)
    assert engine.folds is not None
    fold = engine.folds.fold_name(condition)

    def build() -> _LinearFit:
        training = engine.training_conditions(condition)
        control = engine.control_mean(condition)
        deltas = engine.context.centroids("all")[training] - control
        if training.size == 0:
            raise DegenerateInput("linear baseline: the fold has no training perturbations")
        return _ridge(engine, _svd_embedding(deltas), control, training.tolist(), deltas)

    fit = _kept(engine, ("baseline", "linear_fold", fold, covariate), build)
    return SourceData(centroid=fit.predict(own_targets))


@dataclass(frozen=True)
class _LinearGroup:
    """A covariate group's expression changes, centred, and their products, for every fit."""

    conditions: np.ndarray
    control: np.ndarray
    #: Centroid minus control mean, one row per condition of the group.
    deltas: np.ndarray
    #: ``deltas`` minus their mean over the group's conditions.
    centred: np.ndarray
    #: ``centred @ centred.T``.
    gram: np.ndarray


def _linear_group(engine: Engine, covariate: int) -> _LinearGroup:
    def build() -> _LinearGroup:
        conditions = np.asarray(engine.conditions_of(covariate), dtype=np.int64)
        control = engine.control_mean(int(conditions[0]))
        deltas = engine.context.centroids("all")[conditions] - control
        centred = deltas - deltas.mean(axis=0)
        with engine.threads.single_threaded_blas():
            gram = centred @ centred.T
        return _LinearGroup(conditions, control, deltas, centred, gram)

    return engine.memo(("baseline", "linear_group", covariate), build)


def _svd_embedding(deltas: np.ndarray) -> np.ndarray:
    """Gene embeddings from the SVD of the centred changes (the definition)."""
    _, singular, vt = np.linalg.svd(deltas - deltas.mean(axis=0), full_matrices=False)
    n_components = int(
        min(LINEAR_COMPONENTS, np.sum(singular > 1e-12 * max(singular.max(), 1e-300)))
    )
    if n_components == 0:
        raise DegenerateInput("linear baseline: the other perturbations do not vary")
    return (vt[:n_components] * singular[:n_components, None]).T


#: The Gram route is taken when the last kept eigenvalue is at least this fraction of
#: the largest: then every kept singular value is far above the SVD's cut (1e-12),
#: and squaring loses none of the embedding's accuracy that matters.
_GRAM_EIGENVALUE_FLOOR = 1e-8


def _loo_embedding(group: _LinearGroup, left_out: int, threads: Threads) -> np.ndarray | None:
    """The embedding without one condition, from the group's Gram matrix; ``None``: use the SVD.

    With ``A`` the group's centred changes and ``a`` the left-out row, the others
    centred on their own mean are ``A_o + 1 a^T / (n - 1)`` (``n - 1`` rows), whose
    Gram matrix follows from ``A A^T`` alone. Its top eigenvectors ``U`` give the
    embedding ``V S = D_c^T U`` of the SVD ``D_c = U S V^T``, at the cost of an
    eigendecomposition of ``(n - 1) x (n - 1)`` instead of an SVD over every gene.
    Rank-deficient cases (few conditions, or a small last eigenvalue) go to the SVD,
    so that the number of components is the definition's.
    """
    n_others = group.conditions.size - 1
    if n_others <= LINEAR_COMPONENTS + 1:
        return None
    keep = np.arange(group.conditions.size) != left_out
    shift = 1.0 / n_others
    cross = group.gram[keep, left_out]
    gram = group.gram[np.ix_(keep, keep)]
    gram += shift * (cross[:, None] + cross[None, :])
    gram += shift * shift * group.gram[left_out, left_out]
    values, vectors = sla.eigh(
        gram,
        subset_by_index=[n_others - LINEAR_COMPONENTS, n_others - 1],
        overwrite_a=True,
        check_finite=False,
    )
    values, vectors = values[::-1], vectors[:, ::-1]
    if not values[0] > 0 or values[-1] < _GRAM_EIGENVALUE_FLOOR * values[0]:
        return None
    with threads.single_threaded_blas():
        embedding = group.centred[keep].T @ vectors
        embedding += np.outer(group.centred[left_out], shift * vectors.sum(axis=0))
    return embedding
