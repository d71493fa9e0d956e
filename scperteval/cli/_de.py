"""``scperteval de``: differential expression of every perturbation."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from scperteval.cli._options import (
    DE_METHOD_CHOICES,
    EXAMPLE_SETTINGS,
    add_command,
    add_dataset_options,
    add_input_argument,
    add_quiet_option,
    dataset_kwargs,
    input_data,
    progress_setting,
)

__all__ = ["EXAMPLE_SETTINGS", "add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register the ``de`` subcommand."""
    de = add_command(
        commands,
        "de",
        run,
        "differential expression of every perturbation at once",
        "Differential expression of every perturbation against the other perturbed "
        "cells of its covariate group (rest) or its controls, written to DIR/de.parquet.",
    )
    add_input_argument(de, "run on a small simulated dataset (12 perturbations, 2 cell lines)")
    add_dataset_options(de)
    de.add_argument(
        "--method",
        default="t-test",
        choices=DE_METHOD_CHOICES,
        help="test (default: t-test, Welch)",
    )
    de.add_argument("--reference", default="rest", choices=["rest", "control"])
    de.add_argument("--half", default="all", choices=["all", "truth", "duplicate"])
    de.add_argument("--seed", type=int, default=0, help="seed of the truth/duplicate split")
    add_quiet_option(de)
    de.add_argument("--out", required=True, help="output folder")


def run(args: argparse.Namespace) -> int:
    """Run ``scperteval de``."""
    from scperteval.workflows.de import de

    source = "simulated example" if args.example else args.data
    data = input_data(args)
    started = time.perf_counter()
    table = de(
        data,
        **dataset_kwargs(args),
        method=args.method,
        reference=args.reference,
        half=args.half,
        seed=args.seed,
        out=args.out,
        progress=progress_setting(args),
    )
    elapsed = time.perf_counter() - started
    n_perturbations = table.groupby(["covariate", "perturbation"], observed=True).ngroups
    significant = table[table["pvalue_adj"] < 0.05]
    per_condition = significant.groupby(["covariate", "perturbation"], observed=True).size()
    print(
        f"{source}: {args.method} vs {args.reference} for {n_perturbations} perturbations x "
        f"{table['gene'].nunique()} genes in {elapsed:.1f} s"
    )
    if len(per_condition):
        print(
            f"DEGs (adjusted p < 0.05) per perturbation: median {per_condition.median():.0f}, "
            f"max {per_condition.max()} ({'/'.join(map(str, per_condition.idxmax()))})"
        )
    print(f"wrote {Path(args.out) / 'de.parquet'} and {Path(args.out) / 'run.json'}")
    return 0
