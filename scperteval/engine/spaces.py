"""Feature spaces a protocol can evaluate in.

Every space is a registered function ``f(engine, condition_index, **options)``
returning a :class:`~scperteval.engine.featuremap.FeatureMap`. Spaces chosen from
the truth (``top_k``, ``degs_padj``) use the DE of the truth half against the
other perturbed cells; none uses the positive or negative control. Metadata
``per_condition=True`` marks spaces that differ between perturbations (they
cannot serve dataset-scope protocols, which compare perturbations in one space).
Unions and intersections of gene selections are written ``a | b`` and ``a & b``.
Metadata ``from_cells=True`` marks spaces fitted from a matrix of cells alone
(``full``, ``hvg``, ``pca``): the distances layer fits those on any AnnData
(:func:`parse_cells_space`), with the same names, options and defaults, and the
same exact PCA (:func:`principal_axes`, re-exported here for it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from scperteval.engine._pca import SampleRows, principal_axes
from scperteval.engine.featuremap import FeatureMap
from scperteval.errors import SpecError
from scperteval.metrics import DegenerateInput
from scperteval.registry import Registry, parse_spec
from scperteval.stats.ranking import RANKING_BITS, ranking_keys

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine

__all__ = [
    "RANKING_BITS",
    "SPACES",
    "parse_cells_space",
    "principal_axes",
    "ranking_keys",
    "resolve_space",
    "top_indices",
]

SPACES = Registry("space")


def _selection(engine: Engine, label: str, genes: np.ndarray) -> FeatureMap:
    genes = np.asarray(genes, dtype=np.int64)
    return FeatureMap(label=label, names=np.asarray(engine.genes)[genes], genes=genes)


def _nonempty(engine: Engine, label: str, genes: np.ndarray, reason: str) -> FeatureMap:
    """:func:`_selection`, undefined (``reason``) when no gene is selected."""
    if len(genes) == 0:
        raise DegenerateInput(reason)
    return _selection(engine, label, genes)


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest scores; ties broken by gene order, result sorted.

    Parameters
    ----------
    scores
        One score per gene; NaN ranks below every number.
    k
        Number of genes wanted (all of them when there are fewer).

    Returns
    -------
    numpy.ndarray
        The genes' indices, ascending.

    Notes
    -----
    Scores are compared on :func:`ranking_keys` (``RANKING_BITS`` significant
    bits), so that scores equal in exact arithmetic tie whatever their rounding.
    The ``k``-th largest key is found by a partial sort; the keys above it are all
    taken and those equal to it in gene order, which is the head of a full sort by
    (key descending, gene).

    """
    k = min(int(k), scores.shape[0])
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    keys = -np.nan_to_num(ranking_keys(scores), nan=-np.inf)
    # -0.0 and 0.0 tie in a sort: compare them as equal here too.
    keys += 0.0
    boundary = np.partition(keys, k - 1)[k - 1]
    above = np.flatnonzero(keys < boundary)
    tied = np.flatnonzero(keys == boundary)[: k - above.size]
    return np.sort(np.concatenate([above, tied]))


def _check_k(k: int) -> int:
    if int(k) < 1:
        raise SpecError(f"space size k must be at least 1, got {k}")
    return int(k)


def _cells_space(
    name: str, description: str, *, large_fit: bool
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a space fitted from a matrix of cells alone (see :func:`parse_cells_space`)."""
    return SPACES.register(name, description=description, large_fit=large_fit, from_cells=True)


@_cells_space("full", "all genes", large_fit=False)
def full(engine: Engine, condition: int) -> FeatureMap:
    """All genes of the dataset."""
    return engine.memo(
        ("space", "full"), lambda: _selection(engine, "full", np.arange(len(engine.genes)))
    )


@SPACES.register(
    "top_k", description="k genes with the largest truth |t| vs the rest", per_condition=True
)
def top_k(engine: Engine, condition: int, *, k: int = 50) -> FeatureMap:
    """The ``k`` genes with the largest ``|t|`` of the truth half vs the rest (ties: gene order)."""
    _check_k(k)
    statistic = engine.truth_de().statistic[condition]
    return _selection(engine, f"top_k(k={k})", top_indices(np.abs(statistic), k))


@SPACES.register(
    "degs_padj", description="genes with truth adjusted p-value < alpha", per_condition=True
)
def degs_padj(
    engine: Engine, condition: int, *, alpha: float = 0.05, min_genes: int = 1
) -> FeatureMap:
    """Genes whose truth DE adjusted p-value is below ``alpha``.

    Fewer than ``min_genes`` such genes (e.g. none) make the protocol undefined
    for the perturbation: NaN with the reason.
    """
    genes = np.flatnonzero(engine.truth_de().pvalue_adj[condition] < alpha)
    if genes.size < max(int(min_genes), 1):
        raise DegenerateInput(
            f"{genes.size} gene(s) with adjusted p-value < {alpha} in the truth "
            f"(at least {max(int(min_genes), 1)} needed)"
        )
    return _selection(engine, f"degs_padj(alpha={alpha})", genes)


@SPACES.register(
    "expressed",
    description="genes that vary in the truth or its reference (measurable DE)",
    per_condition=True,
)
def expressed(engine: Engine, condition: int) -> FeatureMap:
    """Genes with non-zero variance in the truth or in its DE reference cells.

    A gene constant in both (typically never detected) has ``t = 0`` for every
    candidate: it cannot be a DEG and only adds ties, which rewards any
    candidate that merely ranks expressed genes first.
    """
    truth = engine.context.condition_stats(engine.truth_half).group(condition).variance()[0]
    rest = engine.de_reference(condition).variance()[0]
    genes = np.flatnonzero((np.nan_to_num(truth) > 0) | (np.nan_to_num(rest) > 0))
    return _nonempty(engine, "expressed", genes, "no gene varies in the truth or its reference")


@_cells_space("hvg", "k most variable genes across the covariate group's cells", large_fit=False)
def hvg(engine: Engine, condition: int, *, k: int = 2000) -> FeatureMap:
    """The ``k`` genes of largest variance of log expression over all cells of the group."""
    return _group_top_k(
        engine, condition, "hvg", k, lambda: engine.covariate_all_stats().variance()
    )


@SPACES.register(
    "heg",
    description="k genes most expressed in the controls",
    large_fit=False,
)
def heg(engine: Engine, condition: int, *, k: int = 1000) -> FeatureMap:
    """The ``k`` genes with the highest mean expression in the group's control cells."""
    return _group_top_k(engine, condition, "heg", k, lambda: engine.context.control_stats().mean)


def _group_top_k(
    engine: Engine, condition: int, name: str, k: int, scores: Callable[[], np.ndarray]
) -> FeatureMap:
    """The ``k`` genes of highest ``scores()`` row of the condition's group, cached per group."""
    _check_k(k)
    covariate = engine.covariate_index(condition)

    def build() -> FeatureMap:
        return _selection(engine, f"{name}(k={k})", top_indices(scores()[covariate], k))

    return engine.memo(("space", name, k, covariate), build)


@SPACES.register(
    "perturbed_genes", description="the perturbation's measured target gene(s)", per_condition=True
)
def perturbed_genes(engine: Engine, condition: int) -> FeatureMap:
    """The measured genes named by the perturbation (each component of ``A+B``)."""
    genes = engine.target_genes(condition)
    reason = "the perturbation's target genes are not measured"
    return _nonempty(engine, "perturbed_genes", genes, reason)


@_cells_space(
    "pca", "first k principal components (seeded fit per covariate group)", large_fit=True
)
def pca(engine: Engine, condition: int, *, k: int = 50) -> FeatureMap:
    """Projection on the first ``k`` principal components of the group's cells.

    Fitted on a seeded sample of at most ``engine.pca_cells`` cells of the
    covariate group (controls and perturbed), log expression centred, not scaled;
    the axes are exact (:func:`~scperteval.engine._pca.principal_axes`), so the fit
    is deterministic.
    """
    _check_k(k)
    covariate = engine.covariate_index(condition)
    return engine.memo(("space", "pca", k, covariate), lambda: _fit_pca(engine, covariate, k))


def _fit_pca(engine: Engine, covariate: int, k: int) -> FeatureMap:
    cells = engine.covariate_cells(covariate)
    positions = engine.seeded_sample(cells, "pca", covariate, engine.pca_cells)
    dataset = engine.context.dataset
    sample = SampleRows(
        (positions.size, dataset.n_genes), lambda start, stop: dataset.rows(positions[start:stop])
    )
    components, offset = principal_axes(sample, k, threads=engine.threads)
    names = np.array([f"PC{i + 1}" for i in range(components.shape[1])])
    return FeatureMap(
        label=f"pca(k={k})",
        names=names,
        components=components,
        offset=offset,
        threads=engine.threads,
    )


def resolve_space(engine: Engine, spec: str, condition: int) -> FeatureMap:
    """The feature map of a space spec for one condition (``a | b``, ``a & b`` allowed)."""
    if "|" in spec or "&" in spec:
        operator = "|" if "|" in spec else "&"
        if "|" in spec and "&" in spec:
            raise SpecError(f"space {spec!r}: mix of '|' and '&' is not supported")
        parts = [resolve_space(engine, part.strip(), condition) for part in spec.split(operator)]
        if not all(part.genes is not None for part in parts):
            raise SpecError(
                f"space {spec!r}: only gene selections can be combined, not projections"
            )
        selections = [set(part.genes.tolist()) for part in parts if part.genes is not None]
        combined = set.union(*selections) if operator == "|" else set.intersection(*selections)
        reason = f"space {spec!r} is empty for this perturbation"
        return _nonempty(engine, spec, np.array(sorted(combined)), reason)
    # Resolved once per engine: every task asks, and parsing options costs 10 us.
    bound = engine.memo(("space spec", spec), lambda: SPACES.resolve(spec))
    return bound(engine, condition)  # type: ignore[no-any-return]


def parse_cells_space(spec: Any) -> tuple[str, dict[str, Any]]:
    """The name and options of a space fitted from cells alone, such as ``"pca(k=30)"``.

    Parameters
    ----------
    spec
        A spec of a space registered with ``from_cells=True``: ``"full"``,
        ``"hvg"``, ``"hvg(k=K)"``, ``"pca"`` or ``"pca(k=K)"``.

    Returns
    -------
    tuple
        The name and the options, with the defaults of the registered space filled in.

    Raises
    ------
    SpecError
        For an unknown space, one that needs the benchmark's truth or controls, an
        unknown option or a ``k`` below 1.

    """
    bound = SPACES.resolve(spec)
    if not bound.entry.meta.get("from_cells", False):
        fitted = ", ".join(entry.name for entry in SPACES if entry.meta.get("from_cells"))
        raise SpecError(
            f"space {bound.name!r} is chosen from a benchmark's truth or controls; "
            f"spaces fitted from cells alone: {fitted}"
        )
    parameters = inspect.signature(bound.entry.func).parameters.values()
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
    return bound.name, {**defaults, **bound.options}


def space_is_per_condition(spec: str) -> bool:
    """Whether a space spec may differ between perturbations."""
    return any(meta.get("per_condition", False) for meta in _part_metadata(spec))


def space_has_large_fit(spec: str) -> bool:
    """Whether a shared space's fit holds much memory for a while (a PCA's Gram matrix).

    A shared space registered without saying (``large_fit``) counts as large.
    """
    return any(
        not meta.get("per_condition", False) and meta.get("large_fit", True)
        for meta in _part_metadata(spec)
    )


def _part_metadata(spec: str) -> list[Mapping[str, Any]]:
    """The registered metadata of each space named in a spec (``a | b``, ``a & b``)."""
    parts = [p.strip() for p in spec.replace("&", "|").split("|")]
    return [SPACES.get(str(parse_spec(part)[0])).meta for part in parts]
