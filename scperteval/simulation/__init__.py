"""In-silico Perturb-seq data and model predictions with known ground truth.

:func:`simulate` generates a screen whose perturbation effects, control bias and
combination interactions are stored with the data; :func:`simulate_predictions`
derives predictions of known quality from any dataset (the truth with noise, a
scaled effect, and the uninformative baselines), so metrics can be tested
against answers known in advance.
"""

from scperteval.simulation.dataset import NORMALIZED_TOTAL, simulate
from scperteval.simulation.predictions import PREDICTION_KINDS, simulate_predictions

__all__ = ["NORMALIZED_TOTAL", "PREDICTION_KINDS", "simulate", "simulate_predictions"]
