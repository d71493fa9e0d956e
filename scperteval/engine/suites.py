"""Protocol suites: named lists of protocols stored as TOML data.

A suite file has an optional ``description``, ``[[protocol]]`` tables (see
``protocols/default.toml``) and optionally ``use = ["name", "family=value"]`` to
take protocols from the default catalogue. Loading a suite parses data only: no
code is executed, and every name and option is validated before any computation.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from scperteval.engine.protocol import Protocol, ProtocolFamily
from scperteval.errors import SpecError
from scperteval.registry import did_you_mean

__all__ = ["available_suites", "load_suite", "resolve_protocols", "Catalogue"]

SUITE_PACKAGE = "scperteval.suites"
ALIASES = MappingProxyType({"all": "default"})


class Catalogue:
    """The protocols and families of one suite, addressable by name."""

    def __init__(self, name: str, description: str, entries: Sequence[Mapping[str, Any]]) -> None:
        self.name = name
        self.description = description
        self.families: dict[str, ProtocolFamily] = {}
        self.order: list[str] = []
        for entry in entries:
            protocol_name = str(entry.get("name", ""))
            if not protocol_name:
                raise SpecError(f"suite {name!r}: a [[protocol]] table has no name")
            if protocol_name in self.families:
                raise SpecError(f"suite {name!r}: protocol {protocol_name!r} defined twice")
            params = dict(entry.get("params", {}))
            self.families[protocol_name] = ProtocolFamily(protocol_name, dict(entry), params)
            self.order.append(protocol_name)

    def protocols(self) -> list[Protocol]:
        """Every protocol of the suite with its default parameters."""
        return [self.families[name].instantiate() for name in self.order]

    def get(self, text: str) -> Protocol:
        """A protocol by name, ``family=value`` or ``family(p=v)``."""
        base = text.split("=", 1)[0].split("(", 1)[0].strip()
        if base not in self.families:
            raise SpecError(
                f"unknown protocol {text!r} in suite {self.name!r}"
                f"{did_you_mean(base, self.order)}; valid names: {', '.join(self.order)}"
            )
        family = self.families[base]
        if base == text.strip():
            return family.instantiate()
        return family.instantiate_from_text(text.strip())


def available_suites() -> dict[str, str]:
    """Names and descriptions of the suites shipped with scperteval."""
    found = {}
    for item in sorted(resources.files(SUITE_PACKAGE).iterdir(), key=lambda p: p.name):
        if item.name.endswith(".toml"):
            data = tomllib.loads(item.read_text(encoding="utf-8"))
            found[item.name[: -len(".toml")]] = str(data.get("description", ""))
    return found


def _is_path(text: str) -> bool:
    """Whether a suite is written as a file path (a shipped name never is)."""
    return text.endswith(".toml") or "/" in text or os.sep in text


def _read(name_or_path: str) -> tuple[str, dict[str, Any]]:
    # A shipped suite's name wins over a file or folder of that name in the working
    # directory; a file is named as a path (``./default`` or ``my_suite.toml``).
    if _is_path(name_or_path) or (not _is_suite(name_or_path) and Path(name_or_path).exists()):
        path = Path(name_or_path)
        if path.is_dir():
            raise SpecError(f"suite file {path} is a folder; give the path of a .toml file")
        if not path.is_file():
            raise SpecError(f"suite file {path} not found")
        try:
            # utf-8-sig: a byte-order mark, as some editors on Windows write, is no error.
            return path.stem, tomllib.loads(path.read_text(encoding="utf-8-sig"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            reason = str(exc).splitlines()[0]
            raise SpecError(f"{path}: not valid TOML ({reason})") from None
    name = ALIASES.get(name_or_path, name_or_path)
    resource = resources.files(SUITE_PACKAGE) / f"{name}.toml"
    if not resource.is_file():
        suites = list(available_suites())
        raise SpecError(
            f"unknown suite {name_or_path!r}{did_you_mean(name_or_path, suites)}; "
            f"shipped suites: {', '.join(suites)} (or give a path to a .toml file)"
        )
    return name, tomllib.loads(resource.read_text(encoding="utf-8"))


def load_catalogue(name_or_path: str = "default") -> Catalogue:
    """Parse a suite (shipped name or path) into a :class:`Catalogue`."""
    name, data = _read(name_or_path)
    unknown = sorted(set(data) - {"description", "protocol", "use"})
    if unknown:
        raise SpecError(
            f"suite {name!r}: unknown key(s) {', '.join(unknown)}; "
            "valid: description, protocol, use"
        )
    return Catalogue(name, str(data.get("description", "")), _protocol_tables(name, data))


def _protocol_tables(name: str, data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``[[protocol]]`` tables of a suite, each checked to be a table."""
    entries = data.get("protocol", [])
    use = data.get("use", [])
    if not isinstance(use, list) or not all(isinstance(item, str) for item in use):
        raise SpecError(
            f'suite {name!r}: use must be a list of protocol names (use = ["mse"]), got {use!r}'
        )
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise SpecError(
            f"suite {name!r}: protocol must be [[protocol]] tables (name, metric, ...), "
            f"got {entries!r}; to take shipped protocols by name write use = [...]"
        )
    for entry in entries:
        if not isinstance(entry.get("name", ""), str):
            raise SpecError(
                f"suite {name!r}: a protocol's name must be text, got {entry['name']!r}"
            )
        if not isinstance(entry.get("params", {}), Mapping):
            raise SpecError(
                f"suite {name!r}: protocol {entry.get('name')!r}: params must be a table "
                f"(params = {{ k = [10, 50] }}), got {entry['params']!r}"
            )
    return list(entries)


def load_suite(name_or_path: str = "default") -> list[Protocol]:
    """The validated protocols of a suite (shipped name such as ``default`` or a TOML path).

    Parameters
    ----------
    name_or_path
        ``default`` (alias ``all``), ``miller2025``, ``ahlmann_eltze2025``,
        ``vcc2025``, or a path to a TOML file.

    Returns
    -------
    list of Protocol
        In the order of the file (``use`` entries first).

    """
    name, data = _read(name_or_path)
    catalogue = load_catalogue(name_or_path)
    protocols: list[Protocol] = []
    if data.get("use"):
        default = load_catalogue("default")
        protocols.extend(default.get(str(item)) for item in data["use"])
    protocols.extend(catalogue.protocols())
    if not protocols:
        raise SpecError(f"suite {name!r} defines no protocol ([[protocol]] tables or use = [...])")
    _check_unique(protocols)
    return protocols


def resolve_protocols(spec: str | Protocol | Iterable[Any]) -> list[Protocol]:
    """Protocols from a suite name, a TOML path, comma-separated names, or objects.

    Names are looked up in the default catalogue (``mse_top_k=30`` instantiates a
    family). A :class:`Protocol` or a mapping (a TOML-like table) is used as given.
    """
    if isinstance(spec, (Protocol, Mapping)):
        items: list[Any] = [spec]
    elif isinstance(spec, str):
        text = spec.strip()
        if "," not in text and (_is_path(text) or _is_suite(text) or Path(text).is_file()):
            return load_suite(text)
        items = [part.strip() for part in _split_names(text) if part.strip()]
    elif isinstance(spec, Iterable):
        items = list(spec)
    else:
        raise SpecError(
            f"protocols must be a suite name, a TOML path, protocol names or a list of them, "
            f"got {type(spec).__name__}"
        )
    if not items:
        raise SpecError("no protocol given; name a suite (e.g. default) or protocols")
    protocols: list[Protocol] = []
    default: Catalogue | None = None
    for item in items:
        if isinstance(item, Protocol):
            protocols.append(item)
        elif isinstance(item, Mapping):
            protocols.append(Protocol.from_mapping(item))
        elif isinstance(item, str) and (_is_suite(item) or item.endswith(".toml")):
            protocols.extend(load_suite(item))
        else:
            default = default or load_catalogue("default")
            try:
                protocols.append(default.get(str(item)))
            except SpecError as exc:
                hint = did_you_mean(str(item), list(available_suites()))
                if hint and "," not in str(item):
                    raise SpecError(f"unknown suite or protocol {item!r}{hint}") from None
                raise exc from None
    _check_unique(protocols)
    return protocols


def _is_suite(name: str) -> bool:
    return ALIASES.get(name, name) in available_suites()


def _split_names(text: str) -> list[str]:
    """Split on commas outside parentheses (``a(k=1, j=2), b``)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _check_unique(protocols: Sequence[Protocol]) -> None:
    seen: set[str] = set()
    for protocol in protocols:
        if protocol.name in seen:
            raise SpecError(f"protocol {protocol.name!r} given twice")
        seen.add(protocol.name)
