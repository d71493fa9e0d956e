"""``scperteval list``: what can be named in protocols and suites."""

from __future__ import annotations

import argparse
import importlib
from types import MappingProxyType
from typing import Any

from scperteval.cli._options import add_command

KIND_DESCRIPTIONS = MappingProxyType(
    {
        "protocols": "the protocols of a suite (-p SUITE; default: the whole catalogue)",
        "metrics": "registered metric functions",
        "spaces": "feature spaces a protocol can be computed in",
        "sources": "controls and baselines compared with the truth",
        "calibrators": "what judges a protocol's calibration (DRF, BDS)",
        "de-methods": "differential expression methods",
        "suites": "the protocol suites shipped with scperteval",
        "distances": "distances between groups of cells (scperteval distances)",
    }
)
KINDS = tuple(KIND_DESCRIPTIONS)
#: The module and name of the registry each other kind lists.
_REGISTRIES = MappingProxyType(
    {
        "metrics": ("scperteval.metrics", "METRICS"),
        "spaces": ("scperteval.engine.spaces", "SPACES"),
        "de-methods": ("scperteval.stats.de_methods", "DE_METHODS"),
        "distances": ("scperteval.distances", "DISTANCES"),
        "sources": ("scperteval.engine.sources", "SOURCES"),
        "calibrators": ("scperteval.engine.calibrators", "CALIBRATORS"),
    }
)


def add_parser(commands: Any) -> None:
    """Register the ``list`` subcommand."""
    parser = add_command(
        commands,
        "list",
        run,
        "list protocols, metrics, spaces, sources, calibrators, DE methods, suites or distances",
        "List what can be named in protocols and suites: the protocols of a suite, "
        "registered metrics, feature spaces, sources (controls and baselines), "
        "calibrators, DE methods, and the shipped suites.",
    )
    parser.add_argument("kind", nargs="?", choices=KINDS, help="what to list (omit: the kinds)")
    parser.add_argument(
        "-p",
        "--protocols",
        default="default",
        help="suite whose protocols to list (kind protocols)",
    )


def rows(kind: str, suite: str = "default") -> list[tuple[str, str]]:
    """``(name, description)`` pairs of one kind."""
    if kind == "protocols":
        from scperteval.engine.suites import resolve_protocols

        return [(p.name, _protocol_line(p)) for p in resolve_protocols(suite)]
    if kind == "suites":
        from scperteval.engine.suites import available_suites

        return sorted(available_suites().items())
    module, name = _REGISTRIES[kind]
    registry = getattr(importlib.import_module(module), name)
    return [(entry.name, _entry_line(entry)) for entry in registry]


def _protocol_line(protocol: Any) -> str:
    return (
        f"{protocol.description} [{protocol.metric.label()}, {protocol.representation}/"
        f"{protocol.scope}, space {protocol.space}, centering {protocol.centering}, "
        f"+ {protocol.positive}, - {protocol.negative}]"
    )


def _entry_line(entry: Any) -> str:
    meta = entry.meta
    details = [
        f"{k}={meta[k]}" for k in ("representation", "scope", "better", "perfect") if k in meta
    ]
    return entry.description + (f" [{', '.join(details)}]" if details else "")


def run(args: argparse.Namespace) -> int:
    """Run ``scperteval list``."""
    entries = (
        list(KIND_DESCRIPTIONS.items()) if args.kind is None else rows(args.kind, args.protocols)
    )
    width = max((len(name) for name, _ in entries), default=0)
    for name, description in entries:
        print(f"{name:<{width}}  {description}")
    return 0
