"""scperteval: calibrated benchmarking of single-cell perturbation response predictions.

Heavy dependencies (anndata, torch) are imported on first use, so that
``import scperteval`` stays fast; the public names below resolve lazily.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from scperteval._version import __version__

if TYPE_CHECKING:
    from scperteval.context import Context
    from scperteval.data.dataset import Dataset
    from scperteval.data.load import load_dataset
    from scperteval.engine.calibrators import Thresholds
    from scperteval.scoring.prediction_readers import PredictionArray
    from scperteval.simulation import simulate, simulate_predictions
    from scperteval.workflows.calibrate import calibrate
    from scperteval.workflows.de import de
    from scperteval.workflows.report import report
    from scperteval.workflows.score import score

__all__ = [
    "__version__",
    "Context",
    "Dataset",
    "PredictionArray",
    "Thresholds",
    "calibrate",
    "de",
    "load_dataset",
    "report",
    "score",
    "simulate",
    "simulate_predictions",
]

_LAZY = MappingProxyType(
    {
        "Context": "scperteval.context",
        "Dataset": "scperteval.data.dataset",
        "de": "scperteval.workflows.de",
        "load_dataset": "scperteval.data.load",
        "simulate": "scperteval.simulation",
        "simulate_predictions": "scperteval.simulation",
        "Thresholds": "scperteval.engine.calibrators",
        "PredictionArray": "scperteval.scoring.prediction_readers",
        "calibrate": "scperteval.workflows.calibrate",
        "score": "scperteval.workflows.score",
        "report": "scperteval.workflows.report",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'scperteval' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_LAZY[name]), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
