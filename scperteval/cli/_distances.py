"""``scperteval distances``: distances between groups of cells, and permutation tests."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from scperteval.cli._options import add_command, add_subset_option, parse_subset
from scperteval.data.labels import unmatched_listing
from scperteval.errors import DatasetError, SpecError

FORMATS = ("csv", "parquet")


def add_parser(commands: Any) -> None:
    """Register the ``distances`` subcommand."""
    parser = add_command(
        commands,
        "distances",
        run,
        "distances between groups of cells (pairwise, or to a reference with tests)",
        "Distances between the groups of cells of an .h5ad file, under pertpy's metric "
        "names: every pair of groups (DIR/distances.csv and DIR/heatmap.png), or with "
        "--reference each group against one reference group, optionally with a seeded "
        "permutation test (--permutations).",
    )
    parser.add_argument("data", help="input .h5ad file")
    parser.add_argument("--groupby", required=True, help="obs column of the group labels")
    parser.add_argument(
        "--metric",
        default="edistance",
        help="distance, optionally with options, e.g. \"mmd(kernel='linear')\" "
        "(see docs/distances.md; default edistance)",
    )
    parser.add_argument("--reference", default=None, help="compare every group to this group")
    parser.add_argument(
        "--groups", default=None, help="comma-separated groups to compare (default: all)"
    )
    space = parser.add_argument_group("feature space")
    space.add_argument("--obsm-key", default=None, help="embedding in obsm (default X_pca)")
    space.add_argument("--layer", default=None, help="layer read instead of X")
    space.add_argument(
        "--space",
        default=None,
        help="space fitted on X or --layer: pca(k=50), hvg(k=2000) or full "
        "(default: obsm X_pca if present, else pca(k=50))",
    )
    space.add_argument("--covariate-key", default=None, help="compare within each value")
    add_subset_option(space)
    test = parser.add_argument_group("permutation test (with --reference)")
    test.add_argument("--permutations", type=int, default=0, help="relabellings per group")
    test.add_argument("--seed", type=int, default=0, help="seed of the permutations")
    test.add_argument("--correction", default="holm", help="holm (default), bh, bonferroni or none")
    test.add_argument("--alpha", type=float, default=0.05, help="level of 'significant'")
    test.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        help="bootstrap replicates for intervals (with --reference)",
    )
    test.add_argument("--confidence", type=float, default=0.95, help="bootstrap interval coverage")
    parser.add_argument("--format", default="csv", help="table format: csv (default) or parquet")
    parser.add_argument("--no-figure", action="store_true", help="skip the PNG figure")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: cores)")
    parser.add_argument("--out", required=True, help="output folder")


def _check_options(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can be checked without reading the data; raises SpecError."""
    from scperteval.distances import CORRECTIONS, resolve_distance
    from scperteval.engine.spaces import parse_cells_space

    if args.format not in FORMATS:
        raise SpecError(f"--format must be one of {', '.join(FORMATS)}, got {args.format!r}")
    if args.permutations < 0:
        raise SpecError(f"--permutations must be 0 or more, got {args.permutations}")
    if args.permutations and args.reference is None:
        raise SpecError("--permutations needs --reference (the group each test compares to)")
    if args.correction not in CORRECTIONS:
        raise SpecError(
            f"unknown --correction {args.correction!r}; known: {', '.join(CORRECTIONS)}"
        )
    if args.bootstrap and args.reference is None:
        raise SpecError("--bootstrap needs --reference (the group each interval compares to)")
    if args.bootstrap < 0 or args.bootstrap == 1:
        raise SpecError(f"--bootstrap must be 0 or at least 2, got {args.bootstrap}")
    for option, value in (("--confidence", args.confidence), ("--alpha", args.alpha)):
        if not 0 < value < 1:
            raise SpecError(f"{option} must lie in (0, 1), got {value}")
    if args.threads is not None and args.threads < 1:
        raise SpecError(f"--threads must be at least 1, got {args.threads}")
    if args.obsm_key is not None and (args.space is not None or args.layer is not None):
        raise SpecError("give --obsm-key or --layer/--space, not both")
    if args.space is not None:
        parse_cells_space(args.space)
    distance = resolve_distance(args.metric)
    groups = None if args.groups is None else [g for g in args.groups.split(",") if g]
    if args.groups is not None and not groups:
        raise SpecError("--groups names no group")
    return {"distance": distance, "groups": groups, "subset": parse_subset(args.subset)}


def _check_data(adata: Any, args: argparse.Namespace, subset: dict[str, Any]) -> None:
    """Columns, labels, layer and embedding named on the command line exist."""
    from scperteval.registry import did_you_mean

    columns = [str(c) for c in adata.obs.columns]
    for option, column in (
        ("--groupby", args.groupby),
        ("--covariate-key", args.covariate_key),
        *(("--subset", c) for c in subset),
    ):
        if column is not None and column not in columns:
            raise DatasetError(
                f"{option}: column {column!r} is not in obs{did_you_mean(column, columns)}"
            )
    labels = sorted(set(adata.obs[args.groupby].astype(str)))
    if args.reference is not None and args.reference not in labels:
        shown = unmatched_listing([args.reference], labels)
        raise DatasetError(f"--reference: group {shown} is not in {args.groupby!r}")
    if args.layer is not None and args.layer not in adata.layers:
        raise DatasetError(f"--layer: layer {args.layer!r} is not in the file")
    if args.obsm_key is not None and args.obsm_key not in adata.obsm:
        hint = did_you_mean(args.obsm_key, list(adata.obsm.keys()))
        raise DatasetError(f"--obsm-key: embedding {args.obsm_key!r} is not in obsm{hint}")


def run(args: argparse.Namespace) -> int:
    """Run ``scperteval distances``."""
    from scperteval.distances import (
        bootstrap,
        distance_figure,
        distance_input,
        onesided,
        pairwise,
        permutation_test,
    )
    from scperteval.runinfo import write_atomic, write_run_json

    checked = _check_options(args)
    started = time.perf_counter()
    adata = distance_input(args.data, backed=False)
    _check_data(adata, args, checked["subset"])
    common = {
        "groups": checked["groups"],
        "obsm_key": args.obsm_key,
        "layer": args.layer,
        "space": args.space,
        "covariate_key": args.covariate_key,
        "subset": checked["subset"] or None,
        "n_jobs": args.threads,
    }
    metric = checked["distance"]
    against = (adata, args.groupby, args.reference, metric)
    if args.reference is None:
        result: Any = pairwise(adata, args.groupby, metric, **common)
        what = f"{len(result.columns)} x {len(result.columns)} pairwise {metric.name}"
    elif args.permutations:
        result = permutation_test(
            *against,
            n_permutations=args.permutations,
            seed=args.seed,
            correction=args.correction,
            alpha=args.alpha,
            **common,
        )
        what = (
            f"{metric.name} to {args.reference!r} for {len(result)} groups, "
            f"{args.permutations} permutations: {int(result['significant'].sum())} significant "
            f"({args.correction}, alpha {args.alpha})"
        )
    else:
        result = onesided(*against, **common)
        what = f"{metric.name} to {args.reference!r} for {len(result)} groups"
    table = result.reset_index()
    if args.bootstrap:
        intervals = bootstrap(
            *against,
            n_bootstrap=args.bootstrap,
            seed=args.seed,
            confidence=args.confidence,
            **common,
        )
        keys = list(intervals.index.names)
        extra = intervals.drop(columns="distance").add_prefix("bootstrap_").reset_index()
        table = table.merge(extra, on=keys, how="left")
        what += f", {args.bootstrap} bootstrap replicates"
    elapsed = time.perf_counter() - started
    out = Path(args.out)
    path = out / f"distances.{args.format}"
    table.columns = [str(c) for c in table.columns]
    write_atomic(path, lambda p: getattr(table, f"to_{args.format}")(p, index=False))
    written = [path]
    if not args.no_figure:
        values = result["distance"] if args.permutations else result
        figure = distance_figure(values, title=f"{metric.name} ({args.groupby})")
        name = "heatmap.png" if args.reference is None else "distances.png"
        write_atomic(out / name, lambda p: figure.savefig(p, dpi=120, format="png"))
        written.append(out / name)
    write_run_json(
        out / "run.json",
        "distances",
        {key: value for key, value in vars(args).items() if key != "handler"},
        seconds=round(elapsed, 3),
    )
    print(f"{args.data}: {what} in {elapsed:.1f} s")
    print("wrote " + ", ".join(str(p) for p in written) + f" and {out / 'run.json'}")
    return 0
