"""cell-eval's DE metrics: hand-computed toy values and slow textbook versions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score

from scperteval.metrics import METRICS, DegenerateInput
from scperteval.metrics.cell_eval import (
    ControlDE,
    control_log2_fold_change,
    de_pr_auc,
    de_roc_auc,
    direction_match,
    nsig_count,
    overlap_at_k,
    pearson_edistance,
    precision_at_k,
    sig_genes_recall,
    spearman_lfc_sig,
    spearman_nsig,
    top_significant,
)

# Truth: DEGs 0, 1, 3, 4; by |log2FC|: 1 (3), 0 (2), 3 (1), 4 (0.5).
TRUTH = ControlDE([2.0, -3.0, 5.0, 1.0, 0.5], [0.01, 0.02, 0.5, 0.03, 0.001])
# Prediction: DEGs 0, 2, 3, 4; by |log2FC|: 2 (4), 3 (2), 0 (1), 4 (0.1).
PRED = ControlDE([1.0, 1.0, 4.0, -2.0, 0.1], [0.01, 0.9, 0.01, 0.01, 0.04])


def test_fold_change_of_geometric_means_with_cell_evals_zero_rules():
    values = control_log2_fold_change(
        [np.log1p(3.0), 0.0, 0.0, np.log1p(1.0)], [np.log1p(1.0), 0.0, 1.0, 0.0]
    )
    assert values[0] == pytest.approx(np.log2(3.0))
    assert values[1] == 0.0  # 0 / 0
    assert values[2] == -np.inf
    assert values[3] == np.inf


def test_ranking_by_absolute_fold_change_keeps_gene_order_in_ties():
    assert top_significant(TRUTH).tolist() == [1, 0, 3, 4]
    tied = ControlDE([1.0, np.inf, 2.0, -np.inf, 1.0], [0.01] * 5)
    assert top_significant(tied).tolist() == [1, 3, 2, 0, 4]


def test_overlap_and_precision_toy_values():
    assert overlap_at_k(TRUTH, PRED) == pytest.approx(3 / 4)  # {1,0,3,4} & {2,3,0,4}
    assert overlap_at_k(TRUTH, PRED, k=2) == 0.0  # {1,0} & {2,3}
    assert overlap_at_k(TRUTH, PRED, k=3) == pytest.approx(2 / 3)  # {1,0,3} & {2,3,0}
    assert overlap_at_k(TRUTH, PRED, k=50) == pytest.approx(3 / 4)  # k capped at 4
    assert precision_at_k(TRUTH, PRED) == pytest.approx(3 / 4)
    assert precision_at_k(TRUTH, PRED, k=1) == 0.0  # {1} & {2}
    fewer = ControlDE([0.0, 0.0, 4.0, 0.0, 0.0], [1.0, 1.0, 0.01, 1.0, 1.0])
    # One predicted DEG: overlap cuts the truth at 4 but the prediction has one.
    assert overlap_at_k(TRUTH, fewer) == 0.0
    assert precision_at_k(TRUTH, fewer) == 0.0
    assert precision_at_k(fewer, PRED) == pytest.approx(1 / 4)  # truth {2} vs {2,3,0,4}
    assert overlap_at_k(fewer, PRED) == 1.0  # k = 1: {2} & {2}


def test_no_degs_score_zero_on_overlap_and_precision():
    none = ControlDE([1.0] * 5, [0.5] * 5)
    assert overlap_at_k(none, PRED) == 0.0
    assert precision_at_k(TRUTH, none) == 0.0


def _slow_overlap(gt: ControlDE, pred: ControlDE, k: int | None, by: str) -> float:
    def ranked(view: ControlDE) -> list[int]:
        genes = [g for g in range(len(view)) if view.fdr[g] < np.float32(0.05)]
        return sorted(genes, key=lambda g: (-abs(float(view.log2_fold_change[g])), g))

    real, predicted = ranked(gt), ranked(pred)
    size = len(real) if by == "real" else len(predicted)
    cut = size if k is None else min(k, size)
    if cut == 0:
        return 0.0
    return len(set(real[:cut]) & set(predicted[:cut])) / cut


def _random_table(rng: np.random.Generator, n: int) -> ControlDE:
    lfc = np.round(rng.normal(0, 2, n), 1)  # rounded: ties in |log2FC|
    lfc[rng.random(n) < 0.05] = np.inf
    lfc[rng.random(n) < 0.05] = -np.inf
    fdr = np.round(rng.random(n) ** 3, 3)  # ties in FDR, many below 0.05
    return ControlDE(lfc, fdr)


def test_overlap_and_precision_match_a_slow_version_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(30):
        gt, pred = _random_table(rng, 80), _random_table(rng, 80)
        for k in (None, 3, 10, 500):
            assert overlap_at_k(gt, pred, k=k) == pytest.approx(_slow_overlap(gt, pred, k, "real"))
            assert precision_at_k(gt, pred, k=k) == pytest.approx(
                _slow_overlap(gt, pred, k, "pred")
            )


def test_aucs_toy_values():
    gt = ControlDE([1.0] * 4, [0.01, 0.5, 0.01, 0.5])  # DEGs 0 and 2
    pred = ControlDE([1.0] * 4, [1e-3, 1e-2, 0.5, 1.0])  # scores 3, 2, 0.3, 0
    # Ranked: DEG, non-DEG, DEG, non-DEG. AP = 1 * 1/2 + 2/3 * 1/2; ROC: 3 of 4 pairs.
    assert de_pr_auc(gt, pred) == pytest.approx(0.5 + 1 / 3, abs=1e-12)
    assert de_roc_auc(gt, pred) == pytest.approx(0.75, abs=1e-12)


def test_aucs_match_scikit_learn_with_ties_and_a_zero_fdr():
    rng = np.random.default_rng(1)
    for _ in range(20):
        gt, pred = _random_table(rng, 120), _random_table(rng, 120)
        fdr = pred.fdr.copy()
        fdr[:5] = 0.0  # clipped at 1e-10
        pred = ControlDE(pred.log2_fold_change, fdr)
        labels = gt.fdr < np.float32(0.05)
        scores = -np.log10(np.clip(pred.fdr.astype(np.float64), 1e-10, 1.0))
        assert de_pr_auc(gt, pred) == pytest.approx(average_precision_score(labels, scores))
        assert de_roc_auc(gt, pred) == pytest.approx(roc_auc_score(labels, scores))


def test_aucs_are_nan_with_one_class():
    candidate = ControlDE([1.0] * 3, [0.1] * 3)
    assert math.isnan(de_pr_auc(ControlDE([1.0] * 3, [0.5] * 3), candidate))
    assert math.isnan(de_roc_auc(ControlDE([1.0] * 3, [0.01] * 3), candidate))


def test_significance_is_decided_at_float32():
    # 0.04999999999 rounds to float32(0.05), which is not below float32(0.05).
    view = ControlDE([1.0, 1.0], [0.04999999999, 0.0499])
    assert view.significant().tolist() == [False, True]


def test_direction_spearman_and_recall_toy_values():
    # Truth DEGs 0, 1, 3, 4 with signs +, -, +, +; predicted signs +, +, -, +.
    assert direction_match(TRUTH, PRED) == pytest.approx(2 / 4)
    # Predicted DEGs among the truth's: 0, 3, 4.
    assert sig_genes_recall(TRUTH, PRED) == pytest.approx(3 / 4)
    expected = stats.spearmanr([2.0, -3.0, 1.0, 0.5], [1.0, 1.0, -2.0, 0.1]).statistic
    assert spearman_lfc_sig(TRUTH, PRED) == pytest.approx(expected)
    zero = ControlDE([0.0, -1.0, 0.0, 0.0, 0.0], [0.5] * 5)
    assert direction_match(TRUTH, zero) == pytest.approx(1 / 4)  # only gene 1 matches


def test_spearman_lfc_with_infinite_fold_changes_matches_scipy():
    rng = np.random.default_rng(2)
    for _ in range(20):
        gt, pred = _random_table(rng, 60), _random_table(rng, 60)
        degs = gt.fdr < np.float32(0.05)
        if degs.sum() < 3:
            continue
        expected = stats.spearmanr(
            gt.log2_fold_change[degs].astype(float), pred.log2_fold_change[degs].astype(float)
        ).statistic
        assert spearman_lfc_sig(gt, pred) == pytest.approx(expected)


def test_per_gene_metrics_have_no_value_without_truth_degs():
    none = ControlDE([1.0] * 5, [0.5] * 5)
    for metric in (direction_match, spearman_lfc_sig, sig_genes_recall):
        with pytest.raises(DegenerateInput):
            metric(none, PRED)
    one = ControlDE([1.0, 0, 0, 0, 0], [0.01, 0.5, 0.5, 0.5, 0.5])
    assert math.isnan(spearman_lfc_sig(one, PRED))


def test_nsig_counts_real_and_pred():
    assert nsig_count(TRUTH, PRED, side="real") == 4.0
    assert nsig_count(TRUTH, PRED, side="pred") == 4.0
    assert nsig_count(TRUTH, ControlDE([0.0] * 5, [0.01, 1, 1, 1, 1])) == 1.0
    with pytest.raises(ValueError, match="side"):
        nsig_count(TRUTH, PRED, side="both")


def test_spearman_of_deg_counts_over_perturbations():
    def table(n_sig: int) -> ControlDE:
        return ControlDE(np.ones(10), np.r_[np.full(n_sig, 0.01), np.full(10 - n_sig, 0.5)])

    real = [table(n) for n in (3, 0, 5, 1)]
    pred = [table(n) for n in (2, 9, 4, 0)]
    # The perturbation without truth DEGs is left out: counts (3, 5, 1) vs (2, 4, 0).
    values = spearman_nsig(real, pred)
    assert values.tolist() == [pytest.approx(1.0)] * 4
    reversed_pred = [table(n) for n in (2, 0, 0, 4)]
    expected = stats.spearmanr([3, 5, 1], [2, 0, 4]).statistic
    assert spearman_nsig(real, reversed_pred)[0] == pytest.approx(expected)
    assert spearman_nsig([table(0)] * 3, pred[:3]).tolist() == [1.0] * 3  # no DEG anywhere


def test_pearson_edistance_matches_scipy_and_repeats_per_row():
    x, y = np.array([1.0, 4.0, 2.0, 8.0]), np.array([0.5, 3.0, 3.0, 5.0])
    values = pearson_edistance(x, y)
    assert values.tolist() == [pytest.approx(stats.pearsonr(x, y).statistic)] * 4
    assert np.isnan(pearson_edistance([1.0, 1.0], [1.0, 2.0])).all()
    # Equal up to rounding: a constant prediction has no correlation.
    rounded = np.array([2.0, 2.0 + 4e-16, 2.0 - 4e-16, 2.0])
    assert np.isnan(pearson_edistance(x, rounded)).all()


def test_metrics_are_registered_with_their_representation():
    for name in (
        "cell_eval_overlap",
        "cell_eval_precision",
        "cell_eval_pr_auc",
        "cell_eval_roc_auc",
        "cell_eval_direction_match",
        "cell_eval_spearman_lfc_sig",
        "cell_eval_sig_genes_recall",
        "cell_eval_nsig_count",
    ):
        meta = METRICS.get(name).meta
        assert (meta["representation"], meta["scope"]) == ("control_de", "perturbation")
    assert METRICS.get("cell_eval_spearman_sig").meta["scope"] == "dataset"
    assert METRICS.get("cell_eval_pearson_edistance").meta["representation"] == "control_edistance"
