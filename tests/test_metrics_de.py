import numpy as np
import pytest
from scipy.stats import rankdata
from sklearn.metrics import average_precision_score, roc_auc_score

from scperteval.metrics import DegenerateInput, DEView, de_auprc, de_auroc, de_topk_overlap


def random_views(seed, size=60, decimals=1):
    rng = np.random.default_rng(seed)
    padj = rng.uniform(size=size) ** 3
    truth = DEView(statistic=rng.normal(size=size), pvalue_adj=padj)
    # Rounding creates ties in the predicted scores.
    statistic = np.round(rng.normal(size=size) * 2, decimals)
    statistic[rng.integers(0, size, 4)] = np.nan
    prediction = DEView(statistic=statistic, pvalue_adj=rng.uniform(size=size))
    return truth, prediction


@pytest.mark.parametrize("seed", range(8))
def test_auprc_and_auroc_match_sklearn(seed):
    truth, prediction = random_views(seed, decimals=seed % 3)
    labels = truth.pvalue_adj < 0.05
    scores = np.nan_to_num(np.abs(prediction.statistic), nan=0.0)
    assert de_auprc(truth, prediction) == pytest.approx(
        average_precision_score(labels, scores), rel=1e-12
    )
    assert de_auroc(truth, prediction) == pytest.approx(roc_auc_score(labels, scores), rel=1e-12)
    labels = truth.pvalue_adj < 0.2
    assert de_auprc(truth, prediction, alpha=0.2) == pytest.approx(
        average_precision_score(labels, scores), rel=1e-12
    )


def test_hand_computed_values():
    truth = DEView(statistic=np.zeros(4), pvalue_adj=np.array([0.01, 0.5, 0.01, 0.5]))
    prediction = DEView(statistic=np.array([4.0, -3.0, 2.0, 1.0]), pvalue_adj=np.ones(4))
    # Ranked: pos, neg, pos, neg -> precision at the positives 1 and 2/3.
    assert de_auprc(truth, prediction) == pytest.approx((1.0 + 2.0 / 3.0) / 2.0)
    # Positive-negative pairs ordered correctly: 3 of 4.
    assert de_auroc(truth, prediction) == pytest.approx(0.75)


def test_perfect_and_constant_rankings():
    padj = np.array([0.001, 0.01, 0.5, 0.9, 0.3])
    truth = DEView(statistic=np.zeros(5), pvalue_adj=padj)
    perfect = DEView(statistic=np.array([-9.0, 8.0, 1.0, 0.5, 0.2]), pvalue_adj=np.ones(5))
    assert de_auprc(truth, perfect) == 1.0
    assert de_auroc(truth, perfect) == 1.0
    constant = DEView(statistic=np.ones(5), pvalue_adj=np.ones(5))
    assert de_auroc(truth, constant) == 0.5
    assert de_auprc(truth, constant) == pytest.approx(2.0 / 5.0)


def test_infinite_statistic_ranks_first_and_nan_last():
    truth = DEView(statistic=np.zeros(4), pvalue_adj=np.array([0.01, 0.5, 0.01, 0.5]))
    prediction = DEView(statistic=np.array([-np.inf, 3.0, np.nan, 5.0]), pvalue_adj=np.ones(4))
    # Ranked: inf (pos), 5 (neg), 3 (neg), NaN as 0 (pos).
    assert de_auroc(truth, prediction) == pytest.approx(0.5)
    assert de_auprc(truth, prediction) == pytest.approx((1.0 + 2.0 / 4.0) / 2.0)


@pytest.mark.parametrize("metric", [de_auprc, de_auroc])
def test_no_or_only_positives_are_degenerate(metric):
    prediction = DEView(statistic=np.arange(4.0), pvalue_adj=np.ones(4))
    none = DEView(statistic=np.zeros(4), pvalue_adj=np.array([0.5, 0.9, np.nan, 1.0]))
    with pytest.raises(DegenerateInput, match="no DE genes"):
        metric(none, prediction)
    every = DEView(statistic=np.zeros(4), pvalue_adj=np.full(4, 1e-3))
    with pytest.raises(DegenerateInput, match="only DE genes"):
        metric(every, prediction)


def test_topk_overlap_values():
    truth = DEView(statistic=np.array([9.0, -8.0, 7.0, 1.0, 0.5, 0.1]), pvalue_adj=np.ones(6))
    same_order = DEView(statistic=np.array([5.0, 4.0, -3.0, 0.0, 0.0, 0.0]), pvalue_adj=np.ones(6))
    assert de_topk_overlap(truth, same_order, k=3) == 1.0
    half = DEView(statistic=np.array([5.0, 0.0, 0.0, 4.0, 3.0, 0.0]), pvalue_adj=np.ones(6))
    assert de_topk_overlap(truth, half, k=3) == pytest.approx(1.0 / 3.0)
    assert de_topk_overlap(truth, half, k=1) == 1.0


def test_topk_ties_count_against_the_prediction():
    truth = DEView(statistic=np.array([9.0, 8.0, 7.0, 1.0, 0.5, 0.1]), pvalue_adj=np.ones(6))
    constant = DEView(statistic=np.ones(6), pvalue_adj=np.ones(6))
    assert de_topk_overlap(truth, constant, k=2) == 0.0
    assert de_topk_overlap(truth, constant, k=4) == pytest.approx(2.0 / 4.0)  # (2k - G) / k
    # A tie at the cut-off between a truth top gene and another gene: the other one wins.
    tied = DEView(statistic=np.array([5.0, 2.0, 0.0, 2.0, 0.0, 0.0]), pvalue_adj=np.ones(6))
    assert de_topk_overlap(truth, tied, k=2) == pytest.approx(0.5)
    # Ties in the truth are broken by feature order.
    flat_truth = DEView(statistic=np.ones(6), pvalue_adj=np.ones(6))
    first_two = DEView(statistic=np.array([3.0, 2.0, 1.0, 0.0, 0.0, 0.0]), pvalue_adj=np.ones(6))
    assert de_topk_overlap(flat_truth, first_two, k=2) == 1.0


def test_topk_invalid():
    view = DEView(statistic=np.arange(5.0), pvalue_adj=np.ones(5))
    with pytest.raises(DegenerateInput, match="k=5"):
        de_topk_overlap(view, view, k=5)
    with pytest.raises(ValueError, match="k must"):
        de_topk_overlap(view, view, k=0)
    other = DEView(statistic=np.arange(4.0), pvalue_adj=np.ones(4))
    with pytest.raises(ValueError, match="features"):
        de_topk_overlap(view, other, k=2)
    with pytest.raises(ValueError, match="features"):
        de_auroc(view, other)


def test_deview_checks_shapes():
    with pytest.raises(ValueError, match="adjusted p-values"):
        DEView(statistic=np.zeros(3), pvalue_adj=np.zeros(4))
    with pytest.raises(ValueError, match="one-dimensional"):
        DEView(statistic=np.zeros((2, 2)), pvalue_adj=np.zeros((2, 2)))


def tied_views(seed, size=300):
    """Views with many ties, infinities and NaN, in truth and prediction."""
    rng = np.random.default_rng(seed)
    truth_statistic = rng.integers(-4, 5, size=size).astype(float)
    truth_statistic[rng.integers(0, size, 5)] = np.inf
    truth = DEView(statistic=truth_statistic, pvalue_adj=rng.uniform(size=size) ** 2)
    statistic = rng.integers(-6, 7, size=size).astype(float)
    statistic[rng.integers(0, size, 6)] = np.nan
    statistic[rng.integers(0, size, 6)] = -np.inf
    statistic[rng.integers(0, size, 3)] = -0.0
    return truth, DEView(statistic=statistic, pvalue_adj=np.ones(size))


def slow_scores(view):
    return [0.0 if np.isnan(s) else abs(s) for s in view.statistic]


def slow_auroc(truth, prediction, alpha=0.05):
    """Mann-Whitney count over every positive-negative pair, ties one half."""
    scores = slow_scores(prediction)
    positive = [p < alpha for p in truth.pvalue_adj]
    pairs = 0.0
    for i, is_positive in enumerate(positive):
        for j, is_negative in enumerate(positive):
            if is_positive and not is_negative:
                pairs += 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
    n_positive = sum(positive)
    return pairs / (n_positive * (len(positive) - n_positive))


def rank_based_auprc(truth, prediction, alpha=0.05):
    """Average precision through dense ranks, each threshold closed by a rank change."""
    scores = rankdata(np.array(slow_scores(prediction)), method="dense").astype(float)
    positive = truth.pvalue_adj < alpha
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(positive[order])
    closes = np.r_[np.flatnonzero(np.diff(scores[order])), scores.size - 1]
    true_positives = hits[closes].astype(np.float64)
    precision = true_positives / (closes + 1)
    recall = true_positives / true_positives[-1]
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def slow_topk_overlap(truth, prediction, k):
    """Top sets by sorting whole keys: truth by (score, index), prediction by (score,
    membership in the truth's top k, index)."""
    truth_scores, scores = slow_scores(truth), slow_scores(prediction)
    features = range(len(scores))
    truth_top = set(sorted(features, key=lambda i: (-truth_scores[i], i))[:k])
    top = sorted(features, key=lambda i: (-scores[i], i in truth_top, i))[:k]
    return len(truth_top.intersection(top)) / k


@pytest.mark.parametrize("seed", range(6))
def test_de_metrics_equal_slow_references_exactly_with_ties(seed):
    truth, prediction = tied_views(seed)
    assert de_auroc(truth, prediction) == slow_auroc(truth, prediction)
    assert de_auprc(truth, prediction) == rank_based_auprc(truth, prediction)
    # sklearn refuses infinite scores; their ranks order the genes the same way.
    labels = truth.pvalue_adj < 0.05
    scores = rankdata(slow_scores(prediction), method="dense")
    assert de_auprc(truth, prediction) == pytest.approx(
        average_precision_score(labels, scores), rel=1e-12
    )
    assert de_auroc(truth, prediction) == pytest.approx(roc_auc_score(labels, scores), rel=1e-12)
    for k in (1, 7, 40, 150, 299):
        assert de_topk_overlap(truth, prediction, k=k) == slow_topk_overlap(truth, prediction, k)


def test_ranking_is_sorted_once_and_read_only_by_the_metrics():
    truth, prediction = tied_views(0)
    order, evidence = prediction.ranked()
    assert prediction.ranked()[0] is order
    expected = np.array(slow_scores(prediction))
    np.testing.assert_array_equal(evidence, expected[order])
    assert np.all(np.diff(evidence[np.isfinite(evidence)]) <= 0)
    # Equal evidence keeps feature order.
    tied = evidence[1:] == evidence[:-1]
    assert np.all(order[1:][tied] > order[:-1][tied])
    kept = order.copy()
    de_auprc(truth, prediction)
    de_auroc(truth, prediction)
    de_topk_overlap(truth, prediction, k=20)
    np.testing.assert_array_equal(prediction.ranked()[0], kept)


def test_deferred_adjusted_pvalues_are_computed_once_on_access():
    calls = []

    def adjusted():
        calls.append(1)
        return np.array([0.01, 0.5, 0.2])

    view = DEView(statistic=np.array([3.0, 0.1, -1.0]), pvalue_adj=adjusted)
    assert calls == [] and len(view) == 3
    np.testing.assert_array_equal(view.pvalue_adj, [0.01, 0.5, 0.2])
    np.testing.assert_array_equal(view.pvalue_adj, [0.01, 0.5, 0.2])
    assert calls == [1]
    # A prediction's p-values are never needed by the metrics.
    truth = DEView(statistic=np.zeros(3), pvalue_adj=np.array([0.01, 0.5, 0.01]))
    untouched = DEView(statistic=np.array([2.0, 0.0, 1.0]), pvalue_adj=lambda: 1 / 0)
    assert de_auroc(truth, untouched) == 1.0
    with pytest.raises(ValueError, match="3 DE statistics but 2"):
        _ = DEView(statistic=np.zeros(3), pvalue_adj=lambda: np.zeros(2)).pvalue_adj
