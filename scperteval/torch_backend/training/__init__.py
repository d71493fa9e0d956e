"""The benchmark's metrics inside a training loop, as a ``torchmetrics.Metric``.

:class:`PerturbationMetrics` accumulates predicted cells or centroids batch by batch
(additive per-perturbation sums and counts, merged across devices by addition) and
scores the epoch's centroids with the protocols of ``score``: the same truth, spaces,
centerings, DEG weights and, for a truth half, calibration controls.

This subpackage sits above ``scoring``: it may import ``engine`` (protocols, suites,
spaces, views, sources), ``scoring.calibrated`` (calibrated values) and everything
below them, and nothing from ``workflows`` or ``cli``. It needs the ``ot`` extra
(torch and torchmetrics). ``scperteval.torch_backend`` exposes
:class:`PerturbationMetrics` lazily, so importing the torch backend does not import
this layer.
"""

from __future__ import annotations

from scperteval.errors import MissingExtraError

try:
    import torchmetrics  # noqa: F401
except ImportError:
    raise MissingExtraError(
        "the training metrics (scperteval.torch_backend.training)", "ot", "torchmetrics"
    ) from None

from scperteval.torch_backend.training.evaluate import ProtocolResult
from scperteval.torch_backend.training.metric import PerturbationMetrics

__all__ = ["PerturbationMetrics", "ProtocolResult"]
