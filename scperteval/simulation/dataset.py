"""Simulated Perturb-seq data whose perturbation effects are known exactly.

The generative model, per covariate group ``c`` (a cell line) and condition ``k``
(control, a single perturbation or a combination ``A+B``):

- log relative abundance ``a[c, k] = baseline[c] + effect[k] + bias * [k perturbed]``;
- expression proportions ``p[c, k] = softmax(a[c, k])`` over genes;
- counts of cell ``i`` are gamma-Poisson (negative binomial):
  ``count[i, g] ~ Poisson(L_i * p[c, k, g] * Gamma(1/dispersion, dispersion))``
  with a log-normal library size ``L_i`` of mean ``library_size``;
- ``X`` is ``log1p(1e4 * count / total_count)`` per cell (scanpy's
  ``normalize_total(target_sum=1e4)`` followed by ``log1p``).

A single perturbation knocks its target gene down by ``knockdown_efficiency`` and
shifts a random subset of other genes (its programme). A combination adds the
effects of its two singles plus an interaction term on the genes of either
programme. The control bias is a shift every perturbed cell shares and no control
cell has: the confounder that makes deltas against control misleading.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from numbers import Integral, Real
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

__all__ = ["NORMALIZED_TOTAL", "simulate"]

NORMALIZED_TOTAL = 1e4

# Cells are sampled in blocks of this many rows, each block from its own random
# stream: memory stays bounded and the output does not depend on anything but the
# arguments. Changing this value changes the data generated for a given seed.
_CELL_BLOCK = 2048
_N_THREADS = min(4, os.cpu_count() or 1)


def simulate(
    n_perturbations: int = 20,
    n_genes: int = 200,
    cells_per_perturbation: int = 100,
    n_control_cells: int | None = None,
    affected_fraction: float = 0.1,
    effect_size: float = 1.0,
    control_bias: float = 0.0,
    control_bias_fraction: float = 0.2,
    n_covariates: int = 1,
    n_combinations: int = 0,
    interaction_size: float = 0.0,
    library_size: float = 5000.0,
    dispersion: float = 0.2,
    seed: int = 0,
    perturbation_key: str = "perturbation",
    covariate_key: str = "cell_line",
    control_label: str = "control",
    *,
    knockdown_efficiency: float = 0.8,
    effect_strength_sd: float = 0.5,
    baseline_sd: float = 1.5,
    covariate_sd: float = 0.5,
    library_size_sd: float = 0.3,
) -> ad.AnnData:
    """Simulate a Perturb-seq screen with known perturbation effects.

    Parameters
    ----------
    n_perturbations
        Number of single-gene perturbations. Each targets a distinct gene and is
        named after it (``"G12"``). Targets are drawn from the better-expressed
        half of the genes, as screens target expressed genes, so knock-downs are
        measurable.
    n_genes
        Number of genes, named ``G0``, ``G1``, ...
    cells_per_perturbation
        Cells of every perturbation (and combination) in every covariate group.
    n_control_cells
        Control cells in every covariate group; ``None`` means
        ``2 * cells_per_perturbation``.
    affected_fraction
        Fraction of the genes (other than the target) in each perturbation's
        programme.
    effect_size
        Standard deviation of the programme's log-fold-changes (natural log).
    control_bias
        Magnitude of the log-fold-change every perturbed cell shares relative to
        control cells, with a random sign per biased gene. Controls never carry it.
    control_bias_fraction
        Fraction of genes carrying the control bias.
    n_covariates
        Number of covariate groups (cell lines). Each has its own baseline
        expression and its own control cells; every perturbation appears in every
        group.
    n_combinations
        Number of distinct pairs ``A+B`` of single perturbations also profiled.
    interaction_size
        Standard deviation of a combination's interaction log-fold-change, drawn
        on the genes of either single's programme (targets excluded). With ``0`` a
        combination's effect is exactly the sum of its singles' effects.
    library_size
        Mean total count per cell.
    dispersion
        Negative-binomial dispersion ``phi`` (variance ``mu + phi * mu**2``); ``0``
        gives Poisson counts.
    seed
        Seed of every random draw; the output depends on the arguments only.
    perturbation_key, covariate_key
        Names of the ``obs`` columns holding the perturbation and covariate labels.
    control_label
        Perturbation label of control cells.
    knockdown_efficiency
        Fraction of the target's expression removed by its perturbation, in
        ``[0, 1)``.
    effect_strength_sd
        Log-normal spread of a per-perturbation multiplier on its programme, so
        some perturbations are strong and some weak; ``0`` makes all alike.
    baseline_sd
        Spread of the genes' log relative abundance (normal, natural log).
    covariate_sd
        Spread of each covariate group's per-gene shift from the shared baseline.
    library_size_sd
        Log-normal spread of the per-cell library size.

    Returns
    -------
    anndata.AnnData
        Cells x genes. ``X``: log-normalised expression (CSR, float32);
        ``layers["counts"]``: raw counts (CSR, float32). ``obs`` holds the
        categorical columns ``perturbation_key``, ``covariate_key`` and
        ``"target_gene"`` (the target's name, ``"Ga+Gb"`` for a combination, empty
        for controls). Cells are in random order.

        ``uns["simulation"]`` holds the ground truth, in a form that survives
        ``write_h5ad``/``read_h5ad``:

        - ``"parameters"``: every argument, ``n_control_cells`` resolved;
        - ``"gene_names"``: the genes the arrays' columns refer to (align by name
          after subsetting genes);
        - ``"conditions"``: dict of string arrays ``"covariate"``,
          ``"perturbation"`` and ``"target_gene"``, one entry per
          (covariate, condition), controls included; rows of the arrays below;
        - ``"effects"``: float32 (conditions x genes), the perturbation's own
          shift of log relative abundance, before the per-condition
          renormalisation; zero for controls; control bias excluded;
        - ``"control_bias"``: float32 (genes), the shift all perturbed cells share;
        - ``"profiles"``: float32 (conditions x genes), the noise-free
          log-normalised profile ``log1p(1e4 * p)``. The centroid of the
          simulated cells approaches it for highly expressed genes; for sparse
          genes the mean of ``log1p`` of noisy counts lies below it.

    Raises
    ------
    ValueError
        If an argument is out of range or the design is impossible (more
        perturbations than genes, more combinations than pairs, a control label
        that is also a gene name).

    """
    n_perturbations = _check_int("n_perturbations", n_perturbations, minimum=1)
    n_genes = _check_int("n_genes", n_genes, minimum=2)
    cells_per_perturbation = _check_int("cells_per_perturbation", cells_per_perturbation, 1)
    if n_control_cells is None:
        n_control_cells = 2 * cells_per_perturbation
    n_control_cells = _check_int("n_control_cells", n_control_cells, minimum=1)
    n_covariates = _check_int("n_covariates", n_covariates, minimum=1)
    n_combinations = _check_int("n_combinations", n_combinations, minimum=0)
    seed = _check_int("seed", seed, minimum=0)
    affected_fraction = _check_real("affected_fraction", affected_fraction, 0.0, 1.0)
    control_bias_fraction = _check_real("control_bias_fraction", control_bias_fraction, 0.0, 1.0)
    effect_size = _check_real("effect_size", effect_size, 0.0)
    control_bias = _check_real("control_bias", control_bias, 0.0)
    interaction_size = _check_real("interaction_size", interaction_size, 0.0)
    dispersion = _check_real("dispersion", dispersion, 0.0)
    effect_strength_sd = _check_real("effect_strength_sd", effect_strength_sd, 0.0)
    baseline_sd = _check_real("baseline_sd", baseline_sd, 0.0)
    covariate_sd = _check_real("covariate_sd", covariate_sd, 0.0)
    library_size_sd = _check_real("library_size_sd", library_size_sd, 0.0)
    knockdown_efficiency = _check_real("knockdown_efficiency", knockdown_efficiency, 0.0, 1.0)
    if knockdown_efficiency >= 1.0:
        raise ValueError(
            f"knockdown_efficiency must be below 1 (a full knock-out has an infinite "
            f"log-fold-change), got {knockdown_efficiency}"
        )
    library_size = _check_real("library_size", library_size, 0.0)
    if library_size <= 0:
        raise ValueError(f"library_size must be positive, got {library_size}")
    # Taken before any other local is bound: every argument, in signature order,
    # as validated, which the ground truth records.
    parameters: dict[str, Any] = dict(locals())
    if n_perturbations > n_genes:
        raise ValueError(
            f"n_perturbations ({n_perturbations}) cannot exceed n_genes ({n_genes}): "
            "each perturbation targets a distinct gene"
        )
    n_pairs = n_perturbations * (n_perturbations - 1) // 2
    if n_combinations > n_pairs:
        raise ValueError(
            f"n_combinations ({n_combinations}) exceeds the {n_pairs} distinct pairs "
            f"of {n_perturbations} perturbations"
        )
    for name, key in (("perturbation_key", perturbation_key), ("covariate_key", covariate_key)):
        if not isinstance(key, str) or not key or key == "target_gene":
            raise ValueError(f"{name} must be a non-empty string other than 'target_gene'")
    if perturbation_key == covariate_key:
        raise ValueError("perturbation_key and covariate_key must differ")
    gene_names = np.array([f"G{g}" for g in range(n_genes)], dtype=object)
    if not isinstance(control_label, str) or not control_label or "+" in control_label:
        raise ValueError("control_label must be a non-empty string without '+'")
    if control_label in set(gene_names):
        raise ValueError(f"control_label {control_label!r} is also a gene name")

    # Independent streams per component, so e.g. adding combinations leaves the
    # baseline, the singles and the bias of a seed unchanged.
    baseline_seq, design_seq, combination_seq, cell_seq, count_seq = np.random.SeedSequence(
        seed
    ).spawn(5)

    baseline_rng = np.random.default_rng(baseline_seq)
    shared_baseline = baseline_rng.normal(0.0, baseline_sd, n_genes)
    covariate_baselines = shared_baseline + baseline_rng.normal(
        0.0, covariate_sd, (n_covariates, n_genes)
    )

    design_rng = np.random.default_rng(design_seq)
    targets = _draw_targets(design_rng, covariate_baselines.mean(axis=0), n_perturbations)
    single_effects, programmes = _draw_single_effects(
        design_rng,
        targets,
        n_genes,
        n_affected=min(round(affected_fraction * n_genes), n_genes - 1),
        effect_size=effect_size,
        effect_strength_sd=effect_strength_sd,
        target_log_fold_change=float(np.log1p(-knockdown_efficiency)),
    )
    bias = np.zeros(n_genes)
    n_biased = round(control_bias_fraction * n_genes)
    biased_genes = design_rng.choice(n_genes, n_biased, replace=False)
    bias[biased_genes] = control_bias * design_rng.choice(np.array([-1.0, 1.0]), n_biased)

    combination_rng = np.random.default_rng(combination_seq)
    pairs, combination_effects = _draw_combinations(
        combination_rng, single_effects, programmes, targets, n_combinations, interaction_size
    )

    single_names = [str(gene_names[t]) for t in targets]
    condition_names = (
        [control_label] + single_names + [f"{single_names[a]}+{single_names[b]}" for a, b in pairs]
    )
    condition_targets = [""] + single_names + condition_names[1 + n_perturbations :]
    condition_effects = np.vstack([np.zeros((1, n_genes)), single_effects, combination_effects])
    n_conditions = len(condition_names)
    covariate_names = [f"{covariate_key}_{c}" for c in range(n_covariates)]

    # Rows ordered covariate-major: row = covariate * n_conditions + condition.
    is_perturbed = np.arange(n_conditions) > 0
    log_abundance = (
        covariate_baselines[:, None, :]
        + condition_effects[None, :, :]
        + np.where(is_perturbed[:, None], bias, 0.0)[None, :, :]
    ).reshape(n_covariates * n_conditions, n_genes)
    proportions = np.exp(log_abundance - log_abundance.max(axis=1, keepdims=True))
    proportions /= proportions.sum(axis=1, keepdims=True)

    cells_per_condition = np.where(is_perturbed, cells_per_perturbation, n_control_cells)
    cell_rng = np.random.default_rng(cell_seq)
    cell_condition = cell_rng.permutation(
        np.repeat(
            np.arange(n_covariates * n_conditions), np.tile(cells_per_condition, n_covariates)
        )
    )
    cell_library = library_size * np.exp(
        cell_rng.normal(-0.5 * library_size_sd**2, library_size_sd, cell_condition.size)
    )

    counts, normalized = _sample_counts(
        proportions, cell_condition, cell_library, dispersion, count_seq
    )

    covariate_of_cell = cell_condition // n_conditions
    condition_of_cell = cell_condition % n_conditions
    obs = pd.DataFrame(
        {
            perturbation_key: pd.Categorical.from_codes(
                condition_of_cell, categories=pd.Index(condition_names)
            ),
            covariate_key: pd.Categorical.from_codes(
                covariate_of_cell, categories=pd.Index(covariate_names)
            ),
            "target_gene": pd.Categorical(
                np.asarray(condition_targets, dtype=object)[condition_of_cell],
                categories=pd.Index(dict.fromkeys(condition_targets)),
            ),
        },
        index=pd.Index([f"cell{i}" for i in range(cell_condition.size)]),
    )

    truth = {
        "parameters": {**parameters, "normalized_total": NORMALIZED_TOTAL},
        "gene_names": gene_names.astype(str),
        "conditions": {
            "covariate": np.repeat(np.asarray(covariate_names, dtype=str), n_conditions),
            "perturbation": np.tile(np.asarray(condition_names, dtype=str), n_covariates),
            "target_gene": np.tile(np.asarray(condition_targets, dtype=str), n_covariates),
        },
        "effects": np.tile(condition_effects, (n_covariates, 1)).astype(np.float32),
        "control_bias": bias.astype(np.float32),
        "profiles": np.log1p(NORMALIZED_TOTAL * proportions).astype(np.float32),
    }
    return ad.AnnData(
        X=normalized,
        obs=obs,
        var=pd.DataFrame(index=pd.Index(gene_names.astype(str))),
        layers={"counts": counts},
        uns={"simulation": truth},
    )


def _draw_targets(
    rng: np.random.Generator, mean_log_abundance: np.ndarray, n_perturbations: int
) -> np.ndarray:
    """Pick distinct target genes among the better-expressed genes, in gene order."""
    n_genes = mean_log_abundance.size
    n_candidates = max(n_perturbations, n_genes // 2)
    candidates = np.argsort(-mean_log_abundance, kind="stable")[:n_candidates]
    return np.sort(rng.choice(candidates, n_perturbations, replace=False))


def _draw_single_effects(
    rng: np.random.Generator,
    targets: np.ndarray,
    n_genes: int,
    *,
    n_affected: int,
    effect_size: float,
    effect_strength_sd: float,
    target_log_fold_change: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw every single perturbation's log-fold-changes: knock-down plus programme.

    Returns the effects and a boolean mask of each programme's genes (target
    excluded), which is kept separately because a programme effect can be 0.
    """
    effects = np.zeros((targets.size, n_genes))
    programmes = np.zeros((targets.size, n_genes), dtype=bool)
    strengths = rng.lognormal(0.0, effect_strength_sd, targets.size)
    for row, target in enumerate(targets):
        # Draw among the other n_genes - 1 genes, then skip over the target.
        affected = rng.choice(n_genes - 1, n_affected, replace=False)
        affected[affected >= target] += 1
        effects[row, affected] = rng.normal(0.0, effect_size, n_affected) * strengths[row]
        effects[row, target] = target_log_fold_change
        programmes[row, affected] = True
    return effects, programmes


def _draw_combinations(
    rng: np.random.Generator,
    single_effects: np.ndarray,
    programmes: np.ndarray,
    targets: np.ndarray,
    n_combinations: int,
    interaction_size: float,
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Draw distinct pairs of singles and their additive-plus-interaction effects."""
    n_singles, n_genes = single_effects.shape
    n_pairs = n_singles * (n_singles - 1) // 2
    chosen = np.sort(rng.choice(n_pairs, n_combinations, replace=False))
    pairs = [_pair_of_index(int(index), n_singles) for index in chosen]
    effects = np.zeros((n_combinations, n_genes))
    for row, (a, b) in enumerate(pairs):
        effects[row] = single_effects[a] + single_effects[b]
        # Knock-downs stay additive: an interaction acts on the programmes only.
        interacting = programmes[a] | programmes[b]
        interacting[targets[[a, b]]] = False
        # Drawn even when interaction_size is 0 so the random stream, and hence
        # the pairs' effects, do not depend on it.
        effects[row, interacting] += rng.normal(0.0, interaction_size, int(interacting.sum()))
    return pairs, effects


def _pair_of_index(index: int, n: int) -> tuple[int, int]:
    """Return pair ``(i, j)``, ``i < j < n``, number ``index`` in row-major order.

    Indexing pairs avoids materialising all ``n * (n - 1) / 2`` of them, which
    would be large for genome-wide screens.
    """
    # Pairs before row i: i * (2n - i - 1) / 2. Invert the quadratic, then
    # correct the float estimate by at most a step either way.
    row = int((2 * n - 1 - math.sqrt((2 * n - 1) ** 2 - 8 * index)) // 2)
    row = max(row, 0)
    while row > 0 and row * (2 * n - row - 1) // 2 > index:
        row -= 1
    while (row + 1) * (2 * n - row - 2) // 2 <= index:
        row += 1
    return row, index - row * (2 * n - row - 1) // 2 + row + 1


def _sample_counts(
    proportions: np.ndarray,
    cell_condition: np.ndarray,
    cell_library: np.ndarray,
    dispersion: float,
    count_seq: np.random.SeedSequence,
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Sample gamma-Poisson counts block by block; return counts and log-normalised CSR."""
    n_cells = cell_condition.size
    n_genes = proportions.shape[1]
    block_starts = range(0, n_cells, _CELL_BLOCK)
    block_seqs = count_seq.spawn(len(block_starts))

    def sample_block(
        start: int, block_seq: np.random.SeedSequence
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        stop = min(start + _CELL_BLOCK, n_cells)
        rng = np.random.default_rng(block_seq)
        rate = proportions[cell_condition[start:stop]]
        rate *= cell_library[start:stop, None]
        if dispersion > 0:
            # Gamma(shape 1/phi, scale phi) has mean 1 and variance phi.
            rate *= rng.standard_gamma(1.0 / dispersion, rate.shape) * dispersion
        block = rng.poisson(rate)
        flat = np.flatnonzero(block)
        rows = flat // n_genes
        values = block.ravel()[flat].astype(np.float64)
        totals = block.sum(axis=1)
        normalized = np.log1p(values * (NORMALIZED_TOTAL / totals[rows]))
        return (
            values.astype(np.float32),
            normalized.astype(np.float32),
            (flat - rows * n_genes).astype(np.int32),
            np.bincount(rows, minlength=stop - start),
        )

    # Every block has its own stream, so running blocks on threads (numpy
    # releases the GIL in most of this work) leaves the result unchanged.
    with ThreadPoolExecutor(max_workers=_N_THREADS) as pool:
        blocks = list(pool.map(sample_block, block_starts, block_seqs))

    # Every screen has cells (controls and perturbed ones), so there is at least one block.
    values, normalized, indices, row_sizes = map(np.concatenate, zip(*blocks, strict=True))
    indptr = np.zeros(n_cells + 1, dtype=np.int64)
    np.cumsum(row_sizes, out=indptr[1:])
    if indptr[-1] <= np.iinfo(np.int32).max:
        indptr = indptr.astype(np.int32)
    # Each matrix owns its index arrays, so sorting or editing one in place
    # cannot corrupt the other.
    shape = (n_cells, n_genes)
    counts = sp.csr_matrix((values, indices.copy(), indptr.copy()), shape=shape)
    return counts, sp.csr_matrix((normalized, indices, indptr), shape=shape)


def _check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` as an int after checking it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_real(
    name: str, value: object, minimum: float | None, maximum: float | None = None
) -> float:
    """Return ``value`` as a float after checking it is finite and in range."""
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    value = float(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return value
