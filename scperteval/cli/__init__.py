"""The ``scperteval`` command line."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from scperteval._version import __version__
from scperteval.cli import _de, _demo, _distances, _listing, _score, _split

#: Commands whose ``--out`` is a folder of results (``split`` writes one table).
FOLDER_OUTPUT_COMMANDS = ("demo", "de", "calibrate", "score", "report", "distances")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="scperteval",
        description="Calibrated benchmarking of single-cell perturbation response predictions.",
    )
    parser.add_argument("--version", action="version", version=f"scperteval {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (_demo, _de, _score, _distances, _listing, _split):
        module.add_parser(commands)
    # Every option's help shows its default (perturbation key, control label, seed, ...).
    for subparser in commands.choices.values():
        subparser.formatter_class = DefaultsHelpFormatter
    for name in FOLDER_OUTPUT_COMMANDS:
        commands.choices[name].add_argument(
            "--overwrite",
            action="store_true",
            help="write into --out even when it holds another command's run or files "
            "scperteval did not write",
        )
    return parser


#: The collector's youngest-generation threshold in the ``scperteval`` program.
GC_THRESHOLD = 10_000


def console_main() -> int:
    """The ``scperteval`` program: :func:`main` in a process of its own.

    A run makes many short-lived containers (result rows, metric contexts, spaces'
    names); at Python's default threshold (700 allocations) the cyclic collector
    runs hundreds of times and walks the long-lived objects of the loaded modules
    each time (0.27 s of a 2.8 s Norman calibration), at 10,000 about 30 times
    (0.11 s). Before the interpreter exits, the objects still alive are frozen, so
    that its shutdown does not walk the whole heap once more (0.5 s, now 0.08 s);
    every file has been written and closed by then. Only the program does this: a
    library must not change the collector of the process that imports it, and
    :func:`main` called from Python leaves it as it is.

    Returns
    -------
    int
        The exit status.

    """
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    stdout = sys.stdout
    sys.stdout = GuardedOutput(stdout)  # type: ignore[assignment]
    try:
        code = main()
        sys.stdout.flush()
        return code
    except OutputLost as lost:
        return ended_output(lost, stdout)
    finally:
        sys.stdout = stdout
        gc.freeze()


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, unless it is empty or already said."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, "", [])
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    from scperteval.errors import ScpertevalError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    # Signal handlers can only be set from the main thread (not, e.g., from a worker).
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main else None
    try:
        _check_out(args)
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return int(args.handler(args))
    except ScpertevalError as exc:
        print(f"scperteval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("scperteval: interrupted; nothing was written", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # Tasks still running on worker threads would otherwise hold up the exit until
        # they finish; the output was staged and is already removed.
        os._exit(INTERRUPTED)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _check_out(args: argparse.Namespace) -> None:
    """``--out``: a folder this command may write into, checked before any work."""
    from scperteval.outputs import check_folder_owner, check_output_folder

    out = getattr(args, "out", None)
    if out is None or args.command not in FOLDER_OUTPUT_COMMANDS:
        return
    check_output_folder(out)
    check_folder_owner(out, args.command, overwrite=getattr(args, "overwrite", False))


#: Exit status after Ctrl-C or SIGTERM (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM stops a run as Ctrl-C does."""
    raise KeyboardInterrupt


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """The package's own warnings as one line; others as Python prints them."""
    from scperteval.errors import ScpertevalWarning

    if issubclass(category, ScpertevalWarning):
        print(f"scperteval: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


# Standard output may go away: a closed pipe or a full disk ends the program quietly.
# ``scperteval score ... | head -1`` closes the pipe after one line; a shell reports
# a program stopped that way with status 141 (128 + SIGPIPE), and prints nothing.
# A full disk (``> /dev/full``) is an error the user should hear of: one line on
# standard error and status 1. Either way there is no traceback, and the rest of
# the output goes to the null device so that the interpreter's own last flush does
# not fail again.

#: Exit status of a program whose output pipe was closed (128 + SIGPIPE, as shells report it).
BROKEN_PIPE = 141

#: Exit status after standard output could not be written (a full disk).
OUTPUT_FAILED = 1


class OutputLost(Exception):
    """Standard output could not be written; ``error`` says why."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class GuardedOutput:
    """A text stream that turns a failed write or flush into :class:`OutputLost`."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` to the stream."""
        try:
            return self.stream.write(text)
        except OSError as error:
            raise OutputLost(error) from None

    def flush(self) -> None:
        """Flush the stream."""
        try:
            self.stream.flush()
        except OSError as error:
            raise OutputLost(error) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def ended_output(lost: OutputLost, stream: TextIO) -> int:
    """Send the rest of ``stream`` to the null device; the exit status, said once if need be.

    Parameters
    ----------
    lost
        Why standard output failed.
    stream
        The real standard output.

    Returns
    -------
    int
        :data:`BROKEN_PIPE` for a closed pipe (nothing printed), else
        :data:`OUTPUT_FAILED` with one ``error:`` line on standard error.

    """
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError):  # a stream without a file descriptor (captured output)
        pass
    if isinstance(lost.error, BrokenPipeError):
        return BROKEN_PIPE
    reason = lost.error.strerror or str(lost.error)
    print(f"scperteval: error: cannot write to standard output ({reason})", file=sys.stderr)
    return OUTPUT_FAILED


if __name__ == "__main__":
    raise SystemExit(console_main())
