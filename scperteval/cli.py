"""The ``scperteval`` command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scperteval._version import __version__

EXAMPLE_SETTINGS: dict[str, Any] = {
    "n_perturbations": 12,
    "n_genes": 300,
    "cells_per_perturbation": 80,
    "n_covariates": 2,
    "n_combinations": 3,
    "seed": 0,
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="scperteval",
        description="Calibrated benchmarking of single-cell perturbation response predictions.",
    )
    parser.add_argument("--version", action="version", version=f"scperteval {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    de = commands.add_parser(
        "de",
        help="differential expression of every perturbation at once",
        description=(
            "Differential expression of every perturbation against the other perturbed "
            "cells of its covariate group (rest) or its controls, written to DIR/de.parquet."
        ),
    )
    source = de.add_mutually_exclusive_group(required=True)
    source.add_argument("data", nargs="?", help="input .h5ad file (log-normalised)")
    source.add_argument(
        "--example",
        action="store_true",
        help="run on a small simulated dataset (12 perturbations, 2 cell lines)",
    )
    _add_dataset_options(de)
    de.add_argument(
        "--method",
        default="t-test",
        choices=["t-test", "t-test_overestim_var", "wilcoxon"],
        help="test (default: t-test, Welch)",
    )
    de.add_argument("--reference", default="rest", choices=["rest", "control"])
    de.add_argument("--half", default="all", choices=["all", "truth", "duplicate"])
    de.add_argument("--seed", type=int, default=0, help="seed of the truth/duplicate split")
    de.add_argument("--out", required=True, help="output folder")
    return parser


def _add_dataset_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dataset")
    group.add_argument("--perturbation-key", default="perturbation", help="obs column of labels")
    group.add_argument("--control-label", default="control", help="label of control cells")
    group.add_argument("--covariate-key", default=None, help="obs column of cell line / type")
    group.add_argument("--layer", default=None, help="read this layer instead of X")
    group.add_argument("--min-cells", type=int, default=4, help="minimum cells per perturbation")
    group.add_argument(
        "--normalize", action="store_true", help="normalize_total(1e4) + log1p raw counts first"
    )
    group.add_argument(
        "--subset",
        action="append",
        default=[],
        metavar="COLUMN=VALUE",
        help="keep cells whose obs COLUMN equals VALUE (repeatable; VALUE may be a,b,c)",
    )


def _parse_subset(items: Sequence[str]) -> dict[str, Any]:
    subset: dict[str, Any] = {}
    for item in items:
        column, sep, value = item.partition("=")
        if not sep or not column:
            raise SystemExit(f"scperteval: --subset expects COLUMN=VALUE, got {item!r}")
        subset[column] = value.split(",")
    return subset


def _run_de(args: argparse.Namespace) -> int:
    from scperteval.api import de

    if args.example:
        from scperteval.simulation import simulate

        data: Any = simulate(**EXAMPLE_SETTINGS)
        args.perturbation_key = "perturbation"
        args.covariate_key = args.covariate_key or "cell_line"
        source = "simulated example"
    else:
        data = args.data
        source = args.data
    started = time.perf_counter()
    table = de(
        data,
        perturbation_key=args.perturbation_key,
        control_label=args.control_label,
        covariate_key=args.covariate_key,
        layer=args.layer,
        method=args.method,
        reference=args.reference,
        half=args.half,
        min_cells=args.min_cells,
        normalize=args.normalize,
        subset=_parse_subset(args.subset),
        seed=args.seed,
        out=args.out,
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    from scperteval.errors import ScpertevalError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    handlers = {"de": _run_de}
    try:
        return handlers[args.command](args)
    except ScpertevalError as exc:
        print(f"scperteval: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
