"""The pair-sum backend of a run, from its ``device`` and ``precision``.

The population fast path (:mod:`scperteval.engine.fastpath`) asks a
:class:`PairBackend` for three things: sums of the Euclidean distance and of RBF
kernels over the pairs of one or two clouds, a sample's stored pairwise distances
summed at many bandwidths, and the median heuristic. :class:`NumpyPairs` computes
them with :mod:`scperteval.kernels.pairs` and :mod:`scperteval.kernels.median`, the
reference; :class:`~scperteval.torch_backend.pairs.TorchPairs` with torch on a CPU
or a CUDA device. :func:`pair_backend` picks one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from scperteval.errors import SpecError
from scperteval.kernels.median import median_distance
from scperteval.kernels.pairs import PairTransform, StoredPairs, pair_sums
from scperteval.kernels.threads import Threads

__all__ = ["PRECISIONS", "NumpyPairs", "PairBackend", "check_device", "pair_backend"]

#: Accepted values of ``precision``.
PRECISIONS = ("float64", "float32")


class StoredSums(Protocol):
    """A cloud's stored pairwise distances: a :class:`~scperteval.kernels.pairs.StoredPairs`."""

    def sums(self, transforms: Sequence[PairTransform]) -> list[float]:
        """Sums over the pairs ``i < j`` of each transform."""
        ...  # pragma: no cover


class PairBackend(Protocol):
    """What the population fast path needs from a backend: :class:`NumpyPairs` or torch's."""

    @property
    def name(self) -> str:
        """Short description written to ``run.json``."""
        ...  # pragma: no cover

    def sums(
        self, x: np.ndarray, y: np.ndarray | None, transforms: Sequence[PairTransform]
    ) -> list[float]:
        """Sums over pairs of each transform (see :func:`~scperteval.kernels.pairs.pair_sums`)."""
        ...  # pragma: no cover

    def store(self, x: np.ndarray) -> StoredSums:
        """Stored pairwise distances of ``x``."""
        ...  # pragma: no cover

    def store_nbytes(self, n_points: int) -> int:
        """Memory a store of ``n_points`` points holds, in bytes."""
        ...  # pragma: no cover

    def median(self, z: np.ndarray) -> float:
        """Median of the positive pairwise distances of the rows of ``z``."""
        ...  # pragma: no cover


class NumpyPairs:
    """The reference backend: NumPy matrix products and numba tile kernels.

    Parameters
    ----------
    threads
        The run's threads, which hold BLAS to one thread (new ones when omitted).

    """

    name = "numpy"

    def __init__(self, threads: Threads | None = None) -> None:
        self.threads = threads or Threads()

    def sums(
        self, x: np.ndarray, y: np.ndarray | None, transforms: Sequence[PairTransform]
    ) -> list[float]:
        """Sums over pairs of each transform (:func:`~scperteval.kernels.pairs.pair_sums`)."""
        return pair_sums(x, y, transforms, threads=self.threads)

    def store(self, x: np.ndarray) -> StoredPairs:
        """Stored pairwise distances of ``x`` (a :class:`~scperteval.kernels.pairs.StoredPairs`)."""
        return StoredPairs(x, threads=self.threads)

    def store_nbytes(self, n_points: int) -> int:
        """Memory a store of ``n_points`` points holds, in bytes."""
        return StoredPairs.nbytes_for(n_points)

    def median(self, z: np.ndarray) -> float:
        """The median heuristic (:func:`~scperteval.kernels.median.median_distance`)."""
        return median_distance(z, threads=self.threads)


def check_device(device: str | None, precision: str = "float64") -> None:
    """Check a run's ``device`` and ``precision`` by name, before anything is computed.

    Parameters
    ----------
    device
        ``None``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    precision
        ``"float64"`` or ``"float32"`` (the latter only with a device).

    Raises
    ------
    SpecError
        For any other value, or float32 without a device.

    """
    if precision not in PRECISIONS:
        raise SpecError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if device is not None and not (
        isinstance(device, str) and re.fullmatch(r"cpu|cuda(:\d+)?", device)
    ):
        raise SpecError(f"unknown device {device!r}; use numpy (the default), cpu, cuda or cuda:N")
    if device is None and precision != "float64":
        raise SpecError("precision='float32' needs a torch device (device='cpu' or 'cuda')")


def pair_backend(
    device: str | None = None, precision: str = "float64", threads: Threads | None = None
) -> PairBackend:
    """The backend for a run's ``device`` and ``precision``.

    Parameters
    ----------
    device
        ``None`` (default): NumPy, the reference. ``"cpu"``, ``"cuda"`` or
        ``"cuda:N"``: torch on that device (needs torch, the ``ot`` extra).
    precision
        ``"float64"`` (default) or ``"float32"`` (torch devices only; faster on a
        GPU, accurate to the bound in ``docs/torch.md``).
    threads
        The run's threads, for the NumPy backend.

    Returns
    -------
    PairBackend
        The backend.

    Raises
    ------
    SpecError
        If ``precision`` is unknown, or float32 is asked for without a device.
    MissingExtraError
        If a device is asked for and torch is not installed.
    DeviceUnavailable
        If CUDA is asked for and not available.

    """
    check_device(device, precision)
    if device is None:
        return NumpyPairs(threads)
    try:
        import torch

        from scperteval.torch_backend.pairs import TorchPairs
    except ImportError:
        from scperteval.errors import MissingExtraError

        raise MissingExtraError("a torch device", "ot", "torch") from None
    dtype = torch.float32 if precision == "float32" else torch.float64
    return TorchPairs(device, dtype)
