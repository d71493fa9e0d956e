"""``scperteval calibrate``: which protocols can be trusted on a dataset."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scperteval.cli._options import (
    add_command,
    add_engine_options,
    add_input_argument,
    add_thresholds_option,
    cluster_client,
    engine_kwargs,
    input_data,
    parse_thresholds,
    print_run_notes,
)


def add_parser(commands: Any) -> None:
    """Register the ``calibrate`` subcommand."""
    parser = add_command(
        commands,
        "calibrate",
        run,
        "score positive and negative controls and judge each protocol",
        "Score each protocol's positive control (a technical or interpolated duplicate "
        "of the truth) and negative control (dataset mean, control mean, other cells), "
        "and report the dynamic range fraction (DRF) and bound discrimination score "
        "(BDS) that tell whether the protocol can be trusted on this dataset.",
    )
    add_input_argument(parser, "run on a small simulated dataset")
    add_engine_options(
        parser,
        protocols_help="suite name (default, miller2025, ahlmann_eltze2025, vcc2025), a .toml "
        "path, or comma-separated protocol names (e.g. pearson_delta_ctrl,mse_top_k=30)",
        seed_help="seed of halves and samples",
        de_method_help="DE behind top-k spaces, DEG weights and DE protocols",
    )
    add_thresholds_option(parser)
    parser.add_argument(
        "--min-perturbations",
        type=int,
        default=10,
        metavar="N",
        help="fewest perturbations with both controls for a protocol to be trusted (default "
        "10, the rule of score and report)",
    )
    parser.add_argument(
        "--split",
        default=None,
        metavar="PATH",
        help="calibrate under a split: a table (.csv, .tsv, .parquet) of perturbation -> fold "
        "or role, or obs:COLUMN; only held-out perturbations are scored, the negative "
        "controls pool each fold's training perturbations, and verdict_changes.csv says "
        "which verdicts change against the unsplit calibration",
    )
    parser.add_argument("--out", required=True, help="output folder")


def run(args: argparse.Namespace) -> int:
    """Run ``scperteval calibrate``."""
    from scperteval.workflows.calibrate import calibrate

    thresholds = parse_thresholds(args.thresholds)
    data = input_data(args)
    options = engine_kwargs(args)
    with cluster_client(args.scheduler) as client:
        result = calibrate(
            data,
            **options,
            executor=client,
            thresholds=thresholds,
            out=args.out,
            min_perturbations=args.min_perturbations,
            split=args.split,
        )
    out = Path(args.out)
    print(result.summary(str(out / "failures.csv")))
    print_run_notes(result.info, args.min_cells)
    total = result.info.get("timings_seconds", {}).get("total", float("nan"))
    tables = [out / "results.parquet", out / "calibration.csv"]
    if not result.verdict_changes.empty:
        tables.append(out / "verdict_changes.csv")
    print(f"finished in {total:.1f} s; wrote {', '.join(map(str, tables))} and {out / 'run.json'}")
    return 0
