"""One protocol's values at the end of an epoch."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["ProtocolResult"]


class ProtocolResult:
    """A protocol's per-perturbation values, their reasons and their aggregate.

    A plain object on purpose: torchmetrics rebuilds dataclasses and tuples found in a
    ``compute()`` result, and leaves other objects as they are.

    Attributes
    ----------
    protocol
        The protocol's name.
    values
        Per perturbation (indexed by ``perturbation``, or ``(covariate,
        perturbation)`` when the data has a covariate column), the value; NaN where
        undefined.
    reasons
        Aligned with ``values``: why a value is NaN (``""`` where it is not).
    aggregate
        The ``median`` (or ``mean``) of the finite values; NaN when none is.
    calibrated
        The calibrated values against the protocol's positive and negative controls
        (truth-half metrics only), else ``None``.
    calibrated_aggregate
        Their aggregate (NaN when none is finite), or ``None``.
    better
        ``higher`` or ``lower``.

    """

    def __init__(
        self,
        protocol: str,
        values: pd.Series,
        reasons: pd.Series,
        aggregate: float,
        better: str,
        calibrated: pd.Series | None = None,
        calibrated_aggregate: float | None = None,
    ) -> None:
        self.protocol = protocol
        self.values = values
        self.reasons = reasons
        self.aggregate = aggregate
        self.better = better
        self.calibrated = calibrated
        self.calibrated_aggregate = calibrated_aggregate

    @property
    def n_defined(self) -> int:
        """Number of perturbations with a finite value."""
        return int(np.isfinite(self.values.to_numpy(dtype=np.float64)).sum())

    def __float__(self) -> float:
        return float(self.aggregate)

    def __repr__(self) -> str:
        extra = (
            ""
            if self.calibrated_aggregate is None
            else f", calibrated={self.calibrated_aggregate:.4g}"
        )
        return (
            f"ProtocolResult({self.protocol!r}, aggregate={self.aggregate:.4g}{extra}, "
            f"defined={self.n_defined}/{len(self.values)})"
        )
