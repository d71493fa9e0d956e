"""The metric registry, kept apart so that metric modules can register without import cycles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scperteval.registry import Registry

__all__ = ["METRICS", "Decorator", "register_metric"]

#: Every metric of :mod:`scperteval.metrics`, registered by name with its metadata:
#: ``representation`` ("centroid", "population" or "de"), ``scope`` ("perturbation" or
#: "dataset"), ``better`` ("higher" or "lower"), ``perfect`` (the ideal value) and, where a
#: metric needs more than the two datapoints, ``needs`` (names of context fields it reads);
#: ``check``, where given, is called with a protocol's bound options before a run and
#: raises ``ValueError`` on an invalid value.
METRICS = Registry("metric")

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def register_metric(description: str, **meta: Any) -> Decorator:
    """Register a metric under its function's name: ``METRICS.register`` with a description."""
    return METRICS.register(description=description, **meta)
