"""DEG weights of a :class:`~scperteval.context.Context` as a tensor, aligned by name.

A training loop needs the weight vector of each perturbation in a batch, over the
genes the model predicts, in the model's gene order. :class:`DEGWeights` takes the
weights the evaluation uses (:meth:`Context.deg_weights
<scperteval.context.Context.deg_weights>`: one row per condition of
``context.layout.conditions``, one column per gene of ``context.genes``), selects and
reorders the rows by perturbation name and the columns by gene name, and looks rows
up per batch.

Rows are not renormalised after a selection of genes: the weighted losses divide by
the sum of the weights, so only their ratios matter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from scperteval.torch_backend.pairs import DeviceLike, resolve_device, resolve_dtype

if TYPE_CHECKING:
    from scperteval.context import Context

__all__ = ["DEGWeights", "deg_weight_tensor"]

#: A perturbation: its name, a ``(covariate, perturbation)`` pair, or a
#: :class:`~scperteval.data.dataset.Condition`.
PerturbationKey = Any


def _condition_key(item: PerturbationKey) -> tuple[str | None, str]:
    """``(covariate or None, perturbation)`` of a name, pair or condition."""
    if isinstance(item, str):
        return None, item
    if isinstance(item, tuple) and len(item) == 2:
        return str(item[0]), str(item[1])
    covariate = getattr(item, "covariate", None)
    perturbation = getattr(item, "perturbation", None)
    if covariate is not None and perturbation is not None:
        return str(covariate), str(perturbation)
    raise TypeError(
        "a perturbation must be a name, a (covariate, perturbation) pair or a Condition, "
        f"got {item!r}"
    )


class _ConditionIndex:
    """Row lookup by perturbation name, within a covariate group when one is named."""

    def __init__(self, conditions: Sequence[tuple[str, str]]) -> None:
        self.by_pair = {pair: row for row, pair in enumerate(conditions)}
        self.by_name: dict[str, list[int]] = {}
        for row, (_, perturbation) in enumerate(conditions):
            self.by_name.setdefault(perturbation, []).append(row)
        self.conditions = list(conditions)

    def row(self, item: PerturbationKey, covariate: str | None) -> int:
        group, perturbation = _condition_key(item)
        group = group if group is not None else covariate
        if group is not None:
            row = self.by_pair.get((group, perturbation))
            if row is None:
                raise KeyError(
                    f"no perturbation {perturbation!r} in covariate group {group!r} "
                    "among the weighted conditions"
                )
            return row
        rows = self.by_name.get(perturbation)
        if not rows:
            raise KeyError(f"no perturbation {perturbation!r} among the weighted conditions")
        if len(rows) > 1:
            groups = ", ".join(repr(self.conditions[r][0]) for r in rows)
            raise ValueError(
                f"perturbation {perturbation!r} exists in several covariate groups "
                f"({groups}); pass covariate=... or (covariate, perturbation) pairs"
            )
        return rows[0]


def _gene_columns(available: Sequence[str], genes: Iterable[Any]) -> list[int]:
    wanted = [str(gene) for gene in genes]
    repeated = sorted(gene for gene, count in Counter(wanted).items() if count > 1)
    if repeated:
        raise ValueError(f"gene names are repeated: {repeated[:10]}")
    position = {gene: column for column, gene in enumerate(available)}
    missing = [gene for gene in wanted if gene not in position]
    if missing:
        raise KeyError(f"{len(missing)} gene(s) are not genes of the context, e.g. {missing[:10]}")
    return [position[gene] for gene in wanted]


@dataclass(frozen=True, eq=False)
class DEGWeights:
    """DEG weights per perturbation and gene, with lookup by perturbation name.

    Build it with :meth:`from_context`. Rows follow :attr:`conditions`, columns
    follow :attr:`genes`.

    Attributes
    ----------
    weights
        Tensor of shape ``(n_perturbations, n_genes)``: non-negative, each row summing
        to 1 over all genes of the context (less after a gene selection), or all zero
        for a perturbation without a differential gene (see :attr:`degenerate`).
    conditions
        ``(covariate, perturbation)`` of each row; the covariate is the dataset's
        placeholder group when it has no covariate column.
    genes
        Gene name of each column.

    """

    weights: torch.Tensor
    conditions: tuple[tuple[str, str], ...]
    genes: tuple[str, ...]
    _index: _ConditionIndex = field(init=False, repr=False)

    def __post_init__(self) -> None:
        shape = (len(self.conditions), len(self.genes))
        if tuple(self.weights.shape) != shape:
            raise ValueError(
                f"weights have shape {tuple(self.weights.shape)}, expected {shape} "
                "(conditions x genes)"
            )
        object.__setattr__(self, "_index", _ConditionIndex(self.conditions))

    @classmethod
    def from_context(
        cls,
        context: Context,
        *,
        half: str = "truth",
        exponent: float | None = None,
        perturbations: Iterable[PerturbationKey] | None = None,
        genes: Iterable[Any] | None = None,
        covariate: str | None = None,
        device: DeviceLike = "cpu",
        dtype: torch.dtype | None = None,
    ) -> DEGWeights:
        """Take the DEG weights of a context, select and reorder them by name.

        Parameters
        ----------
        context
            The evaluation context; its ``deg_weights(exponent, half)`` are used (the
            weights of the weighted metrics of a score run with the same settings).
        half
            Cells whose DE against the rest defines the weights: ``"truth"`` (default,
            as in scoring), ``"all"`` or ``"duplicate"``.
        exponent
            Exponent of the weights; ``None`` uses the context's ``weight_exponent``
            (2.0 unless set otherwise).
        perturbations
            Rows to keep, in this order: names, ``(covariate, perturbation)`` pairs or
            :class:`~scperteval.data.dataset.Condition` objects. ``None`` keeps every
            condition of ``context.layout.conditions`` in its order.
        genes
            Gene names of the columns, in the model's order (a subset of
            ``context.genes`` is allowed). ``None`` keeps ``context.genes``.
        covariate
            Covariate group of bare perturbation names; needed when a name exists in
            several groups. With ``perturbations=None``, keeps the conditions of this
            group only.
        device, dtype
            Where the tensor lives; float64 by default.

        Returns
        -------
        DEGWeights
            The weights and their labels.

        Raises
        ------
        KeyError
            If a perturbation or gene is not in the context.
        ValueError
            If a bare name is ambiguous across covariate groups, or gene names repeat.

        """
        target = resolve_device(device)
        dtype = resolve_dtype(dtype)
        all_conditions = tuple(
            (str(c.covariate), str(c.perturbation)) for c in context.layout.conditions
        )
        all_genes = tuple(str(gene) for gene in context.genes)
        matrix = np.asarray(context.deg_weights(exponent, half=half), dtype=np.float64)
        if perturbations is None:
            # Every row, or those of one covariate group.
            rows = [r for r, c in enumerate(all_conditions) if covariate in (None, c[0])]
        else:
            index = _ConditionIndex(all_conditions)
            rows = [index.row(item, covariate) for item in perturbations]
        columns = list(range(len(all_genes))) if genes is None else _gene_columns(all_genes, genes)
        selected = matrix[np.ix_(rows, columns)]
        return cls(
            weights=torch.from_numpy(np.ascontiguousarray(selected)).to(target, dtype),
            conditions=tuple(all_conditions[r] for r in rows),
            genes=tuple(all_genes[c] for c in columns),
        )

    @property
    def perturbations(self) -> tuple[str, ...]:
        """Perturbation name of each row."""
        return tuple(perturbation for _, perturbation in self.conditions)

    @property
    def degenerate(self) -> torch.Tensor:
        """Boolean mask of the rows whose weights are all zero (no weighted loss)."""
        return ~(self.weights > 0).any(dim=-1)

    def index(
        self, perturbations: Iterable[PerturbationKey], *, covariate: str | None = None
    ) -> torch.Tensor:
        """Row indices of ``perturbations`` as a long tensor on the weights' device.

        Parameters
        ----------
        perturbations
            Names, ``(covariate, perturbation)`` pairs or conditions.
        covariate
            Covariate group of bare names (needed when a name is ambiguous).

        Returns
        -------
        torch.Tensor
            Shape ``(len(perturbations),)``, dtype ``torch.long``.

        Raises
        ------
        KeyError
            If a perturbation has no row.
        ValueError
            If a bare name exists in several covariate groups.

        """
        rows = [self._index.row(item, covariate) for item in perturbations]
        return torch.tensor(rows, dtype=torch.long, device=self.weights.device)

    def lookup(
        self,
        perturbations: Iterable[PerturbationKey] | torch.Tensor,
        *,
        covariate: str | None = None,
    ) -> torch.Tensor:
        """Weights of a batch: one row per perturbation, shape ``(batch, n_genes)``.

        Parameters
        ----------
        perturbations
            Names, ``(covariate, perturbation)`` pairs, conditions, or a long tensor of
            row indices (from :meth:`index`, e.g. precomputed for a dataset).
        covariate
            Covariate group of bare names.

        Returns
        -------
        torch.Tensor
            The rows of :attr:`weights`, in the order asked.

        """
        if isinstance(perturbations, torch.Tensor):
            rows = perturbations.to(device=self.weights.device, dtype=torch.long)
        else:
            rows = self.index(perturbations, covariate=covariate)
        return self.weights.index_select(0, rows)

    def to(self, device: DeviceLike | None = None, dtype: torch.dtype | None = None) -> DEGWeights:
        """A copy on another device or in another dtype (float32 or float64)."""
        target = self.weights.device if device is None else resolve_device(device)
        kind = self.weights.dtype if dtype is None else resolve_dtype(dtype)
        return DEGWeights(self.weights.to(target, kind), self.conditions, self.genes)


def deg_weight_tensor(
    context: Context,
    perturbations: Iterable[PerturbationKey] | None = None,
    genes: Iterable[Any] | None = None,
    *,
    half: str = "truth",
    exponent: float | None = None,
    covariate: str | None = None,
    device: DeviceLike = "cpu",
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """DEG weights of ``context`` as a ``(n_perturbations, n_genes)`` tensor, aligned by name.

    The tensor of :meth:`DEGWeights.from_context` with the same arguments: row ``i``
    holds the weights of ``perturbations[i]``, column ``j`` those of ``genes[j]``.

    Returns
    -------
    torch.Tensor
        Float64 (by default) weights on ``device``.

    """
    return DEGWeights.from_context(
        context,
        half=half,
        exponent=exponent,
        perturbations=perturbations,
        genes=genes,
        covariate=covariate,
        device=device,
        dtype=dtype,
    ).weights
