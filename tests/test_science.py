"""The finding that motivates calibration, reproduced on simulated screens.

As the signal gets sparser and the control bias larger, unweighted MSE and
control-referenced Pearson lose calibration (their dynamic range shrinks: the
dataset mean looks almost as good as a replicate), while DEG-weighted metrics
keep it (Mejia et al. 2025; Miller et al. 2025).
"""

from __future__ import annotations

import pandas as pd

import scperteval
from scperteval.simulation import simulate

PROTOCOLS = "mse,pearson_delta_ctrl,weighted_mse,weighted_r2_delta_pert"
SETTINGS = [(0.2, 0.0), (0.1, 0.5), (0.03, 1.0)]  # (affected fraction, control bias)


def _drf(fraction: float, bias: float) -> pd.Series:
    adata = simulate(
        n_perturbations=30,
        n_genes=300,
        cells_per_perturbation=60,
        affected_fraction=fraction,
        control_bias=bias,
        control_bias_fraction=0.3,
        seed=1,
    )
    result = scperteval.calibrate(adata, PROTOCOLS, covariate_key="cell_line")
    return result.overall().set_index("protocol")["drf_median"]


def test_unweighted_metrics_lose_calibration_weighted_keep_it() -> None:
    drf = pd.DataFrame({setting: _drf(*setting) for setting in SETTINGS}).T
    for unweighted in ("mse", "pearson_delta_ctrl"):
        series = drf[unweighted].to_numpy()
        assert series[0] > series[1] > series[2], unweighted
        assert series[2] < 0.3, unweighted
    for weighted in ("weighted_mse", "weighted_r2_delta_pert"):
        assert drf[weighted].min() > 0.9, weighted
    hardest = drf.iloc[-1]
    assert hardest["weighted_mse"] > hardest["mse"] + 0.5
