"""Bootstrap intervals of the distance of every group to a reference, group sizes kept.

Replicate ``b`` resamples, with replacement, ``n`` cells of the group and ``m`` of the
reference (their own sizes): the group's draws are ``rng.integers(0, n, (B, n))``
with ``rng`` seeded by ``derive_seed(seed, "bootstrap", covariate, group)``, the
reference's ``rng.integers(0, m, (B, m))`` seeded by the reference's name, so that
one resampled reference per replicate serves every group. The interval is the
percentile interval of the replicates.

For distances built from pair sums the pair matrices are formed once: with ``c``
the multiplicities of the cells in a replicate, the sum over its ordered pairs of
distinct draws is ``c^T K c - c . diag(K)`` and its cross sum ``c_x^T K_xy c_y``.
The reference's within sums of all replicates are computed once for all groups.
Other distances are recomputed on each resample.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from scperteval.data.halves import derive_seed
from scperteval.distances._api import _pairwise_only, _run, against_reference
from scperteval.distances._base import Distance, Group
from scperteval.distances._kernel import BlockSums, PairKernelDistance
from scperteval.distances._mmd import MMD
from scperteval.distances._permutation import MAX_MATRIX_BYTES, fixed_kernel
from scperteval.errors import SpecError

__all__ = ["bootstrap", "bootstrap_draws"]


def bootstrap_draws(seed: int, covariate: str, group: str, n_cells: int, count: int) -> np.ndarray:
    """The resampled cell indices of one group: ``count x n_cells``, with replacement.

    Parameters
    ----------
    seed
        The bootstrap's seed.
    covariate, group
        Names the draws are derived from (:data:`ALL` without covariates).
    n_cells
        The group's size (and the size of every resample).
    count
        Number of replicates.

    Returns
    -------
    numpy.ndarray
        int64 indices into the group's cells.

    """
    rng = np.random.default_rng(derive_seed(int(seed), "bootstrap", str(covariate), str(group)))
    return rng.integers(0, int(n_cells), size=(int(count), int(n_cells)))


def _multiplicities(draws: np.ndarray, n_cells: int) -> np.ndarray:
    rows = np.repeat(np.arange(draws.shape[0]), draws.shape[1])
    counts = np.zeros((draws.shape[0], n_cells))
    np.add.at(counts, (rows, draws.ravel()), 1.0)
    return counts


def _within(
    measure: PairKernelDistance, cells: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per replicate: the sum over ordered pairs of draws (diagonal included), and the diagonal."""
    matrix = measure.pair_matrix(cells)
    diagonal = measure.diagonal(cells)
    # Pairs of two draws of one cell hold k(c, c), like the diagonal.
    return np.einsum("bi,bi->b", counts @ matrix, counts), counts @ diagonal


def _kernel_replicates(
    measure: PairKernelDistance,
    x: Group,
    x_counts: np.ndarray,
    y_cells: np.ndarray,
    y_counts: np.ndarray,
    y_within: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    x_cells = measure.cells_of(x)
    within_x, diag_x = _within(measure, x_cells, x_counts)
    cross = np.einsum("bi,bi->b", x_counts @ measure.pair_matrix(x_cells, y_cells), y_counts)
    within_y, diag_y = y_within
    values = measure.combine(
        BlockSums(cross, within_x, within_y, diag_x, diag_y, x.n, len(y_cells))
    )
    return np.asarray(values, dtype=np.float64)


def _check(n_bootstrap: int, confidence: float) -> None:
    if isinstance(n_bootstrap, bool) or int(n_bootstrap) < 2:
        raise SpecError(f"n_bootstrap must be an integer of at least 2, got {n_bootstrap!r}")
    if not 0 < float(confidence) < 1:
        raise SpecError(f"confidence must lie in (0, 1), got {confidence!r}")


def bootstrap(
    adata: Any,
    groupby: str,
    reference: str,
    metric: Any = "edistance",
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    groups: Sequence[str] | None = None,
    obsm_key: str | None = None,
    layer: str | None = None,
    space: str | None = None,
    covariate_key: str | None = None,
    subset: Mapping[str, Any] | None = None,
    n_jobs: int | None = None,
    max_matrix_bytes: int = MAX_MATRIX_BYTES,
    normalize: bool = False,
    backed: bool | str = "auto",
) -> pd.DataFrame:
    """Percentile bootstrap interval of the distance of every group to the reference.

    Parameters
    ----------
    adata, groupby, reference, metric, groups, obsm_key, layer, space, covariate_key, subset
        As for :func:`~scperteval.distances.onesided`.
    normalize, backed
        As for :func:`~scperteval.distances.pairwise`.
    n_bootstrap
        Replicates (at least 2).
    seed
        Seed the draws of each group and of the reference are derived from.
    confidence
        Coverage of the interval, e.g. 0.95 for the 2.5 % and 97.5 % percentiles.
    n_jobs
        Threads over groups (default: the cores available to scperteval's kernels).
    max_matrix_bytes
        Largest pair matrix formed for the shortcut; larger groups are resampled
        and recomputed one replicate at a time.

    Returns
    -------
    pandas.DataFrame
        One row per group other than the reference, with ``distance`` (on the cells
        as they are), ``mean`` and ``std`` of the replicates, and ``low`` and
        ``high``; the reference's row is left out.

    Raises
    ------
    SpecError
        For a bad option, distance or space.
    DatasetError
        For a missing reference or group, or too few cells.

    """
    _check(n_bootstrap, confidence)
    distance = _pairwise_only(metric, "bootstrap")
    if isinstance(distance, MMD) and distance.bandwidth == "pair_median":
        raise SpecError("bootstrap needs one kernel for all replicates: give a bandwidth")
    reference = str(reference)
    reading = (obsm_key, layer, space, covariate_key, subset, normalize, backed)
    tail = (1.0 - float(confidence)) / 2.0

    def rows_of(
        covariate: str, by_label: dict[str, Group], measure: Distance, labels: list[str]
    ) -> Iterator[dict[str, Any]]:
        ref = by_label[reference]
        ref_draws = bootstrap_draws(seed, covariate, reference, ref.n, n_bootstrap)
        kernel = fixed_kernel(measure, ref, max_matrix_bytes)
        if kernel is not None:
            ref_cells = kernel.cells_of(ref)
            ref_counts = _multiplicities(ref_draws, ref.n)
            ref_within = _within(kernel, ref_cells, ref_counts)

        def one(label: str) -> np.ndarray:
            x = by_label[label]
            draws = bootstrap_draws(seed, covariate, label, x.n, n_bootstrap)
            if kernel is not None and 8 * x.n * max(x.n, ref.n) <= max_matrix_bytes:
                counts = _multiplicities(draws, x.n)
                return _kernel_replicates(kernel, x, counts, ref_cells, ref_counts, ref_within)
            return _slow_replicates(measure, x, ref, draws, ref_draws)

        replicates = _run(labels, one, n_jobs)
        for label, values in zip(labels, replicates, strict=True):
            yield {
                "distance": measure.between(by_label[label], ref),
                "mean": float(values.mean()),
                "std": float(values.std(ddof=1)),
                "low": float(np.quantile(values, tail)),
                "high": float(np.quantile(values, 1.0 - tail)),
            }

    columns = ["distance", "mean", "std", "low", "high"]
    table = against_reference(
        distance, adata, groupby, reference, groups, reading, n_jobs, rows_of, columns
    )
    table.attrs["n_bootstrap"] = int(n_bootstrap)
    return table


def _slow_replicates(
    measure: Distance, x: Group, ref: Group, draws: np.ndarray, ref_draws: np.ndarray
) -> np.ndarray:
    values = np.empty(draws.shape[0])
    for b in range(draws.shape[0]):
        gx = Group(x.cells[draws[b]], x.shift)
        gy = Group(ref.cells[ref_draws[b]], ref.shift)
        values[b] = measure.between(gx, gy)
    return values
