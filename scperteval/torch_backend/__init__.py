"""Torch backend: population metrics on CPU or GPU, and differentiable training losses.

Importing this subpackage imports torch (the ``ot`` extra); ``import scperteval``
does not.

- :func:`energy_distance`, :func:`mmd`, :func:`median_pairwise_distance`: the
  definitions of :mod:`scperteval.metrics.population`, computed with torch in
  float64 (equal to the NumPy reference to rounding) or float32, on ``"cpu"`` or
  ``"cuda"``.
- :func:`weighted_mse_loss`, :func:`weighted_r2_loss`: differentiable losses with the
  definitions of :func:`scperteval.metrics.weighted_mse` and
  :func:`scperteval.metrics.weighted_r2` (as ``1 - R^2``).
- :class:`DEGWeights`, :func:`deg_weight_tensor`: a context's DEG weights as a tensor
  aligned by perturbation and gene name.
- :class:`PerturbationMetrics`: the benchmark's protocols as a ``torchmetrics.Metric``
  for validation during training (:mod:`scperteval.torch_backend.training`, a layer
  above the engine, imported on first use).

See ``docs/torch.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

from scperteval.errors import MissingExtraError

try:
    import torch  # noqa: F401
except ImportError:
    raise MissingExtraError("the torch backend (scperteval.torch_backend)", "ot", "torch") from None

from scperteval.torch_backend.losses import weighted_mse_loss, weighted_r2_loss
from scperteval.torch_backend.pairs import DeviceUnavailable
from scperteval.torch_backend.population import (
    DEFAULT_BLOCK_BYTES,
    energy_distance,
    median_pairwise_distance,
    mmd,
)
from scperteval.torch_backend.weights import DEGWeights, deg_weight_tensor

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEGWeights",
    "DeviceUnavailable",
    "PerturbationMetrics",
    "deg_weight_tensor",
    "energy_distance",
    "median_pairwise_distance",
    "mmd",
    "weighted_mse_loss",
    "weighted_r2_loss",
]


def __getattr__(name: str) -> Any:
    # Resolved on first use: its module sits in a higher layer than this package.
    if name != "PerturbationMetrics":
        raise AttributeError(f"module 'scperteval.torch_backend' has no attribute {name!r}")
    value = importlib.import_module("scperteval.torch_backend.training").PerturbationMetrics
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
