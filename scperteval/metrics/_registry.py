"""The metric registry, kept apart so that metric modules can register without import cycles."""

from __future__ import annotations

from scperteval.registry import Registry

__all__ = ["METRICS"]

#: Every metric of :mod:`scperteval.metrics`, registered by name with its metadata:
#: ``representation`` ("centroid", "population" or "de"), ``scope`` ("perturbation" or
#: "dataset"), ``better`` ("higher" or "lower"), ``perfect`` (the ideal value) and, where a
#: metric needs more than the two datapoints, ``needs`` (names of context fields it reads);
#: ``check``, where given, is called with a protocol's bound options before a run and
#: raises ``ValueError`` on an invalid value.
METRICS = Registry("metric")
