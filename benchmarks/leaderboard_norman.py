"""The leaderboard of docs/leaderboards.md: four known models on the Norman subset.

Writes the models next to the output (``good``: truth cells with log-normal
multiplicative noise on non-zero values; ``shifted``: truth cells plus
Gaussian noise clipped at 0; ``bad``: the mean of all perturbed cells for every
perturbation; ``truth``: the truth's cells), scores them with the default suite
and prints the headline table, the flags and the verdicts.

Run: python benchmarks/leaderboard_norman.py [DATA] [OUT]
(defaults: ../shared/data/perturbench_devel.h5ad and /tmp/scperteval_norman).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from scperteval.reporting.terminal import terminal_lines
from scperteval.workflows.score import score

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "perturbench_devel.h5ad"


def models(adata: ad.AnnData, seed: int = 0) -> dict[str, ad.AnnData]:
    """The four models, as AnnData of predicted cells."""
    rng = np.random.default_rng(seed)
    dense = adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)
    labels = adata.obs["condition"].astype(str).to_numpy()
    perturbed = labels != "control"
    cells = dense[perturbed]

    def make(matrix: np.ndarray) -> ad.AnnData:
        obs = pd.DataFrame(
            {"condition": labels[perturbed]}, index=[f"c{i}" for i in range(cells.shape[0])]
        )
        return ad.AnnData(np.asarray(matrix, dtype=np.float32), obs=obs, var=adata.var[[]].copy())

    return {
        "good": make(cells * np.exp(rng.normal(0.0, 0.3, cells.shape)) * (cells > 0)),
        "bad": make(np.repeat(cells.mean(axis=0, keepdims=True), cells.shape[0], axis=0)),
        "shifted": make(np.maximum(cells + rng.normal(0.0, 0.5, cells.shape), 0.0)),
        "truth": make(cells),
    }


def main() -> None:
    """Score the four models and print the verdict."""
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DATA
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/scperteval_norman")
    adata = ad.read_h5ad(data)
    adata = adata[adata.obs["dataset"] == "norman19"].copy()
    result = score(adata, models(adata), perturbation_key="condition", out=out, progress=False)
    print("\n".join(terminal_lines(result)))
    print(f"report: {out / 'report.html'}")


if __name__ == "__main__":
    main()
