"""What a metric may know beyond the two datapoints it compares.

A metric receives one of these explicitly as its ``ctx`` argument; nothing is read from
global or thread-local state, so a metric's value depends only on its arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scperteval.kernels.threads import Threads

__all__ = ["PerturbationContext", "DatasetContext"]

FeatureNames = tuple[str, ...] | npt.NDArray[np.str_] | npt.NDArray[np.object_]


def _check_targets(targets: Sequence[int], n_features: int, what: str) -> tuple[int, ...]:
    checked = tuple(int(t) for t in targets)
    if n_features and any(t < 0 or t >= n_features for t in checked):
        raise ValueError(f"{what}: feature indices {checked} outside 0..{n_features - 1}")
    return checked


@dataclass(frozen=True, eq=False)
class PerturbationContext:
    """Context of one perturbation, passed to perturbation-scope metrics.

    Parameters
    ----------
    perturbation
        Label of the perturbation being scored.
    covariate
        Covariate group (cell line, cell type) it is scored in; ``""`` when the dataset
        has no covariate.
    features
        Names of the features (genes, components) the compared vectors are aligned to.
        May be empty when no metric needs them.
    weights
        Non-negative DEG weights aligned with ``features`` (usually summing to 1, see
        :func:`scperteval.metrics.deg_weights_from_statistic`), or ``None``. Stored as a
        read-only view.
    target_features
        Column indices of the perturbation's target genes in the feature space; empty
        when the targets are not measured features.
    seed
        Seed for any randomness a metric needs.
    device
        Torch device for metrics that compute with torch (Sinkhorn); ``None``: the
        CPU.
    threads
        The run's kernel threads (:class:`~scperteval.kernels.threads.Threads`), which
        hold BLAS to one thread for the population sums; ``None``: the metric's own.

    Raises
    ------
    ValueError
        If ``weights`` is not 1-D, does not match ``features`` in length, or
        ``target_features`` points outside the features.

    """

    perturbation: str
    covariate: str = ""
    features: FeatureNames = ()
    weights: npt.NDArray[np.float64] | None = None
    target_features: tuple[int, ...] = ()
    seed: int = 0
    device: str | None = None
    threads: Threads | None = None

    def __post_init__(self) -> None:
        n_features = len(self.features)
        if self.weights is not None:
            view = np.asarray(self.weights, dtype=np.float64).view()
            view.flags.writeable = False
            if view.ndim != 1:
                raise ValueError(f"weights must be one-dimensional, got shape {view.shape}")
            if n_features and view.size != n_features:
                raise ValueError(f"{view.size} weights for {n_features} features")
            object.__setattr__(self, "weights", view)
        targets = _check_targets(self.target_features, n_features, self.perturbation)
        object.__setattr__(self, "target_features", targets)


@dataclass(frozen=True, eq=False)
class DatasetContext:
    """Context of one covariate group, passed to dataset-scope metrics.

    Parameters
    ----------
    covariate
        Covariate group whose perturbations are compared; ``""`` when there is none.
    perturbations
        Labels of the perturbations, in the order of the rows of the compared matrices.
    features
        Names of the features (columns); may be empty when no metric needs them.
    target_features
        One tuple per perturbation row with the column indices of its target genes
        (empty where a target is not a measured feature). An empty outer tuple means
        no row has a target feature.

    Raises
    ------
    ValueError
        If ``target_features`` has a length other than ``len(perturbations)`` or points
        outside the features.

    """

    covariate: str = ""
    perturbations: tuple[str, ...] = ()
    features: FeatureNames = ()
    target_features: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        perturbations = tuple(str(p) for p in self.perturbations)
        object.__setattr__(self, "perturbations", perturbations)
        targets = self.target_features or ((),) * len(perturbations)
        if len(targets) != len(perturbations):
            raise ValueError(
                f"{len(targets)} target-feature entries for {len(perturbations)} perturbations"
            )
        n_features = len(self.features)
        checked = tuple(
            _check_targets(row, n_features, name)
            for row, name in zip(targets, perturbations, strict=True)
        )
        object.__setattr__(self, "target_features", checked)
