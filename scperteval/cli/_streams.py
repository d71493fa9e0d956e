"""Standard output that may go away: a closed pipe or a full disk ends the program quietly.

``scperteval score ... | head -1`` closes the pipe after one line; a shell reports
a program stopped that way with status 141 (128 + SIGPIPE), and prints nothing.
A full disk (``> /dev/full``) is an error the user should hear of: one line on
standard error and status 1. Either way there is no traceback, and the rest of
the output goes to the null device so that the interpreter's own last flush does
not fail again.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

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
