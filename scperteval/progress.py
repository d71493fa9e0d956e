"""Progress reporting that shows a bar on a terminal and stays silent elsewhere."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(description: str, total: int, enabled: bool | None = None) -> Any:
    """A tqdm bar on a terminal (stderr), or a no-op object when not interactive.

    Parameters
    ----------
    description
        Label of the bar.
    total
        Number of units of work.
    enabled
        Force the bar on or off; by default shown only when stderr is a terminal.

    """
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, desc=description, disable=not show, unit="cells", leave=False)


def cell_progress(bar: Any) -> Callable[[int, int], None]:
    """Adapt a bar to the ``(done, total)`` callback of :class:`~scperteval.context.Context`."""

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update
