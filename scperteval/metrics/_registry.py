"""The metric registry, kept apart so that metric modules can register without import cycles."""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any

from scperteval.registry import Registry

__all__ = ["METRICS", "Decorator", "fill_docstring", "register_metric"]

#: Every metric of :mod:`scperteval.metrics`, registered by name with its metadata:
#: ``representation`` ("centroid", "population" or "de"), ``scope`` ("perturbation" or
#: "dataset"), ``better`` ("higher" or "lower"), ``perfect`` (the ideal value) and, where a
#: metric needs more than the two datapoints, ``needs`` (names of context fields it reads);
#: ``check``, where given, is called with a protocol's bound options before a run and
#: raises ``ValueError`` on an invalid value.
METRICS = Registry("metric")

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def fill_docstring(func: Callable[..., Any]) -> Callable[..., Any]:
    """Replace each docstring line ``{name:Title}`` by section ``Title`` of function ``name``.

    ``name`` is a function defined before ``func`` in its module; the section runs from
    its title to the next blank line. Metrics that take the same arguments describe
    them once this way, and the filled docstring is the one ``help`` and the API
    reference show.
    """

    def section(match: re.Match[str]) -> str:
        lines = [*inspect.cleandoc(func.__globals__[match[2]].__doc__).split("\n"), ""]
        start = lines.index(match[3])
        return textwrap.indent("\n".join(lines[start : lines.index("", start)]), match[1])

    func.__doc__ = re.sub(r"^( *)\{(\w+):(\w+)\}$", section, func.__doc__ or "", flags=re.M)
    return func


def register_metric(description: str, **meta: Any) -> Decorator:
    """Register a metric under its function's name: ``METRICS.register`` with a description.

    Its docstring is filled first (:func:`fill_docstring`).
    """
    register = METRICS.register(description=description, **meta)
    return lambda func: register(fill_docstring(func))
