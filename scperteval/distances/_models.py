"""Distances that fit a model: classifiers (scikit-learn) and a negative binomial likelihood.

``classifier_proba`` trains a logistic regression to tell the two groups apart and
reports how confidently it recognises held-out cells; ``classifier_cp`` trains one
classifier over all groups and projects the reference onto their classes (one-sided
only); ``nb_ll`` fits a negative binomial per feature to one group's counts and
scores the other group's counts under it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import gammaln

from scperteval.distances._base import DISTANCES, Distance, Group, check_size
from scperteval.errors import DatasetError

__all__ = ["ClassifierProjection", "ClassifierProbability", "NegativeBinomialLikelihood"]


def _logistic(max_iter: int, features: np.ndarray, labels: np.ndarray):  # type: ignore[no-untyped-def]
    """A logistic regression (scikit-learn's defaults) fitted to ``features``."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=max_iter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings: the value stays defined
        model.fit(features, labels)
    return model


class ClassifierProbability(Distance):
    """Mean probability a logistic regression gives held-out cells of their own group.

    A seeded ``test_fraction`` of the cells of one group (the first, ``x``; with
    ``pertpy=True`` the second, ``y``, as pertpy holds out from its second argument)
    is held out; a logistic regression (scikit-learn's defaults) is trained on the
    other group and the rest of the held-out group, and the mean predicted
    probability of the held-out cells' own group is returned: about the held-out
    group's share of the training cells when the groups do not differ, near 1 when
    they separate.

    Parameters
    ----------
    test_fraction
        Share of the group's cells held out (at least one cell).
    seed
        Seed of the held-out choice.
    hold_out_second
        Hold out from ``y`` instead of ``x``.
    max_iter
        Iterations of the solver.

    """

    def __init__(
        self, test_fraction: float, seed: int, hold_out_second: bool, max_iter: int
    ) -> None:
        if not 0 < float(test_fraction) < 1:
            raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
        self.name = "classifier_proba"
        self.test_fraction = float(test_fraction)
        self.seed = int(seed)
        self.hold_out_second = bool(hold_out_second)
        self.max_iter = int(max_iter)
        self.symmetric = False
        self.min_cells = 2

    def held_out(self, n_cells: int) -> np.ndarray:
        """Indices of the held-out cells of a group of ``n_cells`` (sorted)."""
        rng = np.random.default_rng(self.seed)
        count = max(1, int(n_cells * self.test_fraction))
        return np.sort(rng.choice(n_cells, count, replace=False))

    def between(self, x: Group, y: Group) -> float:
        """The mean probability of the held-out cells' own class."""
        if x.n < 2 or y.n < 1:
            raise DatasetError("classifier_proba needs at least 2 cells in the held-out group")
        split, other = (y, x) if self.hold_out_second else (x, y)
        test = self.held_out(split.n)
        train = np.setdiff1d(np.arange(split.n), test)
        features = np.vstack([other.cells, split.cells[train]])
        labels = np.concatenate([np.zeros(other.n), np.ones(train.size)])
        model = _logistic(self.max_iter, features, labels)
        return float(model.predict_proba(split.cells[test])[:, 1].mean())


@DISTANCES.register(
    "classifier_cp", description="1 - mean class probability of the reference (one-sided)"
)
class ClassifierProjection(Distance):
    """One minus the mean probability the reference's cells get of each group's class.

    A multinomial logistic regression (scikit-learn's defaults) is trained on the
    cells of every group other than the reference, labelled by group, and applied
    to the reference's cells; a group's value is ``1 - mean P(group | reference
    cell)``. Defined for one-sided use only.

    Parameters
    ----------
    max_iter
        Iterations of the solver.

    """

    def __init__(self, max_iter: int = 100) -> None:
        self.name = "classifier_cp"
        self.max_iter = int(max_iter)
        self.symmetric = False

    def between(self, x: Group, y: Group) -> float:
        """Not defined for one pair of groups."""
        raise DatasetError("classifier_cp compares all groups at once: use onesided()")

    def onesided_all(
        self, groups: Mapping[str, Group], reference: str, labels: Sequence[str]
    ) -> dict[str, float]:
        """The value of every group in ``labels`` (the reference at 0)."""
        others = [g for g in groups if g != reference]
        if len(others) < 2:
            raise DatasetError("classifier_cp needs at least two groups besides the reference")
        features = np.vstack([groups[g].cells for g in others])
        classes = np.concatenate([[g] * groups[g].n for g in others])
        model = _logistic(self.max_iter, features, classes)
        probabilities = model.predict_proba(groups[reference].cells).mean(axis=0)
        column = {str(c): i for i, c in enumerate(model.classes_)}
        return {g: 0.0 if g == reference else 1.0 - float(probabilities[column[g]]) for g in labels}


def _nb_log_likelihood(y: np.ndarray, mu: float, alpha: float) -> np.ndarray:
    """Log NB2 probabilities of counts ``y`` with mean ``mu`` and dispersion ``alpha``."""
    if alpha <= 0:
        return y * math.log(mu) - mu - gammaln(y + 1)
    theta = 1.0 / alpha
    return (
        gammaln(y + theta)
        - gammaln(theta)
        - gammaln(y + 1)
        + theta * math.log(theta / (theta + mu))
        + y * math.log(mu / (theta + mu))
    )


def fit_negative_binomial(counts: np.ndarray) -> tuple[float, float]:
    """Maximum-likelihood mean and NB2 dispersion of one feature's counts.

    The mean's estimate is the sample mean (the intercept-only score equation);
    the dispersion ``alpha`` (variance ``mu + alpha mu^2``) maximises the likelihood
    given it, and is 0 (Poisson) for counts no more variable than their mean.

    Parameters
    ----------
    counts
        Non-negative counts of one feature.

    Returns
    -------
    tuple of float
        ``(mu, alpha)``.

    """
    mu = float(counts.mean())
    if mu <= 0 or float(counts.var()) <= mu:
        return mu, 0.0

    def negative(log_alpha: float) -> float:
        return -float(_nb_log_likelihood(counts, mu, math.exp(log_alpha)).sum())

    found = minimize_scalar(
        negative, bounds=(-25.0, 10.0), method="bounded", options={"xatol": 1e-10}
    )
    return mu, math.exp(float(found.x))


@DISTANCES.register("nb_ll", description="minus the NB log-likelihood of one group's counts")
class NegativeBinomialLikelihood(Distance):
    """Minus the mean log-likelihood of ``y``'s counts under NBs fitted to ``x``'s, per feature.

    For every feature with some counts in ``x``, a negative binomial is fitted to
    ``x`` (:func:`fit_negative_binomial`) and the mean log-probability of ``y``'s
    counts under it computed; the value is minus the average over features. It needs
    integer counts (a counts layer: ``layer="counts", space="full"``).
    """

    def __init__(self) -> None:
        self.name = "nb_ll"
        self.symmetric = False

    @staticmethod
    def _fits(group: Group) -> list[tuple[float, float]]:
        def build() -> list[tuple[float, float]]:
            cells = group.cells
            if not np.array_equal(cells, np.round(cells)) or (cells < 0).any():
                raise DatasetError("nb_ll needs non-negative integer counts (e.g. layer='counts')")
            return [fit_negative_binomial(cells[:, g]) for g in range(cells.shape[1])]

        return group.cached("nb_fits", build)  # type: ignore[no-any-return]

    def prepare(self, group: Group) -> None:
        """Fit the per-feature negative binomials of ``group``."""
        if group.n:
            self._fits(group)

    def between(self, x: Group, y: Group) -> float:
        """``-mean_g mean_j log NB(y_jg; mu_g, alpha_g)`` with the fits of ``x``."""
        check_size(self, x, y)
        self._fits(y)  # the same count check on y
        scores = [
            float(_nb_log_likelihood(y.cells[:, g], mu, alpha).mean())
            for g, (mu, alpha) in enumerate(self._fits(x))
            if mu > 0
        ]
        if not scores:
            raise DatasetError("nb_ll: no feature has counts in the fitted group")
        return -float(np.mean(scores))


@DISTANCES.register(
    "classifier_proba", description="logistic regression's probability for held-out cells"
)
def classifier_proba(
    *, test_fraction: float = 0.2, seed: int = 0, max_iter: int = 100, pertpy: bool = False
) -> Distance:
    """Classifier probability; ``pertpy=True`` holds out from the second group as pertpy does."""
    return ClassifierProbability(test_fraction, seed, hold_out_second=pertpy, max_iter=max_iter)
