"""Protocol descriptors: which metric, on which view of the data, against which controls."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from scperteval.engine.sources import SOURCES
from scperteval.engine.spaces import SPACES, space_is_per_condition
from scperteval.errors import SpecError
from scperteval.metrics import METRICS
from scperteval.registry import BoundSpec, parse_spec

__all__ = ["Protocol", "ProtocolFamily", "REPRESENTATIONS", "SCOPES", "CENTERINGS"]

REPRESENTATIONS = ("centroid", "population", "de", "control_de", "control_edistance")
SCOPES = ("perturbation", "dataset")
CENTERINGS = ("none", "control", "perturbed")
#: Leaderboard columns that a protocol column must not shadow.
RESERVED_NAMES = frozenset({"model", "kind", "score", "rank"})


@dataclass(frozen=True, eq=False)
class Protocol:
    """A metric applied to one view of the data, with its calibration controls.

    Attributes
    ----------
    name
        Unique name (``pearson_delta_ctrl``, ``mse_top_k=30``).
    metric
        The resolved metric with its bound options.
    representation
        ``centroid`` (one vector per perturbation), ``population`` (cells),
        ``de`` (a differential expression result against the other perturbed
        cells), ``control_de`` (DE against the control cells) or
        ``control_edistance`` (energy distance to the control cells).
    scope
        ``perturbation`` (one value each) or ``dataset`` (perturbations compared
        with each other within a covariate group).
    space
        Feature space spec (``full``, ``top_k(k=50)``, ``pca(k=50)``, ``a | b``...).
    centering
        ``none``, ``control`` (subtract the control mean: "delta ctrl") or
        ``perturbed`` (subtract the leave-one-out dataset mean: "delta pert").
    positive, negative
        Source names of the positive and negative controls.
    better
        ``higher`` or ``lower``.
    perfect
        The metric's ideal value.
    description
        One line for listings and reports.

    """

    name: str
    metric: BoundSpec
    representation: str
    scope: str
    space: str = "full"
    centering: str = "none"
    positive: str = "technical_duplicate"
    negative: str = "dataset_mean"
    better: str = "higher"
    perfect: float = 1.0
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """Plain description (for tables and ``run.json``)."""
        described = {"protocol": self.name, "metric": self.metric.label()}
        return {**described, **{key: getattr(self, key) for key in _DESCRIBED}}

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> Protocol:
        """Build and validate a protocol from a mapping (a TOML table).

        Unknown keys, metrics, sources, spaces and options fail here, before any
        computation, with the valid choices listed.
        """
        unknown = sorted(set(spec) - _FIELDS)
        if unknown:
            raise SpecError(
                f"protocol {spec.get('name', '?')!r}: unknown field(s) {', '.join(unknown)}; "
                f"valid: {', '.join(sorted(_FIELDS))}"
            )
        if "name" not in spec or "metric" not in spec:
            raise SpecError(f"a protocol needs 'name' and 'metric': {dict(spec)!r}")
        name = str(spec["name"])
        if name in RESERVED_NAMES:
            raise SpecError(
                f"protocol name {name!r} is reserved for a leaderboard column; choose another"
            )
        metric = METRICS.resolve(spec["metric"])
        meta = metric.entry.meta
        protocol = cls(
            name=name,
            metric=metric,
            representation=str(spec.get("representation", meta.get("representation", "centroid"))),
            scope=str(spec.get("scope", meta.get("scope", "perturbation"))),
            space=str(spec.get("space", "full")),
            centering=str(spec.get("centering", "none")),
            positive=str(spec.get("positive", "technical_duplicate")),
            negative=str(spec.get("negative", "dataset_mean")),
            better=str(spec.get("better", meta.get("better", "higher"))),
            perfect=float(spec.get("perfect", meta.get("perfect", math.nan))),
            description=str(spec.get("description", metric.entry.description)),
        )
        protocol.validate()
        return protocol

    def validate(self) -> None:
        """Check the fields' consistency; raise :class:`SpecError` naming the problem."""
        where = f"protocol {self.name!r}"
        for value, choices, what in (
            (self.representation, REPRESENTATIONS, "representation"),
            (self.scope, SCOPES, "scope"),
            (self.centering, CENTERINGS, "centering"),
            (self.better, ("higher", "lower"), "better"),
        ):
            if value not in choices:
                raise SpecError(f"{where}: unknown {what} {value!r}; valid: {', '.join(choices)}")
        for role in (self.positive, self.negative):
            entry = SOURCES.get(role)
            needs_cells = self.representation in ("population", "control_de", "control_edistance")
            if needs_cells and not entry.meta.get("cells", False):
                raise SpecError(
                    f"{where}: source {role!r} has no cells, a {self.representation} protocol "
                    "needs cells (e.g. technical_duplicate, all_perturbed_sample, control_cells)"
                )
        for part in self.space.replace("&", "|").split("|"):
            SPACES.resolve(parse_spec(part.strip()))
        if self.scope == "dataset" and space_is_per_condition(self.space):
            raise SpecError(
                f"{where}: space {self.space!r} differs between perturbations; a dataset-scope "
                "protocol needs a shared space (full, hvg, heg, pca)"
            )
        if self.representation in ("de", "control_de") and self.space.strip().startswith("pca"):
            raise SpecError(f"{where}: DE protocols need a gene space, not {self.space!r}")
        check = self.metric.entry.meta.get("check")
        if check is not None:
            try:
                check(**self.metric.options)
            except ValueError as exc:
                raise SpecError(f"{where}: metric {self.metric.label()}: {exc}") from None
        if not math.isfinite(self.perfect):
            raise SpecError(f"{where}: give the metric's perfect value ('perfect = ...')")


#: The fields a protocol describes besides its name and metric, in their order.
_DESCRIBED = tuple(f.name for f in fields(Protocol) if f.name not in ("name", "metric", "options"))
#: The keys of a protocol's table.
_FIELDS = frozenset({"name", "metric", "params", *_DESCRIBED})

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class ProtocolFamily:
    """A protocol template with parameters, instantiated by name: ``mse_top_k=30``.

    String fields may contain ``{param}`` placeholders; ``params`` gives their
    defaults. The family's name alone gives the default instance.
    """

    name: str
    template: Mapping[str, Any]
    params: Mapping[str, Any]

    def instantiate(
        self, values: Mapping[str, Any] | None = None, name: str | None = None
    ) -> Protocol:
        """The protocol with the given parameter values (defaults for the others)."""
        values = {**self.params, **(values or {})}
        unknown = sorted(set(values) - set(self.params))
        if unknown:
            raise SpecError(
                f"protocol family {self.name!r} has no parameter {', '.join(unknown)}; "
                f"valid: {', '.join(self.params)}"
            )
        filled = {
            key: _fill(value, values) for key, value in self.template.items() if key != "params"
        }
        filled["name"] = name or self.name
        return Protocol.from_mapping(filled)

    def instantiate_from_text(self, text: str) -> Protocol:
        """Instantiate from ``name=value`` (single parameter) or ``name(p=v, ...)``."""
        if "=" in text and "(" not in text:
            _, _, raw = text.partition("=")
            if not self.params:
                raise SpecError(f"protocol {self.name!r} has no parameter to set in {text!r}")
            if len(self.params) != 1:
                raise SpecError(
                    f"protocol family {self.name!r} has parameters {', '.join(self.params)}; "
                    f"write {self.name}(name=value, ...)"
                )
            (param,) = self.params
            try:
                value = ast.literal_eval(raw.strip())
            except (ValueError, SyntaxError):
                value = raw.strip()
            return self.instantiate({param: value}, name=text)
        _, options = parse_spec(text)
        return self.instantiate(options, name=text)


def _fill(value: Any, params: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: str(params[m.group(1)]), value)
    if isinstance(value, Mapping):
        return {k: _fill(v, params) for k, v in value.items()}
    return value
