"""Simulated model predictions of known quality, built from an observed dataset.

Each kind stands for a model whose behaviour is known in advance, so a metric can
be checked against it: a metric should rank ``noisy_truth`` with little noise
above ``mean``, ``control`` and ``mode_collapse``, and should degrade smoothly
as ``noise`` grows or ``scale`` moves away from 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from scperteval.errors import DatasetError
from scperteval.simulation.dataset import _check_int, _check_real

__all__ = ["PREDICTION_KINDS", "simulate_predictions"]

PREDICTION_KINDS = ("mean", "control", "mode_collapse", "noisy_truth", "scaled_effect")

_DEFAULT_KEYS = MappingProxyType(
    {
        "perturbation_key": "perturbation",
        "covariate_key": "cell_line",
        "control_label": "control",
    }
)

# Dense outputs are transformed this many rows at a time to bound scratch memory.
_ROW_BLOCK = 4096


def simulate_predictions(
    adata: ad.AnnData,
    kind: str,
    *,
    noise: float = 0.0,
    scale: float = 1.0,
    seed: int = 0,
    cells_per_perturbation: int | None = None,
    pseudobulk: bool = False,
    layer: str | None = None,
    perturbation_key: str | None = None,
    covariate_key: str | None = None,
    control_label: str | None = None,
) -> ad.AnnData:
    """Simulate a model's predictions for every perturbation of a dataset.

    Predictions cover every (covariate, perturbation) pair with cells in
    ``adata``; controls are not predicted. Within a covariate group, each kind
    predicts cells as follows:

    - ``"mean"``: perturbed cells of the *other* perturbations of the group,
      drawn by picking a perturbation uniformly and then one of its cells, so
      their expected centroid is the mean of the other perturbations' centroids
      (the leave-one-out dataset mean). Needs two perturbations per group.
    - ``"control"``: control cells of the group, relabelled.
    - ``"mode_collapse"``: one sample of perturbed cells, pooled over all the
      group's perturbations as for ``"mean"``, used for every perturbation: all
      predictions of the group are identical.
    - ``"noisy_truth"``: the perturbation's own cells (plus ``noise``).
    - ``"scaled_effect"``: the perturbation's own cells with their difference from
      the group's control centroid ``mu_c`` multiplied by ``scale``:
      ``mu_c + scale * (x - mu_c)``, clipped at 0.

    Parameters
    ----------
    adata
        Observed dataset, log-normalised expression in ``X`` or ``layer``, as made
        by :func:`scperteval.simulation.simulate` or read from disk.
    kind
        One of ``PREDICTION_KINDS``.
    noise
        Standard deviation of Gaussian noise added to every output value, which is
        then clipped at 0 (log-normalised expression is non-negative). Applies to
        every kind.
    scale
        Factor on the effect for ``"scaled_effect"``; must stay 1 for other kinds.
    seed
        Seed of every random draw.
    cells_per_perturbation
        Cells predicted per perturbation. ``None``: as many as the perturbation
        has in ``adata``, and for ``"noisy_truth"``/``"scaled_effect"`` exactly its
        cells in their order. Cells are drawn without replacement when enough are
        available, with replacement otherwise.
    pseudobulk
        Return one row per (covariate, perturbation) instead of cells: the
        centroid of the population the kind draws from, with no sampling error
        (for ``"mean"`` exactly the leave-one-out mean of centroids, for
        ``"control"`` the control centroid), or for ``"noisy_truth"`` and
        ``"scaled_effect"`` the centroid of the transformed cells; ``noise`` is
        then added to the row.
    layer
        Layer holding the expression; ``None`` for ``X``.
    perturbation_key, covariate_key, control_label
        Column names and control label. ``None`` takes them from
        ``adata.uns["simulation"]["parameters"]`` when present, else the defaults
        ``"perturbation"``, ``"cell_line"`` and ``"control"``. A covariate column
        absent from ``obs`` is allowed only when not named explicitly, and then
        all cells form one group.

    Returns
    -------
    anndata.AnnData
        Predictions on ``adata``'s genes (``var`` copied). ``obs`` holds the
        perturbation column, the covariate column if ``adata`` has one and
        ``"target_gene"`` if ``adata`` has one, all categorical. ``X`` is
        float32: CSR when cells are copied unchanged from a sparse input (any
        kind but ``"scaled_effect"``, without noise), dense otherwise. ``uns["prediction"]``
        records the kind and its options.

    Raises
    ------
    ValueError
        For an unknown kind or an invalid option.
    scperteval.errors.DatasetError
        If a column or label is missing, or a covariate group lacks the controls
        or perturbations the kind needs.

    """
    if kind not in PREDICTION_KINDS:
        raise ValueError(f"unknown prediction kind {kind!r}; expected one of {PREDICTION_KINDS}")
    noise = _check_real("noise", noise, 0.0)
    scale = _check_real("scale", scale, None)
    if kind != "scaled_effect" and scale != 1.0:
        raise ValueError(f"scale applies to kind 'scaled_effect' only, not {kind!r}")
    seed = _check_int("seed", seed, 0)
    if cells_per_perturbation is not None:
        cells_per_perturbation = _check_int("cells_per_perturbation", cells_per_perturbation, 1)
    pert_key, cov_key, control = _resolve_keys(
        adata, perturbation_key, covariate_key, control_label
    )
    has_covariate = cov_key in adata.obs.columns
    if not has_covariate and covariate_key is not None:
        raise DatasetError(f"covariate column {cov_key!r} not in adata.obs")
    if pert_key not in adata.obs.columns:
        raise DatasetError(f"perturbation column {pert_key!r} not in adata.obs")
    expression = _expression(adata, layer)

    design = _Design(adata.obs, pert_key, cov_key if has_covariate else None, control)
    rng = np.random.default_rng(seed)
    if pseudobulk:
        values: np.ndarray | sp.csr_matrix = _pseudobulk_rows(
            expression, design, kind, scale, cells_per_perturbation, rng
        )
        out_groups = [group for group, _ in design.pairs()]
        out_perts = [pert for _, pert in design.pairs()]
    else:
        source_rows, out_groups, out_perts = _source_rows(design, kind, cells_per_perturbation, rng)
        values = _cell_rows(expression, design, source_rows, out_groups, kind, scale)
    if noise > 0:
        values = _add_noise(values, noise, rng)

    obs = pd.DataFrame(index=pd.Index([f"{kind}_{i}" for i in range(len(out_perts))]))
    obs[pert_key] = pd.Categorical(out_perts, categories=pd.Index(design.perturbation_order))
    if has_covariate:
        obs[cov_key] = pd.Categorical(out_groups, categories=pd.Index(design.group_order))
    if "target_gene" in adata.obs.columns:
        target_of = design.target_genes(adata.obs["target_gene"])
        targets = [target_of[p] for p in out_perts]
        obs["target_gene"] = pd.Categorical(targets, categories=pd.Index(dict.fromkeys(targets)))
    return ad.AnnData(
        X=values,
        obs=obs,
        var=adata.var.copy(),
        uns={
            "prediction": {
                "kind": kind,
                "noise": noise,
                "scale": scale,
                "seed": int(seed),
                "pseudobulk": bool(pseudobulk),
                # 0 stands for "as many as the truth has": h5ad cannot store None.
                "cells_per_perturbation": int(cells_per_perturbation or 0),
                "layer": layer if layer is not None else "X",
            }
        },
    )


class _Design:
    """Row indices of every (covariate group, perturbation) and of each group's controls."""

    def __init__(
        self, obs: pd.DataFrame, pert_key: str, cov_key: str | None, control_label: str
    ) -> None:
        perturbations = obs[pert_key]
        labels = perturbations.astype(str).to_numpy()
        if not np.any(labels != control_label):
            raise DatasetError(f"column {pert_key!r} has no perturbation other than the control")
        self.perturbation_order = [p for p in _ordered_labels(perturbations) if p != control_label]
        if cov_key is None:
            groups = np.full(labels.size, "", dtype=object)
            self.group_order = [""]
        else:
            groups = obs[cov_key].astype(str).to_numpy()
            self.group_order = _ordered_labels(obs[cov_key])
        self.control_label = control_label
        self.cov_key = cov_key
        label_order = [control_label, *self.perturbation_order]
        group_codes = pd.Categorical(groups, categories=pd.Index(self.group_order)).codes
        label_codes = pd.Categorical(labels, categories=pd.Index(label_order)).codes
        pair_codes = group_codes.astype(np.int64) * len(label_order) + label_codes
        # A stable sort gathers the rows of every (group, label) pair while keeping
        # each pair's cells in their original order.
        order = np.argsort(pair_codes, kind="stable")
        starts = np.flatnonzero(np.diff(pair_codes[order])) + 1
        self.rows: dict[tuple[str, str], np.ndarray] = {}
        for chunk in np.split(order, starts):
            group_code, label_code = divmod(int(pair_codes[chunk[0]]), len(label_order))
            self.rows[(self.group_order[group_code], label_order[label_code])] = chunk
        self.perturbations_of: dict[str, list[str]] = {
            group: [p for p in self.perturbation_order if (group, p) in self.rows]
            for group in self.group_order
        }

    def controls(self, group: str) -> np.ndarray:
        """Return the control rows of ``group``, raising when it has none."""
        rows = self.rows.get((group, self.control_label))
        if rows is None:
            raise DatasetError(
                f"no control cells (label {self.control_label!r}){self.where(group)}"
            )
        return rows

    def pooled(self, group: str, exclude: str | None) -> list[np.ndarray]:
        """Return the row arrays of the group's perturbations, ``exclude`` left out."""
        pool = [self.rows[(group, p)] for p in self.perturbations_of[group] if p != exclude]
        if not pool:
            raise DatasetError(
                f"no perturbation other than {exclude!r} to pool{self.where(group)}; "
                "kind 'mean' needs at least two perturbations per group"
            )
        return pool

    def where(self, group: str) -> str:
        """Return a phrase locating ``group`` for error messages."""
        return f" in covariate group {group!r}" if self.cov_key else ""

    def perturbed_groups(self) -> list[tuple[str, list[str]]]:
        """Return every group with perturbations, and its perturbations, in output order."""
        return [(g, self.perturbations_of[g]) for g in self.group_order if self.perturbations_of[g]]

    def pairs(self) -> list[tuple[str, str]]:
        """Return every (group, perturbation) pair with cells, in output order."""
        return [(g, p) for g in self.group_order for p in self.perturbations_of[g]]

    def target_genes(self, column: pd.Series) -> dict[str, str]:
        """Map each perturbation to the target gene of its first cell."""
        targets = column.astype(str).to_numpy()
        target_of: dict[str, str] = {}
        for group, pert in self.pairs():
            target_of.setdefault(pert, str(targets[self.rows[(group, pert)][0]]))
        return target_of


def _source_rows(
    design: _Design, kind: str, cells_per_perturbation: int | None, rng: np.random.Generator
) -> tuple[np.ndarray, list[str], list[str]]:
    """Return the row each predicted cell copies, and its group and perturbation label."""
    chunks: list[np.ndarray] = []
    out_groups: list[str] = []
    out_perts: list[str] = []
    for group, perts in design.perturbed_groups():
        sizes = [cells_per_perturbation or design.rows[(group, p)].size for p in perts]
        if kind == "mode_collapse":
            shared = _pooled_sample(rng, design.pooled(group, exclude=None), max(sizes))
        for pert, size in zip(perts, sizes, strict=True):
            own = design.rows[(group, pert)]
            if kind == "control":
                chunks.append(_draw(rng, design.controls(group), size))
            elif kind == "mean":
                chunks.append(_pooled_sample(rng, design.pooled(group, exclude=pert), size))
            elif kind == "mode_collapse":
                chunks.append(shared[:size])
            elif cells_per_perturbation is None:
                chunks.append(own)
            else:
                chunks.append(_draw(rng, own, size))
            out_groups.extend([group] * size)
            out_perts.extend([pert] * size)
    return np.concatenate(chunks), out_groups, out_perts


def _cell_rows(
    expression: np.ndarray | sp.csr_matrix,
    design: _Design,
    source_rows: np.ndarray,
    out_groups: list[str],
    kind: str,
    scale: float,
) -> np.ndarray | sp.csr_matrix:
    """Copy the source rows, scaling their effect for ``"scaled_effect"``."""
    copied = expression[source_rows]
    if kind != "scaled_effect":
        return copied.astype(np.float32)
    values = _dense(copied).astype(np.float32, copy=False)
    group_codes = pd.Categorical(out_groups, categories=pd.Index(design.group_order)).codes
    centers = np.zeros((len(design.group_order), values.shape[1]))
    for code in np.unique(group_codes):
        centers[code] = _centroid(expression, design.controls(design.group_order[code]))
    # By blocks, in float64 so that scale=1 returns the cells unchanged after
    # rounding back to float32; a float64 copy of all cells at once would be large.
    for start in range(0, values.shape[0], _ROW_BLOCK):
        stop = start + _ROW_BLOCK
        center = centers[group_codes[start:stop]]
        scaled = center + scale * (values[start:stop] - center)
        values[start:stop] = np.maximum(scaled, 0.0)
    return values


def _pseudobulk_rows(
    expression: np.ndarray | sp.csr_matrix,
    design: _Design,
    kind: str,
    scale: float,
    cells_per_perturbation: int | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """One centroid per (group, perturbation), of the population the kind draws from."""
    rows: list[np.ndarray] = []
    for group, perts in design.perturbed_groups():
        centroids = {p: _centroid(expression, design.rows[(group, p)]) for p in perts}
        if kind in ("control", "scaled_effect"):
            control_centroid = _centroid(expression, design.controls(group))
        if kind in ("mean", "mode_collapse"):
            centroid_sum = np.sum(list(centroids.values()), axis=0)
        for pert in perts:
            if kind == "control":
                rows.append(control_centroid)
            elif kind == "mean":
                if len(perts) < 2:
                    design.pooled(group, exclude=pert)  # raises the explanatory error
                rows.append((centroid_sum - centroids[pert]) / (len(perts) - 1))
            elif kind == "mode_collapse":
                rows.append(centroid_sum / len(perts))
            else:
                own = design.rows[(group, pert)]
                if cells_per_perturbation is not None:
                    own = _draw(rng, own, cells_per_perturbation)
                if kind == "noisy_truth":
                    rows.append(_centroid(expression, own))
                else:
                    cells = _dense(expression[own]).astype(np.float64)
                    cells = control_centroid + scale * (cells - control_centroid)
                    rows.append(np.maximum(cells, 0.0).mean(axis=0))
    return np.vstack(rows).astype(np.float32)


def _draw(rng: np.random.Generator, rows: np.ndarray, size: int) -> np.ndarray:
    """Draw ``size`` of ``rows``, without replacement when there are enough."""
    return rng.choice(rows, size, replace=size > rows.size)


def _pooled_sample(rng: np.random.Generator, pool: list[np.ndarray], size: int) -> np.ndarray:
    """Draw cells by picking a perturbation uniformly, then one of its cells.

    Weighting perturbations equally, not cells, makes the expected centroid the
    mean of the perturbations' centroids whatever their cell counts.
    """
    pool_sizes = np.array([rows.size for rows in pool])
    offsets = np.concatenate([[0], np.cumsum(pool_sizes)[:-1]])
    which = rng.integers(len(pool), size=size)
    within = (rng.random(size) * pool_sizes[which]).astype(np.int64)
    return np.concatenate(pool)[offsets[which] + within]


def _centroid(expression: np.ndarray | sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
    """Per-gene mean of ``rows`` in float64."""
    return np.asarray(expression[rows].mean(axis=0, dtype=np.float64)).ravel()


def _dense(matrix: Any) -> np.ndarray:
    """Return a sparse or dense matrix as a dense ndarray."""
    return np.asarray(matrix.toarray() if sp.issparse(matrix) else matrix)


def _add_noise(
    values: np.ndarray | sp.csr_matrix, noise: float, rng: np.random.Generator
) -> np.ndarray:
    """Add Gaussian noise of sd ``noise`` to every value and clip at 0, as float32."""
    noisy = _dense(values).astype(np.float32)
    for start in range(0, noisy.shape[0], _ROW_BLOCK):
        block = noisy[start : start + _ROW_BLOCK]
        block += noise * rng.standard_normal(block.shape, dtype=np.float32)
        np.maximum(block, 0.0, out=block)
    return noisy


def _expression(adata: ad.AnnData, layer: str | None) -> np.ndarray | sp.csr_matrix:
    """Return the expression matrix as CSR or a dense ndarray, rows indexable."""
    if layer is None:
        matrix = adata.X
    elif layer in adata.layers:
        matrix = adata.layers[layer]
    else:
        raise DatasetError(f"layer {layer!r} not in adata.layers ({list(adata.layers)})")
    if matrix is None:
        raise DatasetError("adata.X is empty; pass the layer holding the expression")
    return sp.csr_matrix(matrix) if sp.issparse(matrix) else np.asarray(matrix)


def _resolve_keys(
    adata: ad.AnnData,
    perturbation_key: str | None,
    covariate_key: str | None,
    control_label: str | None,
) -> tuple[str, ...]:
    """Explicit arguments first, then the simulation's parameters, then defaults."""
    recorded: Mapping[str, Any] = {}
    simulation = adata.uns.get("simulation")
    if isinstance(simulation, Mapping) and isinstance(simulation.get("parameters"), Mapping):
        recorded = simulation["parameters"]
    explicit = (perturbation_key, covariate_key, control_label)
    return tuple(
        str(value if value is not None else recorded.get(name, default))
        for value, (name, default) in zip(explicit, _DEFAULT_KEYS.items(), strict=True)
    )


def _ordered_labels(column: pd.Series) -> list[str]:
    """Labels present in ``column``: category order if categorical, else sorted."""
    present = set(column.astype(str).unique())
    if isinstance(column.dtype, pd.CategoricalDtype):
        return [str(c) for c in column.cat.categories if str(c) in present]
    return sorted(present)
