"""Candidates: what a run scores against the truth (controls, models, baselines)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from scperteval.engine.control_views import CONTROL_REPRESENTATIONS
from scperteval.engine.engine import Engine
from scperteval.engine.protocol import Protocol
from scperteval.engine.sources import SourceData

__all__ = ["CONTROLS", "Candidate", "SourceGetter", "candidate_identity", "candidate_key"]

SourceGetter = Callable[[Engine, int], SourceData]


@dataclass(frozen=True)
class Candidate:
    """Something scored against the truth.

    Attributes
    ----------
    role
        ``positive``, ``negative``, ``model`` or ``baseline`` (the ``source`` column).
    name
        Its name (the ``source_name`` column): a source or model name, or
        ``None`` to use the protocol's own positive/negative control.
    getter
        Returns its data for a condition; ``None`` for a protocol's control.

    """

    role: str
    name: str | None = None
    getter: SourceGetter | None = None

    def resolve(self, protocol: Protocol) -> tuple[str, SourceGetter]:
        """Source name and data getter of this candidate for a protocol."""
        if self.getter is not None and self.name is not None:
            return self.name, self.getter
        name = self.name or (protocol.positive if self.role == "positive" else protocol.negative)
        return name, lambda engine, condition: engine.source(name, condition)


CONTROLS = (Candidate("positive"), Candidate("negative"))


def candidate_key(
    protocol: Protocol, name: str, getter: SourceGetter, registered: bool
) -> Hashable | None:
    """Key under which a candidate's views are shared by protocols, or ``None``.

    Views against the control and cells in a space (population views): a registered
    source is fixed for the engine, so its name identifies it; a model or baseline is
    identified by its getter too, so that two runs on one engine never share.

    Parameters
    ----------
    protocol
        The protocol the views are for.
    name
        The candidate's name.
    getter
        The function giving the candidate's source of a perturbation.
    registered
        Whether the candidate is one of the engine's registered sources.

    Returns
    -------
    collections.abc.Hashable or None
        The key, or ``None`` for representations whose views are not shared.

    """
    if protocol.representation not in (*CONTROL_REPRESENTATIONS, "population"):
        return None
    return candidate_identity(name, getter, registered)


def candidate_identity(name: str, getter: SourceGetter, registered: bool) -> Hashable:
    """What tells a candidate apart in the engine's caches.

    Parameters
    ----------
    name, getter
        As for :func:`candidate_key`.
    registered
        Whether it is one of the engine's registered sources (its name then
        identifies it; a model's getter is part of its identity).

    Returns
    -------
    collections.abc.Hashable
        The name, or ``("candidate", name, getter)``.

    """
    return name if registered else ("candidate", name, getter)
