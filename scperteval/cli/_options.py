"""Options shared by several subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from scperteval.errors import SpecError


def add_dataset_options(parser: argparse.ArgumentParser) -> None:
    """Options that say how to read the perturbation dataset."""
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
    reading = group.add_mutually_exclusive_group()
    reading.add_argument(
        "--backed",
        dest="backed",
        action="store_const",
        const=True,
        default="auto",
        help="leave the matrix on disk and read it in chunks of cells (default: when the "
        "file is larger than a third of the available memory)",
    )
    reading.add_argument(
        "--in-memory", dest="backed", action="store_const", const=False, help="load the file"
    )
    group.add_argument(
        "--chunk-cells",
        type=int,
        default=None,
        help="cells read at a time from a backed file (default 50000)",
    )


def parse_subset(items: Sequence[str]) -> dict[str, Any]:
    """``["dataset=norman19"]`` -> ``{"dataset": ["norman19"]}``."""
    subset: dict[str, Any] = {}
    for item in items:
        column, sep, value = item.partition("=")
        if not sep or not column:
            raise SpecError(f"--subset expects COLUMN=VALUE, got {item!r}")
        subset[column] = value.split(",")
    return subset


def dataset_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of the Python API from the dataset options."""
    return {
        "perturbation_key": args.perturbation_key,
        "control_label": args.control_label,
        "covariate_key": args.covariate_key,
        "layer": args.layer,
        "min_cells": args.min_cells,
        "normalize": args.normalize,
        "subset": parse_subset(args.subset),
        "backed": args.backed,
        "chunk_cells": args.chunk_cells,
    }


def add_compute_options(parser: argparse.ArgumentParser) -> None:
    """Options that say where the population metrics are computed."""
    group = parser.add_argument_group("computation")
    group.add_argument(
        "--device",
        default="numpy",
        metavar="numpy|cpu|cuda[:N]",
        help="energy distance, MMD and Sinkhorn with torch on this device; "
        "numpy (default) is the reference",
    )
    group.add_argument(
        "--precision",
        default="float64",
        choices=["float64", "float32"],
        help="float32 only with a torch device (faster on a GPU; see the torch docs)",
    )
    group.add_argument(
        "--max-population-cells",
        default=None,
        metavar="N|all",
        help="cells energy distance, MMD and Sinkhorn use of each population at most, "
        "a seeded sample (default 2000); 'all' uses every cell",
    )


def compute_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of the Python API from the computation options."""
    device = None if args.device in (None, "", "numpy") else args.device
    options: dict[str, Any] = {"device": device, "precision": args.precision}
    if args.max_population_cells is not None:
        from scperteval.engine.population_cap import check_max_population_cells

        try:
            cap = check_max_population_cells(args.max_population_cells)
        except SpecError:
            raise SpecError(
                "--max-population-cells must be a whole number of at least 2 or 'all', "
                f"got {args.max_population_cells!r}"
            ) from None
        options["max_population_cells"] = cap
    return options


def add_de_table_option(parser: argparse.ArgumentParser) -> None:
    """``--de-table PATH``: read the truth's DE instead of computing it."""
    parser.add_argument(
        "--de-table",
        action="append",
        default=[],
        metavar="PATH",
        help="differential expression computed earlier, read instead of computed "
        "(repeatable): a 'scperteval de' output folder, or a cell-eval/pdex table "
        "(.csv/.parquet with target, feature, p_value, fdr, log2_fold_change, statistic)",
    )


def add_scheduler_option(parser: argparse.ArgumentParser) -> None:
    """``--scheduler ADDRESS``: compute on a running dask cluster."""
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="address of a running dask scheduler (e.g. tcp://host:8786): compute the "
        "group statistics and protocol tasks on its workers, with the same results "
        "(needs scperteval[dask]; --workers is then ignored)",
    )


@contextmanager
def cluster_client(address: str | None) -> Iterator[Any]:
    """A dask client connected to ``address`` for the block, or ``None`` without one."""
    if address is None:
        yield None
        return
    from scperteval.engine.distributed import connect

    client = connect(address)
    try:
        yield client
    finally:
        client.close()


def population_cap_line(info: dict[str, Any]) -> str | None:
    """The populations the cell cap subsampled, as one line (or None when it cut none)."""
    cap = info.get("population_cap") or {}
    count = cap.get("n_subsampled", 0)
    if not count:
        return None
    sources = ", ".join(f"{name} {n}" for name, n in cap.get("by_source", {}).items())
    return (
        f"population protocols used a seeded sample of {cap['max_population_cells']} cells "
        f"of {count} larger population(s) ({sources}); --max-population-cells all uses "
        "every cell"
    )


def left_out_line(info: dict[str, Any], min_cells: int) -> str | None:
    """The perturbations a run left out for having too few cells, as one line (or None)."""
    left_out = info.get("left_out") or []
    if not left_out:
        return None
    shown = ", ".join(
        f"{item['perturbation']}"
        + ("" if item["covariate"] == "all" else f" ({item['covariate']})")
        + f": {item['cells']}"
        for item in left_out[:10]
    )
    more = f" and {len(left_out) - 10} more" if len(left_out) > 10 else ""
    return (
        f"left out {len(left_out)} perturbation(s) with fewer than {min_cells} cells "
        f"(cells): {shown}{more}"
    )
