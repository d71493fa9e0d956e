"""What ``scperteval score`` and ``scperteval report`` print: the verdict in plain lines."""

from __future__ import annotations

from typing import Any

from scperteval.reporting.formatting import headline_frame, trust_terms

__all__ = ["terminal_lines"]


def terminal_lines(result: Any) -> list[str]:
    """The headline table, its definition, each protocol's verdict and the flags.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.

    Returns
    -------
    list of str
        Lines to print: the compact leaderboard (3 significant digits), the
        score's definition, notes (entries listed apart), the sanity flags per
        model, and one sentence per protocol saying whether it is trusted.

    """
    board = result.leaderboard
    frame = headline_frame(board)
    lines = frame.to_string(index=False).splitlines()
    lines.append(board.definition)
    lines += board.notes
    lines += [f"FLAG {name}: {flag}" for name, flags in board.flags.items() for flag in flags]
    if board.calibrated and board.verdicts:
        lines.append(trust_terms())
        for protocol, sentence in board.verdicts.items():
            lines.append(f"  {protocol}: {sentence}")
    return lines
