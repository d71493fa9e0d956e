"""Options shared by several subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, closing, nullcontext
from types import MappingProxyType
from typing import Any

from scperteval.errors import SpecError

#: The simulated data of ``--example``.
EXAMPLE_SETTINGS: Mapping[str, Any] = MappingProxyType(
    {
        "n_perturbations": 12,
        "n_genes": 300,
        "cells_per_perturbation": 80,
        "n_covariates": 2,
        "n_combinations": 3,
        "seed": 0,
    }
)
DE_METHOD_CHOICES = ("t-test", "t-test_overestim_var", "wilcoxon")


def add_command(
    commands: Any, name: str, run: Callable[..., int], summary: str, description: str, **texts: str
) -> argparse.ArgumentParser:
    """Register the subcommand ``name``, run by ``run``, and return its parser.

    ``summary`` is its line in the list of commands and ``description`` opens its
    own help; ``texts`` go to ``add_parser`` as well (an ``epilog``).
    """
    parser = commands.add_parser(name, help=summary, description=description, **texts)
    parser.set_defaults(handler=run)
    return parser


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
    add_subset_option(group)
    group.add_argument(
        "--pool",
        action="store_true",
        help="evaluate as one screen cells that an obs column splits into screens reusing "
        "the same perturbation labels (refused by default; or use --subset / --covariate-key)",
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


def add_subset_option(group: Any) -> None:
    """``--subset COLUMN=VALUE`` (read by :func:`parse_subset`)."""
    group.add_argument(
        "--subset",
        action="append",
        default=[],
        metavar="COLUMN=VALUE",
        help="keep cells whose obs COLUMN equals VALUE (repeatable; VALUE may be a,b,c)",
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
    from scperteval.data.load import DATASET_OPTIONS

    options = {key: getattr(args, key) for key in DATASET_OPTIONS}
    return {**options, "subset": parse_subset(args.subset)}


def add_input_argument(parser: argparse.ArgumentParser, example_help: str) -> None:
    """The input file, or ``--example`` for the simulated example instead."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("data", nargs="?", help="input .h5ad file (log-normalised)")
    source.add_argument("--example", action="store_true", help=example_help)


def input_data(args: argparse.Namespace) -> Any:
    """The input path, or the simulated example (whose label columns are then set in ``args``)."""
    if not args.example:
        return args.data
    from scperteval.simulation import simulate

    args.perturbation_key = "perturbation"
    args.covariate_key = args.covariate_key or "cell_line"
    return simulate(**EXAMPLE_SETTINGS)


def add_engine_options(
    parser: argparse.ArgumentParser,
    *,
    protocols_help: str,
    seed_help: str | None = None,
    de_method_help: str | None = None,
) -> None:
    """Options of the jobs that run protocols: protocols, dataset, seed and computation."""
    parser.add_argument("-p", "--protocols", default="default", help=protocols_help)
    add_dataset_options(parser)
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="threads (default: the CPU cores available, at most 8)",
    )
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
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="address of a running dask scheduler (e.g. tcp://host:8786): compute the "
        "group statistics and protocol tasks on its workers, with the same results "
        "(needs scperteval[dask]; --workers is then ignored)",
    )
    add_quiet_option(parser)
    parser.add_argument(
        "--de-method", default="t-test", choices=DE_METHOD_CHOICES, help=de_method_help
    )
    parser.add_argument(
        "--de-table",
        action="append",
        default=[],
        metavar="PATH",
        help="differential expression computed earlier, read instead of computed "
        "(repeatable): a 'scperteval de' output folder, or a cell-eval/pdex table "
        "(.csv/.parquet with target, feature, p_value, fdr, log2_fold_change, statistic)",
    )


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress bars (they are shown only when stderr is a terminal)."""
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars (shown on stderr only when it is a terminal)",
    )


def progress_setting(args: argparse.Namespace) -> bool | None:
    """``progress=`` of the Python API: off with ``--quiet``, else when stderr is a terminal."""
    return False if getattr(args, "quiet", False) else None


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of ``calibrate`` and ``score`` from :func:`add_engine_options`."""
    options: dict[str, Any] = {
        "protocols": args.protocols,
        **dataset_kwargs(args),
        "seed": args.seed,
        "de_method": args.de_method,
        "workers": args.workers,
        "device": None if args.device in (None, "", "numpy") else args.device,
        "precision": args.precision,
        "de_tables": args.de_table,
        "progress": progress_setting(args),
    }
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


def add_thresholds_option(parser: argparse.ArgumentParser, default: str | None = "") -> None:
    """``--thresholds``: when a protocol is trusted (``None`` keeps the stored ones)."""
    parser.add_argument(
        "--thresholds",
        default=default,
        metavar="bds=0.75,drf=0.2,statistic=median",
        help="when a protocol is trusted (defaults shown)",
    )


def parse_thresholds(text: str | None) -> Any:
    """``--thresholds`` as :class:`~scperteval.engine.calibrators.Thresholds` (``None`` kept)."""
    from scperteval.engine.calibrators import Thresholds

    if text is None:
        return None
    try:
        return Thresholds.parse(text)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def cluster_client(address: str | None) -> AbstractContextManager[Any]:
    """A dask client connected to ``address`` for the block, or ``None`` without one."""
    if address is None:
        return nullcontext()
    from scperteval.engine.distributed import connect

    return closing(connect(address))


def print_run_notes(info: dict[str, Any], min_cells: int) -> None:
    """Print the perturbations left out for too few cells and the populations the cap cut."""
    left_out = info.get("left_out") or []
    if left_out:
        shown = ", ".join(
            f"{item['perturbation']}"
            + ("" if item["covariate"] == "all" else f" ({item['covariate']})")
            + f": {item['cells']}"
            for item in left_out[:10]
        )
        more = f" and {len(left_out) - 10} more" if len(left_out) > 10 else ""
        print(
            f"left out {len(left_out)} perturbation(s) with fewer than {min_cells} cells "
            f"(cells): {shown}{more}"
        )
    cap = info.get("population_cap") or {}
    if cap.get("n_subsampled", 0):
        sources = ", ".join(f"{name} {n}" for name, n in cap.get("by_source", {}).items())
        print(
            f"population protocols used a seeded sample of {cap['max_population_cells']} "
            f"cells of {cap['n_subsampled']} larger population(s) ({sources}); "
            "--max-population-cells all uses every cell"
        )
