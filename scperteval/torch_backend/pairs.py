"""Sums over pairs of cells on a torch device, for the population fast path.

:class:`TorchPairs` does what :mod:`scperteval.engine.pairs` asks of a pair backend:
sums of the Euclidean distance and of RBF kernels over the pairs of one or two
point clouds, the same sums over a stored sample's pairs at many bandwidths, and the
median heuristic. The clouds arrive as float64 NumPy arrays already shifted by their
pooled mean (as the NumPy path shifts them); they are moved to the device once per
call and cast to the computation dtype there. The squared distances and their
snapping to zero follow :mod:`scperteval.torch_backend.population`; every block sum
is accumulated in float64.

In float64 the sums equal the NumPy reference's to rounding (the blocks differ, so
the order of additions does); float32 on a GPU is faster and accurate to the bound
given in ``docs/torch.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from scperteval.torch_backend._common import DeviceLike, resolve_device, resolve_dtype
from scperteval.torch_backend.population import DEFAULT_BLOCK_BYTES, _median, _Pairs, _prepared

__all__ = ["TorchPairs", "TorchStoredPairs"]

_TRANSFORM_KINDS = ("sqrt", "rbf")


def _check_transforms(transforms: Sequence[tuple[str, float]]) -> None:
    for kind, _ in transforms:
        if kind not in _TRANSFORM_KINDS:
            raise ValueError(f"unknown pair transform {kind!r}")


def _applied(kind: str, scale: float, d2: torch.Tensor) -> torch.Tensor:
    """A new tensor with the transform of the squared distances ``d2``."""
    if kind == "sqrt":
        return torch.sqrt(d2)
    return torch.exp(d2 * scale)


def _add_sums(
    totals: torch.Tensor, transforms: Sequence[tuple[str, float]], d2: torch.Tensor
) -> None:
    for index, (kind, scale) in enumerate(transforms):
        totals[index] += _applied(kind, scale, d2).sum(dtype=torch.float64)


class TorchStoredPairs:
    """The snapped squared distances of the pairs ``i < j`` of one cloud, on a device.

    The counterpart of :class:`scperteval.metrics.population.StoredPairs`: a
    reference sample's within-sample kernel sum at many bandwidths costs one pass of
    exponentials over the stored values each, not the distances again.

    Parameters
    ----------
    pairs
        The backend whose device, dtype and block size are used.
    x
        Float64 point cloud, already shifted.

    """

    def __init__(self, pairs: TorchPairs, x: np.ndarray) -> None:
        points = pairs.tensor(x)
        blocks: list[torch.Tensor] = []
        with torch.no_grad():
            for square, rest in pairs.blocks.within(points):
                upper = torch.ones(square.shape, dtype=torch.bool, device=square.device)
                blocks.append(square[torch.triu(upper, diagonal=1)])
                blocks.append(rest.reshape(-1).clone())
        self._values = torch.cat(blocks) if blocks else points.new_zeros(0)
        self._pairs = pairs

    @staticmethod
    def nbytes_for(n_points: int, itemsize: int = 8) -> int:
        """Memory held for a cloud of ``n_points`` points, in bytes."""
        return itemsize * n_points * max(n_points - 1, 0) // 2

    @property
    def nbytes(self) -> int:
        """Memory held by the stored distances, in bytes."""
        return int(self._values.numel() * self._values.element_size())

    def sums(self, transforms: Sequence[tuple[str, float]]) -> list[float]:
        """Sums over the pairs ``i < j`` of each transform of the stored distances."""
        _check_transforms(transforms)
        totals = torch.zeros(len(transforms), dtype=torch.float64, device=self._values.device)
        chunk = max(1, self._pairs.blocks.max_block_bytes // (2 * self._values.element_size()))
        with torch.no_grad():
            for start in range(0, self._values.numel(), chunk):
                _add_sums(totals, transforms, self._values[start : start + chunk])
        return [float(v) for v in totals.tolist()]


class TorchPairs:
    """Pair sums and the median heuristic computed with torch on one device.

    Parameters
    ----------
    device
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    dtype
        ``torch.float64`` (default) or ``torch.float32``.
    max_block_bytes
        Memory bound for one block of pairwise values and its temporaries.

    Raises
    ------
    DeviceUnavailable
        If CUDA is requested and not available.

    """

    def __init__(
        self,
        device: DeviceLike = "cpu",
        dtype: torch.dtype | None = None,
        max_block_bytes: int = DEFAULT_BLOCK_BYTES,
    ) -> None:
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.blocks = _Pairs(self.dtype, max_block_bytes)

    @property
    def name(self) -> str:
        """``torch:<device>:<dtype>``, as written to ``run.json``."""
        return f"torch:{self.device}:{str(self.dtype).removeprefix('torch.')}"

    def tensor(self, x: Any) -> torch.Tensor:
        """A float64 array on the device, cast to the computation dtype."""
        return torch.tensor(np.asarray(x, dtype=np.float64), device=self.device).to(self.dtype)

    def sums(
        self, x: np.ndarray, y: np.ndarray | None, transforms: Sequence[tuple[str, float]]
    ) -> list[float]:
        """Sums over pairs of each transform (see :func:`~scperteval.metrics.population.pair_sums`).

        Parameters
        ----------
        x, y
            Float64 point clouds, already shifted. With ``y`` the pairs are all
            ``(x_i, y_j)``; with ``y=None`` the unordered pairs ``i < j`` of ``x``.
        transforms
            ``("sqrt", 0.0)`` and/or ``("rbf", -1 / (2 sigma^2))`` pairs.

        Returns
        -------
        list of float
            One sum per transform, in order.

        """
        _check_transforms(transforms)
        if not transforms:
            return []
        totals = torch.zeros(len(transforms), dtype=torch.float64, device=self.device)
        with torch.no_grad():
            first = self.tensor(x)
            if y is None:
                for square, rest in self.blocks.within(first):
                    upper = torch.ones(square.shape, dtype=torch.bool, device=square.device)
                    _add_sums(totals, transforms, square[torch.triu(upper, diagonal=1)])
                    _add_sums(totals, transforms, rest)
            else:
                for block in self.blocks.cross(first, self.tensor(y)):
                    _add_sums(totals, transforms, block)
        return [float(v) for v in totals.tolist()]

    def store(self, x: np.ndarray) -> TorchStoredPairs:
        """The stored pairwise distances of ``x`` (see :class:`TorchStoredPairs`)."""
        return TorchStoredPairs(self, x)

    def store_nbytes(self, n_points: int) -> int:
        """Memory a store of ``n_points`` points holds, in bytes."""
        return TorchStoredPairs.nbytes_for(n_points, self.blocks.itemsize)

    def median(self, z: Any) -> float:
        """Median of the positive pairwise distances of the rows of ``z``.

        The definition of
        :func:`scperteval.metrics.population.median_pairwise_distance`.
        """
        points64 = torch.tensor(np.asarray(z, dtype=np.float64), device=self.device)
        with torch.no_grad():
            (points,) = _prepared(self.dtype, points64)
            return _median(self.blocks, points)
