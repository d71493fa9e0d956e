"""The ``scperteval`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scperteval._version import __version__
from scperteval.cli import _calibrate, _de, _demo, _listing, _score


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="scperteval",
        description="Calibrated benchmarking of single-cell perturbation response predictions.",
    )
    parser.add_argument("--version", action="version", version=f"scperteval {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (_demo, _de, _calibrate, _score, _listing):
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    from scperteval.errors import ScpertevalError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.handler(args))
    except ScpertevalError as exc:
        print(f"scperteval: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
