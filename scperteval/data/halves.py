"""Seeded split of each perturbation's cells into a truth half and a duplicate.

Each perturbation's cells are shuffled by a generator seeded from the run seed,
the covariate group and the perturbation's name (never from its position or
from which other perturbations are present), and the first ``floor(n / 2)``
shuffled cells form the truth half; the rest form the technical duplicate.
The split is therefore reproducible across runs and machines and independent
of thread count, chunking and perturbation selection.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["derive_seed", "split_halves"]


def derive_seed(seed: int, *names: str) -> int:
    """A 64-bit seed derived from a run seed and names, stable across platforms.

    Parameters
    ----------
    seed
        The run's seed.
    *names
        Names that identify the random choice (covariate, perturbation, purpose).

    Returns
    -------
    int
        A non-negative integer usable with :func:`numpy.random.default_rng`.

    """
    text = "\x1f".join([str(int(seed)), *map(str, names)])
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def split_halves(
    positions: np.ndarray, seed: int, covariate: str, perturbation: str
) -> tuple[np.ndarray, np.ndarray]:
    """Split one perturbation's cells into truth half and technical duplicate.

    Parameters
    ----------
    positions
        Positions of the perturbation's cells in the dataset, ascending.
    seed
        The run's seed.
    covariate, perturbation
        Names of the condition; they seed the shuffle.

    Returns
    -------
    tuple of numpy.ndarray
        Sorted positions of the truth half (``floor(n / 2)`` cells) and of the
        duplicate (the remaining cells).

    """
    rng = np.random.default_rng(derive_seed(seed, "halves", covariate, perturbation))
    shuffled = np.asarray(positions)[rng.permutation(len(positions))]
    cut = len(positions) // 2
    return np.sort(shuffled[:cut]), np.sort(shuffled[cut:])
