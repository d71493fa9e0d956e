"""The rows of a run's tidy table: one value of one protocol for one candidate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine
    from scperteval.engine.protocol import Protocol

__all__ = ["RESULT_COLUMNS", "SUBSAMPLED", "UNDEFINED_REASON", "failure_reason", "result_row"]

RESULT_COLUMNS = (
    "covariate",
    "perturbation",
    "protocol",
    "source",
    "source_name",
    "value",
    "reason",
)

#: Key of a row's populations subsampled by the cap (taken out before the table is built).
SUBSAMPLED = "_subsampled"
#: The ``reason`` of a NaN that the metric itself returned (as opposed to a failure).
UNDEFINED_REASON = "metric undefined on these inputs"


def result_row(
    engine: Engine,
    condition: int,
    protocol: Protocol,
    role: str,
    name: str,
    value: float,
    reason: str,
) -> dict[str, Any]:
    """One row of the table: a candidate's value of a protocol for one perturbation.

    Parameters
    ----------
    engine
        The run's engine (it names the perturbation and its covariate group).
    condition
        Index of the perturbation.
    protocol
        The protocol.
    role
        ``"positive"``, ``"negative"`` or ``"model"``.
    name
        The candidate's name.
    value
        The metric's value (NaN when undefined or failed).
    reason
        Why the value is NaN, else ``""``.

    Returns
    -------
    dict
        The row, keyed by :data:`RESULT_COLUMNS`.

    """
    target = engine.context.layout.conditions[condition]
    fields = (target.covariate, target.perturbation, protocol.name, role, name, value, reason)
    return dict(zip(RESULT_COLUMNS, fields, strict=True))


def failure_reason(exc: BaseException) -> str:
    """The ``reason`` recorded for a value whose computation raised ``exc``."""
    return f"{type(exc).__name__}: {exc}"
