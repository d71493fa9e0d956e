"""``scperteval calibrate``, ``score`` and ``report``: calibration and calibrated leaderboards."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scperteval.cli._options import (
    add_command,
    add_engine_options,
    add_input_argument,
    add_quiet_option,
    add_thresholds_option,
    cluster_client,
    engine_kwargs,
    input_data,
    parse_thresholds,
    print_run_notes,
    progress_setting,
)
from scperteval.errors import SpecError


def add_parser(commands: Any) -> None:
    """Register the ``calibrate``, ``score`` and ``report`` subcommands."""
    _add_calibrate_parser(commands)
    score = add_command(
        commands,
        "score",
        run_score,
        "score models and baselines, calibrated, and write a leaderboard report",
        "Score every model's predictions and the built-in baselines against the truth "
        "half, express each score between the negative (0) and positive (1) control, "
        "rank on trusted protocols and write leaderboard tables, figures and report.html.",
        epilog=(
            "Predictions in every accepted form, the gene-matching rules, the scale they "
            "must be on and the delta convention: see 'Bring your own predictions' in the "
            "documentation (docs/predictions.md)."
        ),
    )
    score.add_argument("data", help="truth .h5ad file (log-normalised)")
    score.add_argument(
        "--pred",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a model's predictions (repeatable): .h5ad cells or pseudobulk rows, a "
        ".csv/.tsv/.parquet table (one row per perturbation, one column per gene) or an "
        ".npz with X, perturbations and genes; or a folder of such files",
    )
    score.add_argument(
        "--delta",
        action="append",
        default=[],
        metavar="NAME",
        help="model NAME predicts changes from the control mean (repeatable); the "
        "measured control mean is added back before scoring",
    )
    score.add_argument(
        "--control-from-predictions",
        action="store_true",
        help="take each model's deltas, DE and energy distances against the control from "
        "its own predicted control cells (rows labelled with the control label), as "
        "cell-eval does; needs --truth all (default: the measured control cells)",
    )
    add_engine_options(score, protocols_help="suite, .toml or names")
    score.add_argument(
        "--truth",
        default="half",
        choices=["half", "all"],
        help="half: calibrated scores vs the truth half (default); all: plain scores",
    )
    score.add_argument(
        "--no-baselines", action="store_true", help="do not score the built-in baselines"
    )
    score.add_argument(
        "--allow-missing", action="store_true", help="score models that miss perturbations"
    )
    _add_split_option(
        score,
        "score under a split: a table (.csv, .tsv, .parquet) of perturbation -> fold "
        "or role (as 'scperteval split' writes), or obs:COLUMN; only held-out perturbations "
        "are scored, baselines and controls use each fold's training perturbations, and a "
        "model may be a folder of one file per fold named by the fold",
    )
    _add_report_options(score)
    score.add_argument("--out", required=True, help="output folder")

    report = add_command(
        commands,
        "report",
        run_report,
        "re-derive calibration, leaderboard and figures from stored results",
        "Rebuild the leaderboard and report from results.parquet without the data; "
        "several folders on the same data (checksum) and seed merge into one leaderboard "
        "(the same model may appear in runs of different protocols; runs that each scored "
        "one fold's predictions under the same split pool into that split's leaderboard); "
        "folders on "
        "different data give a models x datasets summary (datasets.csv/.md/.tex/.html).",
    )
    report.add_argument("folders", nargs="+", help="output folder(s) of scperteval score")
    _add_report_options(report, defaults=False)
    report.add_argument("--out", default=None, help="output folder (default: the input folder)")
    add_quiet_option(report)


def _add_calibrate_parser(commands: Any) -> None:
    """Register the ``calibrate`` subcommand."""
    calibrate = add_command(
        commands,
        "calibrate",
        run_calibrate,
        "score positive and negative controls and judge each protocol",
        "Score each protocol's positive control (a technical or interpolated duplicate "
        "of the truth) and negative control (dataset mean, control mean, other cells), "
        "and report the dynamic range fraction (DRF) and bound discrimination score "
        "(BDS) that tell whether the protocol can be trusted on this dataset.",
    )
    add_input_argument(calibrate, "run on a small simulated dataset")
    add_engine_options(
        calibrate,
        protocols_help="suite name (default, miller2025, ahlmann_eltze2025, vcc2025), a .toml "
        "path, or comma-separated protocol names (e.g. pearson_delta_ctrl,mse_top_k=30)",
        seed_help="seed of halves and samples",
        de_method_help="DE behind top-k spaces, DEG weights and DE protocols",
    )
    add_thresholds_option(calibrate)
    calibrate.add_argument(
        "--min-perturbations",
        type=int,
        default=10,
        metavar="N",
        help="fewest perturbations with both controls for a protocol to be trusted (default "
        "10, the rule of score and report)",
    )
    _add_split_option(
        calibrate,
        "calibrate under a split: a table (.csv, .tsv, .parquet) of perturbation -> fold "
        "or role, or obs:COLUMN; only held-out perturbations are scored, the negative "
        "controls pool each fold's training perturbations, and verdict_changes.csv says "
        "which verdicts change against the unsplit calibration",
    )
    calibrate.add_argument("--out", required=True, help="output folder")


def _add_split_option(parser: argparse.ArgumentParser, text: str) -> None:
    """``--split PATH``: run under a split (``text`` says what changes)."""
    parser.add_argument("--split", default=None, metavar="PATH", help=text)


def _add_report_options(parser: argparse.ArgumentParser, defaults: bool = True) -> None:
    add_thresholds_option(parser, default="" if defaults else None)
    parser.add_argument(
        "--aggregate", choices=["mean", "median"], default="median" if defaults else None
    )
    parser.add_argument(
        "--correction", choices=["bonferroni", "bh"], default="bonferroni" if defaults else None
    )
    parser.add_argument(
        "--min-perturbations",
        type=int,
        default=10 if defaults else None,
        metavar="N",
        help="fewest perturbations with both controls for a protocol to be trusted (default 10)",
    )
    parser.add_argument("--no-figures", action="store_true", help="skip the figures")


def _min_perturbations(value: int | None) -> Any:
    if value is not None and value < 1:
        raise SpecError(f"--min-perturbations must be at least 1, got {value}")
    return value


def _print(result: Any, out: Path) -> None:
    if result.info.get("command") == "score":
        for name, record in result.info.get("models", {}).items():
            print(f"{name}: {record.get('read', '')}")
    from scperteval.reporting.terminal import terminal_lines

    for line in terminal_lines(result, str(out / "failures.csv")):
        print(line)
    for line in split_lines(result):
        print(line)
    print(f"report: {out / 'report.html'}")


def split_lines(result: Any) -> list[str]:
    """What a run under a split adds to the terminal: folds, criterion, verdict changes."""
    from scperteval.scoring.verdict_changes import verdict_change_lines

    split = result.info.get("split")
    if not split:
        return []
    sizes = ", ".join(f"{fold}: {n}" for fold, n in split["folds"].items())
    lines = [f"split {split['origin']}: {len(split['folds'])} fold(s) ({sizes} held out)"]
    summary = getattr(result, "fold_summary", None)
    if summary is not None and "outperforms_mean" in summary:
        beating = [str(m) for m in summary.loc[summary["outperforms_mean"].eq(True), "model"]]
        shown = ", ".join(beating) if beating else "none"
        lines.append(
            f"outperforms the training-mean baseline (95% CI of the L2 ratio below 1): {shown}"
        )
    changes = getattr(result, "verdict_changes", None)
    if changes is not None and not changes.empty:
        lines.extend(verdict_change_lines(changes))
    return lines


def run_calibrate(args: argparse.Namespace) -> int:
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


def run_score(args: argparse.Namespace) -> int:
    """Run ``scperteval score``."""
    if not args.pred:
        raise SpecError("give at least one model with --pred NAME=PATH (or a folder)")
    from scperteval.workflows.score import score

    with cluster_client(args.scheduler) as client:
        result = score(
            args.data,
            args.pred,
            **engine_kwargs(args),
            truth=args.truth,
            baselines=not args.no_baselines,
            allow_missing=args.allow_missing,
            deltas=args.delta,
            control="predicted" if args.control_from_predictions else "measured",
            aggregate=args.aggregate,
            thresholds=parse_thresholds(args.thresholds),
            correction=args.correction,
            min_perturbations=_min_perturbations(args.min_perturbations),
            executor=client,
            out=args.out,
            figures=not args.no_figures,
            split=args.split,
        )
    _print(result, Path(args.out))
    print_run_notes(result.info, args.min_cells)
    return 0


def run_report(args: argparse.Namespace) -> int:
    """Run ``scperteval report``."""
    from scperteval.workflows.report import report

    result = report(
        args.folders,
        out=args.out,
        thresholds=parse_thresholds(args.thresholds),
        aggregate=args.aggregate,
        correction=args.correction,
        figures=not args.no_figures,
        min_perturbations=_min_perturbations(args.min_perturbations),
        progress=progress_setting(args),
    )
    if not hasattr(result, "leaderboard"):
        # Runs on several datasets: the models x datasets summary.
        print(result)
        print(f"report: {Path(args.out) / 'datasets.html'}")
        return 0
    _print(result, Path(args.out or args.folders[0]))
    return 0
