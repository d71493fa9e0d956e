"""One registry pattern for metrics, spaces, sources, DE methods and calibrators.

Every pluggable piece of scperteval is a plain function registered under a name
with a one-line description and free-form metadata (direction, perfect value, ...).
A *spec* names one registered function and, optionally, options bound to it. The
accepted spec forms are:

- a registered name: ``"pearson"``;
- a name with options: ``"weighted_mse(exponent=3)"``, ``("weighted_mse", {"exponent": 3})``
  or ``{"name": "weighted_mse", "exponent": 3}``;
- a Python callable, used as it is.

Options are checked against the function's signature when the spec is resolved,
so a misspelt option fails before any computation starts.
"""

from __future__ import annotations

import ast
import inspect
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from scperteval.errors import SpecError

__all__ = ["Entry", "Registry", "BoundSpec", "parse_spec"]


@dataclass(frozen=True)
class Entry:
    """A registered function with its name, description and metadata."""

    name: str
    func: Callable[..., Any]
    description: str
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BoundSpec:
    """A resolved spec: the entry and the options bound to it."""

    entry: Entry
    options: Mapping[str, Any]

    @property
    def name(self) -> str:
        """Name of the registered function."""
        return self.entry.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function with the bound options (explicit keywords win)."""
        return self.entry.func(*args, **{**self.options, **kwargs})

    def label(self) -> str:
        """Readable form ``name(k=v, ...)`` that :func:`parse_spec` reads back."""
        if not self.options:
            return self.entry.name
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.options.items()))
        return f"{self.entry.name}({args})"


def parse_spec(spec: Any) -> tuple[str | Callable[..., Any], dict[str, Any]]:
    """Split a spec into a name (or callable) and its options.

    Parameters
    ----------
    spec
        ``"name"``, ``"name(k=v, ...)"``, ``(name, {options})``,
        ``{"name": name, **options}`` or a callable.

    Returns
    -------
    tuple
        The name or callable and a dict of options.

    Raises
    ------
    SpecError
        If the spec has none of the accepted forms. Option values in the string
        form must be Python literals; nothing is ever evaluated as code.

    """
    if callable(spec):
        return spec, {}
    if isinstance(spec, str):
        return _parse_text_spec(spec)
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], Mapping):
        return spec[0], dict(spec[1])
    if isinstance(spec, Mapping) and "name" in spec:
        options = {k: v for k, v in spec.items() if k != "name"}
        return spec["name"], options
    raise SpecError(
        f"cannot read spec {spec!r}: give a name, 'name(k=v)', (name, options), "
        "{'name': ..., **options} or a callable"
    )


def _parse_text_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``parse_spec`` of a string (an engine keeps the spaces it resolves)."""
    text = spec.strip()
    if "(" not in text:
        return text, {}
    if not text.endswith(")"):
        raise SpecError(f"cannot read spec {spec!r}: expected 'name(key=value, ...)'")
    name, _, args = text[:-1].partition("(")
    options: dict[str, Any] = {}
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError as exc:
        raise SpecError(f"cannot read options of spec {spec!r}: {exc.msg}") from None
    # Only ``f(...)`` itself: "name(k=1).x()" or "name(k=1)(k=2)" are not specs.
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        raise SpecError(f"cannot read spec {spec!r}: expected 'name(key=value, ...)'")
    if call.args:
        raise SpecError(f"spec {spec!r}: options must be given as key=value")
    for keyword in call.keywords:
        if keyword.arg is None:
            raise SpecError(f"spec {spec!r}: options must be given as key=value")
        try:
            options[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            raise SpecError(f"spec {spec!r}: value of {keyword.arg!r} must be a literal") from None
    return name.strip(), options


class Registry:
    """Named functions of one kind (metric, space, source, ...).

    Parameters
    ----------
    kind
        What the registry holds, used in messages ("metric", "space", ...).

    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(
        self, name: str | None = None, *, description: str, **meta: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Return a decorator that registers a function under ``name``.

        Parameters
        ----------
        name
            Registered name; the function's ``__name__`` when omitted.
        description
            One line shown by ``scperteval list``.
        **meta
            Metadata kept with the entry (e.g. ``better="higher"``, ``perfect=1.0``).

        """

        def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
            self.add(name or func.__name__, func, description=description, **meta)
            return func

        return decorator

    def add(self, name: str, func: Callable[..., Any], *, description: str, **meta: Any) -> Entry:
        """Register ``func`` under ``name`` (replacing nothing: duplicates are errors)."""
        if name in self._entries and self._entries[name].func is not func:
            raise SpecError(f"a {self.kind} named {name!r} is already registered")
        entry = Entry(name=name, func=func, description=description, meta=dict(meta))
        self._entries[name] = entry
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> Entry:
        """Entry registered under ``name``; the error lists the valid names."""
        try:
            return self._entries[name]
        except KeyError:
            raise SpecError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, self.names())}; "
                f"valid names: {', '.join(self.names())}"
            ) from None

    def resolve(self, spec: Any, **meta: Any) -> BoundSpec:
        """Resolve a spec into a :class:`BoundSpec`, checking its options.

        Parameters
        ----------
        spec
            Any form accepted by :func:`parse_spec`.
        **meta
            Metadata for an unregistered callable (``better``, ``perfect``...).

        """
        target, options = parse_spec(spec)
        if callable(target):
            name = getattr(target, "__name__", repr(target))
            description = (inspect.getdoc(target) or "").split("\n")[0]
            entry = Entry(name, target, description, dict(meta))
        else:
            entry = self.get(str(target))
        check_options(entry, options, self.kind)
        return BoundSpec(entry=entry, options=dict(options))


#: Parameters the engine always passes itself (the metric context): never options.
CALLER_FILLED = frozenset({"ctx"})


def check_options(entry: Entry, options: Mapping[str, Any], kind: str = "function") -> None:
    """Fail early when ``options`` are not keyword parameters of ``entry.func``."""
    if not options:
        return
    try:
        signature = inspect.signature(entry.func)
    except (TypeError, ValueError):
        return
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [
        name
        for name, p in params.items()
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and p.default is not inspect.Parameter.empty
        and name not in CALLER_FILLED
    ]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise SpecError(
            f"{kind} {entry.name!r} has no option {', '.join(map(repr, unknown))}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )
    for name in sorted(set(options) & COUNT_OPTIONS):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise SpecError(
                f"{kind} {entry.name!r}: option {name} must be a whole number of at least 1, "
                f"got {value!r}"
            )


#: Options that count something (genes, components): whole numbers of at least 1.
COUNT_OPTIONS = frozenset({"k"})


def did_you_mean(name: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest valid name, or an empty string."""
    import difflib

    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
