"""``scperteval split``: a seeded K-fold split of the perturbations, or the user's checked."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from scperteval.cli._options import (
    add_command,
    add_dataset_options,
    add_input_argument,
    dataset_kwargs,
    input_data,
)
from scperteval.errors import SpecError

__all__ = ["add_parser", "run", "summary"]

DEFAULT_FOLDS = 5


def add_parser(commands: Any) -> None:
    """Register the ``split`` subcommand."""
    split = add_command(
        commands,
        "split",
        run,
        "split the perturbations into cross-validation folds",
        "Deal the perturbations of each covariate group into K seeded folds (every "
        "perturbation held out by exactly one fold), or check a split of your own "
        "against the data (--from), and write it as a table (.csv, .tsv, .parquet) "
        "with, for each combination A+B, how many of its singles each fold trains on.",
    )
    add_input_argument(split, "split a small simulated dataset (12 perturbations, 2 cell lines)")
    add_dataset_options(split)
    split.add_argument(
        "--folds", type=int, default=None, help=f"number of folds (default {DEFAULT_FOLDS})"
    )
    split.add_argument("--seed", type=int, default=None, help="seed of the deal (default 0)")
    split.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="TABLE|obs:COLUMN",
        help="check this split instead of drawing one: a table of perturbation and fold "
        "(or role: train/val/test), optionally covariate, or an obs column",
    )
    split.add_argument("--out", required=True, help="table to write (.csv, .tsv or .parquet)")


def run(args: argparse.Namespace) -> int:
    """Run ``scperteval split``."""
    from scperteval.data.load import load_dataset
    from scperteval.splits import make_folds, read_split, write_split
    from scperteval.splits.folds import check_seed
    from scperteval.splits.table import check_table_path

    if args.source is not None and (args.folds is not None or args.seed is not None):
        raise SpecError("--from reads a split as it is; leave out --folds and --seed")
    folds = DEFAULT_FOLDS if args.folds is None else args.folds
    seed = 0 if args.seed is None else args.seed
    check_seed(seed)
    if folds < 2:
        raise SpecError(
            f"--folds must be at least 2, got {folds}; each fold trains on the perturbations "
            "the other folds hold out"
        )
    check_table_path(args.out, writing=True)
    if args.source is not None and not str(args.source).startswith("obs:"):
        check_table_path(args.source, writing=False)
    dataset = load_dataset(input_data(args), **dataset_kwargs(args))
    if args.source is None:
        split = make_folds(dataset, folds=folds, seed=seed)
    else:
        split = read_split(args.source, dataset)
    perturbations = [(c.covariate, c.perturbation) for c in dataset.conditions]
    write_split(split, args.out, perturbations)
    print(summary(split, args.out))
    return 0


def summary(split: Any, out: str) -> str:
    """One line: where, how many folds of how many perturbations, the combinations' counts."""
    sizes = [len(split.test[fold]) for fold in split.folds]
    seeded = "" if split.seed is None else f", seed {split.seed}"
    seen = Counter(
        category
        for fold in split.folds
        for perturbation in split.test[fold]
        if (category := split.category(fold, perturbation)) is not None
    )
    counts = range(max(seen) + 1) if seen else range(0)
    combinations = (
        f"; combinations whose test fold trains on {', '.join(map(str, counts))} of their "
        f"singles: {', '.join(str(seen[count]) for count in counts)}"
        if seen
        else ""
    )
    return (
        f"wrote {out}: {len(split.folds)} fold(s) holding out {sum(sizes)} perturbations "
        f"({min(sizes)}-{max(sizes)} per fold){seeded}{combinations}; "
        f"sha256 {split.digest()[:12]}"
    )
