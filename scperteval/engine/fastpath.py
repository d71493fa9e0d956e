r"""Shortcuts for energy distance and MMD that keep the direct formulas' values.

Both metrics are sums of a pairwise function ``f`` (the distance, or an RBF kernel)
over three sets of pairs: truth x candidate, truth x truth and candidate x
candidate (:func:`~scperteval.metrics.population.energy_distance_from_sums`,
:func:`~scperteval.metrics.population.mmd_from_sums`). The truth has tens to
hundreds of cells; the negative control ``all_perturbed_sample`` has thousands (the
covariate group's shared sample ``S`` without the perturbation's own cells ``O``),
so its within-sample sum is nearly all of the work. Two exact shortcuts remove most
of it:

- **Leave-one-out in a shared space** (``pca``, ``hvg``, ``heg``, ``full``): every
  perturbation of the group sees the same ``S`` in the same features, and over
  unordered pairs

      W(S \ O) = W(S) - F(O, S \ O) - W(O),

  so ``W(S)`` is computed once per (group, space) and each perturbation only pays
  for the pairs of its own cells. The distance sum ``W(S)`` is a number; the kernel
  sum depends on the bandwidth, which ``bandwidth='truth'`` sets per perturbation,
  so the sample's pairwise squared distances are kept
  (:class:`~scperteval.kernels.pairs.StoredPairs`, about ``4 n^2`` bytes,
  within ``Engine.pair_store_bytes``, and never for a sample of more than
  ``Engine.max_population_cells`` cells, whose sums are then taken tile by tile with
  the same values) and each bandwidth costs one pass of
  exponentials over them, not the distances again. The value differs from the direct
  formula by float rounding only (the sums are grouped differently), about 1e-16 of
  the within-sample term.
- **One pass for several protocols** on the same space and view (``energy_pca``
  and ``mmd_pca``, ``energy_top_k`` and ``mmd_top_k``): sums over pairs that cannot
  be shared between perturbations (truth x candidate, truth x truth, the candidate's
  own pairs where no leave-one-out step applies, and that step's pairs of the left-out
  cells) are shared between the protocols: the first to run computes every planned
  transform of them in one pass (:func:`~scperteval.kernels.pairs.pair_sums`),
  and each value is bit for bit the one computed alone. The run gives a
  perturbation's protocols of one space to one task, so that no thread waits for
  another's pass.

The truth x candidate and truth x truth sums are computed as the metric computes
them (same shift, same tiles), so every value without a leave-one-out step is
identical to the direct formula. Metrics other than the registered
``energy_distance`` and ``mmd`` (with ``bandwidth='truth'`` or a number), and
candidates not drawn from the engine's sources, take the direct path.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from scperteval.engine.spaces import space_is_per_condition
from scperteval.engine.views import make_view
from scperteval.kernels.pairs import SQRT, PairTransform, centred, check_bandwidth, rbf_transform
from scperteval.metrics.population import (
    check_sizes,
    cloud_pair,
    energy_distance,
    energy_distance_from_sums,
    mmd,
    mmd_from_sums,
)

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine
    from scperteval.engine.featuremap import FeatureMap
    from scperteval.engine.protocol import Protocol
    from scperteval.engine.sources import SourceData

__all__ = ["plan_population", "population_value"]

# A planned pairwise function: "sqrt", "truth" (RBF, bandwidth from the truth) or a
# fixed RBF bandwidth.
_Planned = str | float
# A leave-one-out step pays off when the left-out cells are this small a part.
_LOO_FRACTION = 0.25


@dataclass(frozen=True)
class _PairMetric:
    kind: str
    unbiased: Any
    bandwidth: Any


def _pair_metric(protocol: Protocol) -> _PairMetric | None:
    """The protocol's metric, when it is the registered energy distance or MMD."""
    if protocol.representation != "population":
        return None
    metric = protocol.metric
    entry = getattr(metric, "entry", None)
    if entry is None:
        return None
    options = dict(metric.options)
    unbiased = options.pop("unbiased", True)
    if entry.func is energy_distance and not options:
        return _PairMetric("energy", unbiased, None)
    if entry.func is mmd:
        bandwidth = options.pop("bandwidth", None)
        if options or bandwidth is None:
            return None  # the pooled-sample bandwidth is left to the metric itself
        if isinstance(bandwidth, str) and bandwidth != "truth":
            return None
        return _PairMetric("mmd", unbiased, bandwidth)
    return None


def _planned(spec: _PairMetric) -> _Planned | None:
    if spec.kind == "energy":
        return "sqrt"
    if spec.bandwidth == "truth":
        return "truth"
    try:
        return check_bandwidth(spec.bandwidth)
    except (TypeError, ValueError):
        return None


def plan_population(engine: Engine, protocols: Sequence[Protocol]) -> None:
    """Tell the engine which pairwise sums the protocols will ask for, by space.

    Only the amount of work shared depends on the plan, never a value.
    """
    plan = {space: set(wanted) for space, wanted in engine.pair_plan.items()}
    for protocol in protocols:
        spec = _pair_metric(protocol)
        planned = None if spec is None else _planned(spec)
        if planned is not None:
            plan.setdefault(protocol.space, set()).add(planned)
    engine.pair_plan = {space: frozenset(wanted) for space, wanted in plan.items()}


def _transform(planned: _Planned, truth_bandwidth: Callable[[], float]) -> PairTransform:
    if planned == "sqrt":
        return SQRT
    if planned == "truth":
        return rbf_transform(truth_bandwidth())
    return rbf_transform(float(planned))


def _no_truth() -> float:
    raise AssertionError("no truth bandwidth here")  # pragma: no cover


def population_value(
    engine: Engine,
    protocol: Protocol,
    condition: int,
    space: FeatureMap,
    reference: np.ndarray | None,
    truth_view: Any,
    source: SourceData,
    cache_key: Hashable | None,
    view_key: Hashable | None = None,
) -> float | None:
    """The protocol's value for one candidate, or ``None`` to use the metric directly.

    Parameters
    ----------
    engine, protocol, condition, space, reference
        As for :func:`~scperteval.engine.views.make_view`.
    truth_view
        The truth's cells in the space.
    source
        The candidate's data.
    cache_key
        A name that identifies the candidate's data for this engine (a registered
        source), under which sums may be shared between protocols; ``None`` for
        data that may change between runs (a model's predictions).
    view_key
        Identifies the candidate's cells for the run, so that their mapping to the
        space is shared with the next protocols (see
        :func:`~scperteval.engine.views.make_view`); ``None`` maps them anew.

    Raises
    ------
    DegenerateInput
        Where the metric itself raises it, with the same reason.

    """
    spec = _pair_metric(protocol)
    if spec is None:
        return None
    candidate: Any = make_view(engine, protocol, condition, source, space, reference, view_key)
    x, y = cloud_pair(truth_view, candidate)
    check_sizes(x.shape[0], y.shape[0], spec.unbiased)
    truth = x
    planned = _planned(spec)
    if planned is None:
        return None

    def truth_bandwidth() -> float:
        # The metric's median heuristic on the truth's cells, shared by the protocols
        # (and candidates) that see the same truth view.
        key = ("truth_bandwidth", engine.pairs.name, condition, protocol.space, protocol.centering)
        return engine.memo(key, lambda: engine.pairs.median(truth) or 1.0)

    transform = _transform(planned, truth_bandwidth)
    pairs = _CandidateSums(
        engine, protocol, condition, planned, transform, truth_bandwidth, cache_key
    )
    x, y = centred(x, y)
    cross = pairs.shared("cross", x, y)
    within_x = 2.0 * pairs.shared("truth_within", x, None)
    within_y = 2.0 * pairs.candidate_within(space, source, y)
    n, m = x.shape[0], y.shape[0]
    if spec.kind == "energy":
        return energy_distance_from_sums(cross, within_x, within_y, n, m, unbiased=spec.unbiased)
    return mmd_from_sums(cross, within_x, within_y, n, m, unbiased=spec.unbiased)


@dataclass(frozen=True)
class _CandidateSums:
    """The sums over pairs of one protocol's value for one candidate, and their sharing."""

    engine: Engine
    protocol: Protocol
    condition: int
    planned: _Planned
    transform: PairTransform
    truth_bandwidth: Callable[[], float]
    #: The candidate's cache key (see :func:`population_value`); ``None``: not shared.
    cache_key: Hashable | None

    def shared(self, name: str, x: np.ndarray, y: np.ndarray | None) -> float:
        """Sum of the transform over the pairs of ``x`` and ``y`` (``y=None``: within ``x``).

        When other planned protocols on the same space ask for other transforms of
        the same pairs (named ``name``), the first computes all of them in one pass
        and the rest read theirs.
        """
        engine, protocol = self.engine, self.protocol
        if self.cache_key is not None:
            wanted = engine.pair_plan.get(protocol.space, frozenset())
            transforms = sorted(
                {_transform(p, self.truth_bandwidth) for p in wanted} | {self.transform}
            )
            if len(transforms) > 1:
                key = (name, engine.pairs.name, self.condition, protocol.space)
                sums = engine.memo(
                    (*key, protocol.centering, self.cache_key),
                    lambda: dict(zip(transforms, engine.pairs.sums(x, y, transforms), strict=True)),
                )
                if self.transform in sums:
                    return float(sums[self.transform])
        return float(engine.pairs.sums(x, y, [self.transform])[0])

    def candidate_within(self, space: FeatureMap, source: SourceData, y: np.ndarray) -> float:
        """Sum of the transform over the unordered pairs of the candidate's cells ``y``."""
        if not space_is_per_condition(self.protocol.space) and source.sample is not None:
            covariate, index = source.sample
            sample_size = self.engine.perturbed_sample(covariate)[0].size
            if sample_size - index.size <= _LOO_FRACTION * index.size:
                value = self.leave_out_within(covariate, space, index)
                if value is not None:
                    return value
        return self.shared("pair_within", y, None)

    def leave_out_within(
        self, covariate: int, space: FeatureMap, index: np.ndarray
    ) -> float | None:
        """``W(S[index])`` from the whole sample's ``W(S)``, or ``None`` if not applicable."""
        base = _centred_sample(self.engine, covariate, space)
        if base is None:
            return None
        left_out = np.ones(base.shape[0], dtype=bool)
        left_out[index] = False
        own = base[left_out]
        total = self.sample_within(covariate, space, base)
        if own.shape[0] == 0:
            return total
        between = self.shared("left_out_between", own, base[index])
        return total - between - self.shared("left_out_within", own, None)

    def sample_within(self, covariate: int, space: FeatureMap, base: np.ndarray) -> float:
        """``W(S)`` for the transform: from stored distances, or from one shared pass."""
        engine, transform = self.engine, self.transform
        if self.planned == "truth":
            # A bandwidth per perturbation: keep the distances, if they fit.
            nbytes = engine.pairs.store_nbytes(base.shape[0])
            cap = engine.max_population_cells
            if nbytes > engine.pair_store_bytes or (cap is not None and base.shape[0] > cap):
                # The tiles give the stored distances' sums exactly, in bounded memory.
                return engine.pairs.sums(base, None, [transform])[0]
            store = engine.pair_store(
                ("sample_pairs", covariate, space.label), lambda: engine.pairs.store(base), nbytes
            )
            return float(store.sums([transform])[0])
        wanted = engine.pair_plan.get(self.protocol.space, frozenset())
        fixed = tuple(
            sorted({_transform(p, _no_truth) for p in wanted if p != "truth"} | {transform})
        )
        key = ("sample_within", engine.pairs.name, covariate, space.label, fixed)
        sums = engine.memo(
            key, lambda: dict(zip(fixed, engine.pairs.sums(base, None, fixed), strict=True))
        )
        return float(sums[transform])


def _centred_sample(engine: Engine, covariate: int, space: FeatureMap) -> np.ndarray | None:
    """The group's sample in a shared space, shifted by its mean; ``None`` if not finite."""

    def build() -> np.ndarray | None:
        points = np.asarray(engine.sample_points(covariate, space, True), dtype=np.float64)
        if not np.isfinite(points).all():
            return None
        (shifted,) = centred(points)
        shifted.flags.writeable = False
        return shifted

    return engine.memo(("sample_centred", covariate, space.label), build)
