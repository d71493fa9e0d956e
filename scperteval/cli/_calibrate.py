"""``scperteval calibrate``: which protocols can be trusted on a dataset."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scperteval.cli._options import (
    add_compute_options,
    add_dataset_options,
    add_de_table_option,
    add_scheduler_option,
    cluster_client,
    compute_kwargs,
    dataset_kwargs,
    left_out_line,
    population_cap_line,
)


def add_parser(commands: Any) -> None:
    """Register the ``calibrate`` subcommand."""
    parser = commands.add_parser(
        "calibrate",
        help="score positive and negative controls and judge each protocol",
        description=(
            "Score each protocol's positive control (a technical or interpolated duplicate "
            "of the truth) and negative control (dataset mean, control mean, other cells), "
            "and report the dynamic range fraction (DRF) and bound discrimination score "
            "(BDS) that tell whether the protocol can be trusted on this dataset."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("data", nargs="?", help="input .h5ad file (log-normalised)")
    source.add_argument("--example", action="store_true", help="run on a small simulated dataset")
    parser.add_argument(
        "-p",
        "--protocols",
        default="default",
        help="suite name (default, miller2025, ahlmann_eltze2025, vcc2025), a .toml path, "
        "or comma-separated protocol names (e.g. pearson_delta_ctrl,mse_top_k=30)",
    )
    add_dataset_options(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of halves and samples")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="threads (default: the CPU cores available, at most 8)",
    )
    add_compute_options(parser)
    add_scheduler_option(parser)
    parser.add_argument(
        "--de-method",
        default="t-test",
        choices=["t-test", "t-test_overestim_var", "wilcoxon"],
        help="DE behind top-k spaces, DEG weights and DE protocols",
    )
    add_de_table_option(parser)
    parser.add_argument(
        "--thresholds",
        default="",
        metavar="bds=0.75,drf=0.2,statistic=median",
        help="when a protocol is trusted (defaults shown)",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``scperteval calibrate``."""
    from scperteval.engine.calibrators import Thresholds
    from scperteval.errors import SpecError
    from scperteval.workflows.calibrate import calibrate

    try:
        thresholds = Thresholds.parse(args.thresholds)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    options = dataset_kwargs(args)
    if args.example:
        from scperteval.cli._de import EXAMPLE_SETTINGS
        from scperteval.simulation import simulate

        data: Any = simulate(**EXAMPLE_SETTINGS)
        options["perturbation_key"] = "perturbation"
        options["covariate_key"] = options["covariate_key"] or "cell_line"
    else:
        data = args.data
    with cluster_client(args.scheduler) as client:
        result = calibrate(
            data,
            protocols=args.protocols,
            **options,
            seed=args.seed,
            de_method=args.de_method,
            workers=args.workers,
            **compute_kwargs(args),
            executor=client,
            thresholds=thresholds,
            out=args.out,
            de_tables=args.de_table,
        )
    print(result.summary())
    for line in (left_out_line(result.info, args.min_cells), population_cap_line(result.info)):
        if line:
            print(line)
    total = result.info.get("timings_seconds", {}).get("total", float("nan"))
    out = Path(args.out)
    print(
        f"finished in {total:.1f} s; wrote {out / 'results.parquet'}, "
        f"{out / 'calibration.csv'} and {out / 'run.json'}"
    )
    return 0
