"""``scperteval demo``: simulate, calibrate and score, end to end, in under a minute."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from scperteval.cli._options import add_command

DEMO_DATA: Mapping[str, Any] = MappingProxyType(
    {
        "n_perturbations": 20,
        "n_genes": 200,
        "cells_per_perturbation": 60,
        "n_covariates": 2,
        "n_combinations": 4,
        "affected_fraction": 0.05,
        "control_bias": 0.5,
        "seed": 0,
    }
)
#: Models of known quality: name -> (kind, options) for simulate_predictions. The
#: "replicate" models start from each perturbation's technical duplicate (never the
#: truth half), so a perfect model scores about 1, like the positive control.
DEMO_MODELS: Mapping[str, tuple[str, Mapping[str, Any]]] = MappingProxyType(
    {
        "replicate_plus_noise_0.1": ("noisy_truth", MappingProxyType({"noise": 0.1})),
        "replicate_plus_noise_0.4": ("noisy_truth", MappingProxyType({"noise": 0.4})),
        "replicate_half_effect": ("scaled_effect", MappingProxyType({"scale": 0.5})),
        "mean_prediction": ("mean", MappingProxyType({})),
        "control_relabelled": ("control", MappingProxyType({})),
        "mode_collapse": ("mode_collapse", MappingProxyType({})),
    }
)


def add_parser(commands: Any) -> None:
    """Register the ``demo`` subcommand."""
    parser = add_command(
        commands,
        "demo",
        run,
        "simulate a screen and six models, calibrate, score and write the report",
        "Simulate a perturbation screen with known effects (two cell lines, "
        "combinations, a control bias) and six models of known quality, then calibrate "
        "every protocol of the default suite, score the models and baselines and write "
        "the leaderboard report.",
    )
    parser.add_argument("--out", default="scperteval_demo", help="output folder")
    parser.add_argument("--workers", type=int, default=2, help="threads (default 2)")
    parser.add_argument("--seed", type=int, default=0)


def _duplicate_cells(adata: Any, seed: int) -> Any:
    """The controls and every perturbation's technical-duplicate cells (the truth half left out)."""
    from scperteval.context import Context
    from scperteval.data.dataset import Dataset

    context = Context(Dataset(adata, covariate_key="cell_line"), seed=seed)
    layout = context.layout
    keep = layout.codes >= 2 * layout.n_conditions
    keep |= (layout.codes >= 0) & (layout.codes % 2 == 1) & (layout.codes < 2 * layout.n_conditions)
    return adata[keep].copy()


def run(args: argparse.Namespace) -> int:
    """Run ``scperteval demo``."""
    from scperteval.simulation import simulate, simulate_predictions
    from scperteval.workflows.score import score
    from scperteval.workflows.steps import check_run_options

    started = time.perf_counter()
    out = Path(args.out)
    check_run_options(out=out, seed=args.seed, workers=args.workers)
    settings = {**DEMO_DATA, "seed": args.seed}
    adata = simulate(**settings)
    print(
        f"simulated {adata.n_obs} cells x {adata.n_vars} genes, "
        f"{settings['n_perturbations']} perturbations (+{settings['n_combinations']} "
        f"combinations) in {settings['n_covariates']} cell lines"
    )
    replicate = _duplicate_cells(adata, args.seed)
    models = {
        name: simulate_predictions(
            replicate if name.startswith("replicate") else adata, kind, seed=args.seed, **options
        )
        for name, (kind, options) in DEMO_MODELS.items()
    }
    result = score(
        adata,
        models,
        protocols="default",
        covariate_key="cell_line",
        seed=args.seed,
        workers=args.workers,
        out=out,
    )
    # Written once the run has succeeded, so that a refused run leaves nothing behind.
    adata.write_h5ad(out / "simulated_truth.h5ad")
    board = result.leaderboard
    print()
    print(board.table[["model", "kind", "score", "rank"]].to_string(index=False))
    print()
    print(
        f"{len(board.trusted)} of {len(board.protocols)} protocols trusted on this dataset; "
        f"score = {board.aggregate} calibrated score (0 = negative control, 1 = positive)"
    )
    for protocol, reason in board.excluded.items():
        print(f"  excluded {protocol}: {reason}")
    print(f"\nfinished in {time.perf_counter() - started:.1f} s")
    print(f"report: {(out / 'report.html').resolve()}")
    return 0
