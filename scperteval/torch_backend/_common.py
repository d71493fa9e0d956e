"""Device and dtype resolution, and conversion of inputs to tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from scperteval.errors import ScpertevalError
from scperteval.metrics.common import DegenerateInput, as_matrix

__all__ = ["DeviceUnavailable", "resolve_device", "resolve_dtype", "as_cloud"]

DeviceLike = str | torch.device
_FLOAT_DTYPES = (torch.float32, torch.float64)


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


def as_cloud(values: Any, what: str, device: torch.device) -> torch.Tensor:
    """Return a point cloud as a finite 2-D float64 tensor on ``device``.

    NumPy arrays, array-likes and scipy sparse matrices are checked by
    :func:`scperteval.metrics.common.as_matrix`; tensors are detached, converted to
    float64 (exactly, from float32) and checked here. The result is never part of an
    autograd graph.

    Raises
    ------
    ValueError
        If the input is not two-dimensional.
    DegenerateInput
        If it contains NaN or infinity.

    """
    if isinstance(values, torch.Tensor):
        tensor = values.detach()
        if tensor.ndim != 2:
            raise ValueError(f"{what} must be two-dimensional, got shape {tuple(tensor.shape)}")
    else:
        tensor = torch.from_numpy(np.asarray(as_matrix(values, what)))
    tensor = tensor.to(device=device, dtype=torch.float64)
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        bad = int(tensor.numel() - int(finite.sum()))
        raise DegenerateInput(f"{what} contains {bad} non-finite value(s)")
    return tensor.contiguous()
