"""Sums over pairs of cells with torch, on a CPU or a CUDA device.

The torch counterpart of :mod:`scperteval.kernels.pairs`, with the same interface
(:class:`TorchPairs` is a :class:`~scperteval.engine.pairs.PairBackend`): sums of
the Euclidean distance and of RBF kernels over the pairs of one or two point
clouds, the same sums over a stored sample's pairs at many bandwidths, and the
median heuristic. The population metrics of :mod:`scperteval.torch_backend.population`
are built on it, and every module of the backend resolves its devices and dtypes here.

Both clouds are shifted by their pooled mean in float64, then cast to the
computation dtype. Squared distances are computed as ``||a||^2 + ||b||^2 - 2 a.b``
(one matrix product per block) in row blocks whose size is bounded by
``max_block_bytes``; values within ``rtol (||a||^2 + ||b||^2)`` of zero are set to 0,
with ``rtol = 1e-12`` in float64 (the reference's rule) and ``rtol = 100 eps ~ 1.2e-5``
in float32, so that coinciding cells are at distance 0 exactly. Block sums are
accumulated in float64 whatever the computation dtype. In float64 the sums equal the
NumPy reference's to rounding (the blocks differ, so the order of additions does);
float32 on a GPU is faster and accurate to the bound given in ``docs/torch.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from scperteval.errors import ScpertevalError
from scperteval.kernels.median import ArrayOps, median_of_positive
from scperteval.kernels.pairs import DEFAULT_BLOCK_BYTES, PairTransform, check_transforms

__all__ = ["DEFAULT_BLOCK_BYTES", "DeviceUnavailable", "TorchPairs", "TorchStoredPairs"]

DeviceLike = str | torch.device
_FLOAT_DTYPES = (torch.float32, torch.float64)

# Snapping tolerance: below this fraction of ||a||^2 + ||b||^2 a squared distance is
# indistinguishable from the cancellation error of the expansion.
_SNAP_RTOL_FLOAT64 = 1e-12
_SNAP_EPS_FACTOR = 100.0
# Block-sized tensors alive at once: the block, the snapping bound, a mask, a copy.
_TENSORS_PER_BLOCK = 4
# Bits of the key resolved by the first pass of the median selection.
_FIRST_DIGIT_BITS = MappingProxyType({torch.float64: 20, torch.float32: 16})
_KEY_DTYPE = MappingProxyType({torch.float64: torch.int64, torch.float32: torch.int32})
_KEY_BITS = MappingProxyType({torch.float64: 64, torch.float32: 32})


# ------------------------------------------------------------------- device, dtype


class DeviceUnavailable(ScpertevalError, RuntimeError):
    """The requested torch device does not exist on this machine."""


def resolve_device(device: DeviceLike) -> torch.device:
    """Return ``device`` as a :class:`torch.device`, checking that it can be used.

    Parameters
    ----------
    device
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a :class:`torch.device`.

    Returns
    -------
    torch.device
        The device.

    Raises
    ------
    DeviceUnavailable
        If a CUDA device is requested and CUDA is not available, or the index is out of
        range.
    ValueError
        If the device type is neither ``cpu`` nor ``cuda``.

    """
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"invalid torch device {device!r}: {error}") from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device {str(device)!r} was requested but CUDA is not available "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
            "use device='cpu'"
        )
    count = torch.cuda.device_count()
    if resolved.index is not None and resolved.index >= count:
        raise DeviceUnavailable(
            f"device {str(device)!r} was requested but only {count} CUDA device(s) exist"
        )
    return resolved


def resolve_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """Return the computation dtype: float64 unless float32 is asked for.

    Raises
    ------
    ValueError
        If ``dtype`` is neither ``None``, ``torch.float32`` nor ``torch.float64``.

    """
    if dtype is None:
        return torch.float64
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    return dtype


# --------------------------------------------------------------------------- blocks


class _Pairs:
    """Blocked squared distances of point clouds in one dtype on one device."""

    def __init__(self, dtype: torch.dtype, max_block_bytes: int) -> None:
        if int(max_block_bytes) < 1:
            raise ValueError(f"max_block_bytes must be positive, got {max_block_bytes!r}")
        self.dtype = dtype
        self.max_block_bytes = int(max_block_bytes)
        eps = torch.finfo(dtype).eps
        self.rtol = max(_SNAP_RTOL_FLOAT64, _SNAP_EPS_FACTOR * eps)
        self.itemsize = torch.empty((), dtype=dtype).element_size()

    def rows_per_block(self, n_columns: int) -> int:
        per_row = self.itemsize * _TENSORS_PER_BLOCK * max(n_columns, 1)
        return max(1, self.max_block_bytes // per_row)

    def squared(
        self, a: torch.Tensor, sq_a: torch.Tensor, b: torch.Tensor, sq_b: torch.Tensor
    ) -> torch.Tensor:
        d2 = (-2.0 * a) @ b.T
        d2 += sq_a[:, None]
        d2 += sq_b[None, :]
        bound = sq_a[:, None] + sq_b[None, :]
        bound *= self.rtol
        return d2.masked_fill_(d2 <= bound, 0.0)

    def cross(self, x: torch.Tensor, y: torch.Tensor) -> Iterator[torch.Tensor]:
        """Blocks of squared distances covering every pair ``(x_i, y_j)`` once."""
        sq_x, sq_y = _row_norms(x), _row_norms(y)
        rows = self.rows_per_block(y.shape[0])
        for start in range(0, x.shape[0], rows):
            stop = start + rows
            yield self.squared(x[start:stop], sq_x[start:stop], y, sq_y)

    def within(self, x: torch.Tensor) -> Iterator[torch.Tensor]:
        """Blocks of squared distances covering every pair ``i < j`` of rows once.

        Per block of rows: the strict upper triangle of the rows against themselves
        (flattened), then the rows against all later rows.
        """
        sq = _row_norms(x)
        n = x.shape[0]
        rows = self.rows_per_block(n)
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            block = self.squared(x[start:stop], sq[start:stop], x[start:], sq[start:])
            size = stop - start
            upper = torch.ones(size, size, dtype=torch.bool, device=x.device).triu_(1)
            yield block[:, :size][upper]
            yield block[:, size:]


def _row_norms(points: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ij,ij->i", points, points)


def _prepared(dtype: torch.dtype, *clouds: torch.Tensor) -> list[torch.Tensor]:
    """Shift float64 clouds by the mean of all of them together, then cast to ``dtype``."""
    count = sum(cloud.shape[0] for cloud in clouds)
    if count == 0:
        return [cloud.to(dtype) for cloud in clouds]
    shift = sum(cloud.sum(dim=0) for cloud in clouds) / count
    return [(cloud - shift).to(dtype).contiguous() for cloud in clouds]


# ----------------------------------------------------------------------------- median


class _TorchOps(ArrayOps):
    """The operations of the median selection on tensors of one dtype."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.key_bits = _KEY_BITS[dtype]
        self.key_dtype = _KEY_DTYPE[dtype]

    def keys(self, values: Any) -> Any:
        """Bit patterns of positive floats as int64; they order exactly as the values do."""
        return values.contiguous().view(self.key_dtype).to(torch.int64)

    def histogram(self, digits: Any, size: int) -> Any:
        """Occurrences of each of the digits ``0 .. size - 1``, on the device."""
        return torch.bincount(digits, minlength=size)

    def host(self, values: Any) -> np.ndarray:
        """``values`` as a NumPy array."""
        return np.asarray(values.cpu().numpy())


def _add_sums(totals: torch.Tensor, transforms: Sequence[PairTransform], d2: torch.Tensor) -> None:
    for index, (kind, scale) in enumerate(transforms):
        values = torch.sqrt(d2) if kind == "sqrt" else torch.exp(d2 * scale)
        totals[index] += values.sum(dtype=torch.float64)


class TorchStoredPairs:
    """The snapped squared distances of the pairs ``i < j`` of one cloud, on a device.

    The counterpart of :class:`scperteval.kernels.pairs.StoredPairs`: a
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
        with torch.no_grad():
            # Copies, so that no view keeps a whole block alive until the end.
            blocks = [d2.reshape(-1).clone() for d2 in pairs.blocks.within(points)]
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

    def sums(self, transforms: Sequence[PairTransform]) -> list[float]:
        """Sums over the pairs ``i < j`` of each transform of the stored distances."""
        check_transforms(transforms)
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
        """A float64 array (or a tensor) on the device, cast to the computation dtype."""
        if isinstance(x, torch.Tensor):
            return x.to(device=self.device, dtype=self.dtype)
        return torch.tensor(np.asarray(x, dtype=np.float64), device=self.device).to(self.dtype)

    def sums(
        self,
        x: np.ndarray | torch.Tensor,
        y: np.ndarray | torch.Tensor | None,
        transforms: Sequence[PairTransform],
    ) -> list[float]:
        """Sums over pairs of each transform (see :func:`~scperteval.kernels.pairs.pair_sums`).

        Parameters
        ----------
        x, y
            Float64 point clouds (arrays, or tensors already in the computation dtype),
            already shifted. With ``y`` the pairs are all
            ``(x_i, y_j)``; with ``y=None`` the unordered pairs ``i < j`` of ``x``.
        transforms
            ``("sqrt", 0.0)`` and/or ``("rbf", -1 / (2 sigma^2))`` pairs.

        Returns
        -------
        list of float
            One sum per transform, in order.

        """
        check_transforms(transforms)
        if not transforms:
            return []
        totals = torch.zeros(len(transforms), dtype=torch.float64, device=self.device)
        with torch.no_grad():
            first = self.tensor(x)
            blocks = (
                self.blocks.within(first) if y is None else self.blocks.cross(first, self.tensor(y))
            )
            for d2 in blocks:
                _add_sums(totals, transforms, d2)
        return [float(v) for v in totals.tolist()]

    def store(self, x: np.ndarray) -> TorchStoredPairs:
        """The stored pairwise distances of ``x`` (see :class:`TorchStoredPairs`)."""
        return TorchStoredPairs(self, x)

    def store_nbytes(self, n_points: int) -> int:
        """Memory a store of ``n_points`` points holds, in bytes."""
        return TorchStoredPairs.nbytes_for(n_points, self.blocks.itemsize)

    def median(self, z: Any) -> float:
        """Median of the positive pairwise distances of the rows of ``z``.

        The definition of :func:`scperteval.kernels.median.median_distance`; ``z`` is a
        float64 array, or a float64 tensor on the device, shifted here.
        """
        if isinstance(z, torch.Tensor):
            points64 = z
        else:
            points64 = torch.tensor(np.asarray(z, dtype=np.float64), device=self.device)
        blocks = self.blocks
        with torch.no_grad():
            (points,) = _prepared(self.dtype, points64)
            return median_of_positive(
                lambda: (d2[d2 > 0] for d2 in blocks.within(points)),
                max(1, blocks.max_block_bytes // blocks.itemsize),
                _TorchOps(self.dtype),
                _FIRST_DIGIT_BITS[self.dtype],
            )
