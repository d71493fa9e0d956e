"""The pair-sum backend of a run, from its ``device`` and ``precision``.

The population fast path (:mod:`scperteval.engine.fastpath`) asks a
:class:`~scperteval.kernels.pairs.PairBackend` for its sums over pairs of cells:
:class:`~scperteval.kernels.pairs.NumpyPairs` (NumPy and numba, the reference) or
:class:`~scperteval.torch_backend.pairs.TorchPairs` (torch on a CPU or a CUDA
device). :func:`pair_backend` picks one.
"""

from __future__ import annotations

import re

from scperteval.errors import SpecError
from scperteval.kernels.pairs import NumpyPairs, PairBackend

__all__ = ["PRECISIONS", "check_device", "pair_backend"]

#: Accepted values of ``precision``.
PRECISIONS = ("float64", "float32")


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


def pair_backend(device: str | None = None, precision: str = "float64") -> PairBackend:
    """The backend for a run's ``device`` and ``precision``.

    Parameters
    ----------
    device
        ``None`` (default): NumPy, the reference. ``"cpu"``, ``"cuda"`` or
        ``"cuda:N"``: torch on that device (needs torch, the ``ot`` extra).
    precision
        ``"float64"`` (default) or ``"float32"`` (torch devices only; faster on a
        GPU, accurate to the bound in ``docs/torch.md``).

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
        return NumpyPairs()
    try:
        import torch

        from scperteval.torch_backend.pairs import TorchPairs
    except ImportError:
        from scperteval.errors import MissingExtraError

        raise MissingExtraError("a torch device", "ot", "torch") from None
    dtype = torch.float32 if precision == "float32" else torch.float64
    return TorchPairs(device, dtype)
