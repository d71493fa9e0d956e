"""Progress reporting that shows a bar on a terminal and stays silent elsewhere."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["progress_bar", "cell_progress"]


class _Silent:
    """Stands in for a bar when none is shown (no tqdm import, no widget warnings)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0

    def update(self, count: int = 1) -> None:
        self.n += count

    def refresh(self) -> None:
        """Nothing to redraw."""

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def progress_bar(
    description: str, total: int, enabled: bool | None = None, unit: str = "cells"
) -> Any:
    """A tqdm bar on a terminal (stderr), or a silent object when not interactive.

    Parameters
    ----------
    description
        Label of the bar.
    total
        Number of units of work.
    enabled
        Force the bar on or off; by default shown only when stderr is a terminal.
    unit
        What is counted (``cells``, ``tasks``), shown with the count done and the total.

    """
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        return _Silent(total)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, unit=unit, leave=False, file=sys.stderr)


def cell_progress(bar: Any) -> Callable[[int, int], None]:
    """Adapt a bar to the ``(done, total)`` callback of :class:`~scperteval.context.Context`."""

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update
