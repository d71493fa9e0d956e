"""Checks of a dataset's reading options and hints for labels that do not match.

The one-line errors of :class:`~scperteval.data.dataset.Dataset` name what would
fix them: the column that holds the control label, the labels that look like
controls in other tools' conventions (``non-targeting``, ``NT``, ``DMSO``, ...).
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from scperteval.errors import DatasetError

__all__ = [
    "CONTROL_LIKE",
    "check_reading_options",
    "control_label_hint",
    "listing",
    "looks_like_control",
    "unmatched_listing",
]


def check_reading_options(
    perturbation_key: Any,
    covariate_key: Any,
    min_cells: Any,
    subset: Any,
    backed: Any,
    chunk_cells: Any,
) -> None:
    """Refuse reading options of the wrong kind before the file is opened."""
    if not isinstance(perturbation_key, str) or not perturbation_key:
        raise DatasetError(f"perturbation_key must be a column name, got {perturbation_key!r}")
    if covariate_key is not None and covariate_key == perturbation_key:
        raise DatasetError(
            f"the covariate column and the perturbation column are both {covariate_key!r}; "
            "the covariate is another column (cell line, cell type), or none"
        )
    if not _whole(min_cells):
        raise DatasetError(f"min_cells must be a whole number, got {min_cells!r}")
    if subset is not None and not isinstance(subset, Mapping):
        raise DatasetError(
            f"subset must map obs columns to accepted values, e.g. {{'dataset': 'norman19'}}, "
            f"got {type(subset).__name__} {subset!r}"
        )
    if backed not in (True, False, "auto"):
        raise DatasetError(f"backed must be True, False or 'auto', got {backed!r}")
    if chunk_cells is not None and not (_whole(chunk_cells) and chunk_cells >= 1):
        raise DatasetError(f"chunk_cells must be a whole number of at least 1, got {chunk_cells!r}")


def _whole(value: Any) -> bool:
    """Whether ``value`` is an integer (``True`` and ``False`` are not counts)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


#: Fragments of labels that other tools and screens use for control cells.
CONTROL_LIKE = (
    "control",
    "ctrl",
    "non-targeting",
    "nontargeting",
    "non_targeting",
    "safe-targeting",
    "scramble",
    "dmso",
    "vehicle",
    "untreated",
    "mock",
)
_CONTROL_LIKE_EXACT = ("nt", "ntc", "neg", "wt")


def looks_like_control(label: str) -> bool:
    """Whether a label reads like a control label (``non-targeting``, ``DMSO``, ``NT``, ...)."""
    lowered = str(label).lower()
    return lowered in _CONTROL_LIKE_EXACT or any(part in lowered for part in CONTROL_LIKE)


def control_label_hint(labels: Sequence[str]) -> str:
    """The labels that look like controls first, then the others."""
    controls = [label for label in labels if looks_like_control(label)]
    others = [label for label in labels if not looks_like_control(label)]
    if not controls:
        return f"no label looks like a control; available labels: {listing(others)}"
    return (
        f"labels that look like controls: {listing(controls)} (--control-label); "
        f"other labels: {listing(others, limit=6)}"
    )


def listing(values: Sequence[Any], limit: int = 12) -> str:
    """The first ``limit`` values, quoted, and how many more there are, for messages."""
    shown = ", ".join(repr(v) if isinstance(v, str) else str(v) for v in list(values)[:limit])
    extra = len(values) - limit
    return shown + (f", ... ({extra} more)" if extra > 0 else "")


def unmatched_listing(missing: Sequence[Any], known: Sequence[Any], limit: int = 12) -> str:
    """Labels that were not found, quoted with escapes, each with the nearest known label.

    A label that differs from a known one by a trailing space, a tab or the case is
    printed so that the difference can be seen (``'MAPK1 '``), with the known label
    it comes closest to: ``'MAPK1 ' (nearest: 'MAPK1')``.

    Parameters
    ----------
    missing
        The labels that were not found.
    known
        The labels that exist (the truth's, a column's groups, ...).
    limit
        Labels shown at most; the rest are counted.

    Returns
    -------
    str
        The listing, for a message.

    """
    choices = [str(k) for k in known]
    by_form: dict[str, str] = {}
    for choice in choices:
        by_form.setdefault(choice.strip().casefold(), choice)
    shown = []
    for label in list(missing)[:limit]:
        text = str(label)
        nearest = by_form.get(text.strip().casefold())
        if nearest is None:
            close = difflib.get_close_matches(text, choices, n=1, cutoff=0.75)
            nearest = close[0] if close else None
        hint = f" (nearest: {nearest!r})" if nearest is not None and nearest != text else ""
        shown.append(f"{text!r}{hint}")
    extra = len(missing) - limit
    return ", ".join(shown) + (f", ... ({extra} more)" if extra > 0 else "")
