"""Differential expression under a split: against the fold's training perturbations.

Without a split, a perturbation's DE (behind DEG weights, top-k and DEG spaces,
DE protocols and the interpolated duplicate) tests its cells against every other
perturbed cell of its covariate group. Under a split, the reference is the cells
of the training perturbations of the fold that holds it out, in its group, as in
the fold-aware benchmark of the reference implementation: a held-out
perturbation is judged against what a model of that fold was trained on, and no
other held-out perturbation enters its reference. Rows of perturbations no fold
holds out are NaN: they are never scored.
"""

from __future__ import annotations

import numpy as np

from scperteval.context import Context
from scperteval.data.layout import GroupLayout
from scperteval.engine.folds import FoldPlan
from scperteval.stats.de_methods import DE_METHODS
from scperteval.stats.diffexp import DEResult
from scperteval.stats.groups import GroupStats, merge_groups
from scperteval.stats.multiple_testing import benjamini_hochberg
from scperteval.stats.rank_test import wilcoxon_against

__all__ = ["TrainingReference", "training_de"]


class TrainingReference:
    """The training cells' moments of every fold and covariate group.

    Parameters
    ----------
    context
        The run's context.
    folds
        The split's folds on its conditions.

    Attributes
    ----------
    folds
        The folds.
    pools
        Moments of the pooled training cells, one row per fold and group
        (row ``fold * n_groups + group``).
    row_of
        Per condition, its row of ``pools`` (its fold's, in its group); -1 for the
        conditions no fold holds out.

    """

    def __init__(self, context: Context, folds: FoldPlan) -> None:
        self.folds = folds
        layout = context.layout
        stats = context.condition_stats("all")
        n_groups = len(layout.covariates)
        per_fold = []
        for training in folds.training:
            labels = np.full(layout.n_conditions, -1, dtype=np.int64)
            for group, members in enumerate(training):
                labels[members] = group
            per_fold.append(merge_groups(stats, labels, n_groups, context.threads))
        self.pools = GroupStats(
            n=np.concatenate([pool.n for pool in per_fold]),
            mean=np.vstack([pool.mean for pool in per_fold]),
            m2=np.vstack([pool.m2 for pool in per_fold]),
        )
        fold_of = folds.fold_of
        self.row_of = np.where(
            fold_of >= 0, fold_of * n_groups + layout.condition_covariate, -1
        ).astype(np.int64)

    def of(self, condition: int) -> GroupStats:
        """The one-row moments of the reference of a held-out ``condition``."""
        row = int(self.row_of[condition])
        if row < 0:
            raise KeyError(f"condition {condition} is held out by no fold")
        return self.pools.group(row)


def training_de(context: Context, reference: TrainingReference, half: str) -> DEResult:
    """DE of ``half`` of each held-out perturbation against its fold's training cells.

    Parameters
    ----------
    context
        The run's context.
    reference
        The split's :class:`TrainingReference` on the context.
    half
        Target cells: ``truth``, ``duplicate`` or ``all``.

    Returns
    -------
    DEResult
        With the context's DE method, ``reference="training"``; Benjamini-Hochberg
        across genes per row; NaN rows for the perturbations no fold holds out.

    """
    layout = context.layout
    method = context.de_method
    scored = np.flatnonzero(reference.row_of >= 0)
    target = context.condition_stats(half)
    shape = (layout.n_conditions, len(context.genes))
    statistic = np.full(shape, np.nan)
    pvalue = np.full(shape, np.nan)
    if method == "wilcoxon":
        statistic, pvalue = wilcoxon_against(
            context.dataset, layout, _cell_pools(layout, reference), half, context.threads
        )
    else:
        # Every other method works on the moments of the two groups.
        statistic[scored], pvalue[scored] = DE_METHODS.get(method).func(
            context,
            target.select(scored),
            reference.pools.select(reference.row_of[scored]),
            "training",
            half,
        )
    pvalue_adj = np.full(shape, np.nan)
    # A group without training cells has no test: its rows stay NaN.
    tested = scored[np.isfinite(pvalue[scored]).all(axis=1)]
    pvalue_adj[tested] = benjamini_hochberg(pvalue[tested], threads=context.threads)
    mean_reference = np.full(shape, np.nan)
    mean_reference[scored] = reference.pools.mean[reference.row_of[scored]]
    return DEResult(
        conditions=layout.conditions,
        genes=context.genes,
        statistic=statistic,
        pvalue=pvalue,
        pvalue_adj=pvalue_adj,
        mean_target=target.mean,
        mean_reference=mean_reference,
        method=method,
        reference="training",
        half=half,
    )


def _cell_pools(
    layout: GroupLayout, reference: TrainingReference
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per fold and group, its held-out conditions and the positions of its training cells."""
    pools = []
    for fold, training in enumerate(reference.folds.training):
        for group, members in enumerate(training):
            held_out = np.flatnonzero(reference.row_of == fold * len(training) + group)
            if held_out.size == 0:
                continue
            cells = [layout.positions(int(k)) for k in members]
            positions = np.sort(np.concatenate(cells)) if cells else np.empty(0, dtype=np.int64)
            pools.append((held_out, positions))
    return pools
