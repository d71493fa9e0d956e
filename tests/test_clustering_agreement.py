"""cell-eval's clustering agreement: toy values, scikit-learn scores, scanpy's pipeline."""

from __future__ import annotations

import importlib.util
import re
import sys
import warnings

import numpy as np
import pytest
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score

from scperteval.errors import MissingExtraError, SpecError, install_command
from scperteval.metrics import METRICS, DatasetContext
from scperteval.metrics.clustering import (
    DEFAULT_RESOLUTIONS,
    clustering_agreement,
    fuzzy_neighbour_graph,
    leiden_labels,
)

needs_igraph = pytest.mark.skipif(
    importlib.util.find_spec("igraph") is None, reason="igraph (the cluster extra) is absent"
)

#: Three blobs of ten points, far apart: every clustering finds them.
BLOB = np.repeat(np.arange(3), 10)


@pytest.fixture(scope="module")
def blobs() -> np.ndarray:
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0, 0, 0], [10, 0, 0, 0], [0, 10, 0, 0]])
    return centres[BLOB] + rng.normal(scale=0.5, size=(30, 4))


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = {(int(x), int(y)) for x, y in zip(a, b, strict=True)}
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def _textbook_nmi(u: np.ndarray, v: np.ndarray) -> float:
    n = u.size
    joint = np.array([[np.sum((u == i) & (v == j)) for j in np.unique(v)] for i in np.unique(u)])
    p = joint / n
    pu, pv = p.sum(axis=1), p.sum(axis=0)
    nz = p > 0
    mi = float(np.sum(p[nz] * np.log(p[nz] / np.outer(pu, pv)[nz])))
    entropy = float(-np.sum(pu * np.log(pu)) - np.sum(pv * np.log(pv)))
    return mi / (entropy / 2)


@needs_igraph
def test_every_resolution_finds_the_blobs(blobs) -> None:
    graph = fuzzy_neighbour_graph(blobs)
    for resolution in (1.0, *DEFAULT_RESOLUTIONS):
        assert _same_partition(leiden_labels(graph, resolution), BLOB)


@needs_igraph
def test_a_slightly_moved_prediction_agrees_perfectly(blobs) -> None:
    pred = blobs + np.random.default_rng(1).normal(scale=0.05, size=blobs.shape)
    for score in ("ami", "nmi", "ari"):
        np.testing.assert_array_equal(clustering_agreement(blobs, pred, score=score), 1.0)


@needs_igraph
def test_two_swapped_perturbations_score_the_textbook_values(blobs) -> None:
    # Perturbations 0 and 10 predicted as each other: the prediction's clusters are
    # the blobs with those two labels exchanged.
    order = np.arange(30)
    order[[0, 10]] = [10, 0]
    pred = blobs[order]
    swapped = BLOB[order]
    # Pair counting by hand: clusters of 10, 10, 10 against 9+1, 1+9, 10.
    pairs, rows, total = 36 + 36 + 45, 3 * 45, 435
    expected = rows * rows / total
    ari = (pairs - expected) / (rows - expected)
    assert ari == pytest.approx(adjusted_rand_score(BLOB, swapped), rel=1e-12)
    assert clustering_agreement(blobs, pred, score="ari")[0] == pytest.approx(
        (ari + 1) / 2, rel=1e-12
    )
    assert clustering_agreement(blobs, pred, score="nmi")[0] == pytest.approx(
        _textbook_nmi(BLOB, swapped), rel=1e-12
    )
    assert clustering_agreement(blobs, pred)[0] == pytest.approx(
        adjusted_mutual_info_score(BLOB, swapped), rel=1e-12
    )


@needs_igraph
def test_row_order_is_the_label_order_when_labels_are_given(blobs) -> None:
    rng = np.random.default_rng(2)
    pred = blobs + rng.normal(scale=2.5, size=blobs.shape)
    names = tuple(f"p{i:02d}" for i in range(30))
    reference = clustering_agreement(blobs, pred, DatasetContext(perturbations=names))
    order = rng.permutation(30)
    shuffled = clustering_agreement(
        blobs[order], pred[order], DatasetContext(perturbations=tuple(np.array(names)[order]))
    )
    np.testing.assert_array_equal(shuffled, reference)


def _scanpy_reference(truth: np.ndarray, pred: np.ndarray) -> tuple[float, object]:
    """cell-eval's definition run on scanpy's neighbours and Leiden (igraph flavour)."""
    anndata = pytest.importorskip("anndata")
    sc = pytest.importorskip("scanpy")
    labels = []
    graphs = []
    for matrix, resolutions in ((truth, (1.0,)), (pred, DEFAULT_RESOLUTIONS)):
        adata = anndata.AnnData(X=matrix)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sc.pp.neighbors(adata, n_neighbors=min(15, matrix.shape[0] - 1), use_rep="X")
            for resolution in resolutions:
                sc.tl.leiden(
                    adata,
                    resolution=resolution,
                    key_added=f"r{resolution}",
                    flavor="igraph",
                    n_iterations=2,
                    random_state=0,
                )
                labels.append(adata.obs[f"r{resolution}"].to_numpy())
        graphs.append(adata.obsp["connectivities"])
    real, *predicted = labels
    best = max([0.0] + [adjusted_mutual_info_score(real, p) for p in predicted])
    return best, graphs[0]


@needs_igraph
def test_equals_cell_eval_definition_run_by_scanpy() -> None:
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(5, 20))
    truth = centres[rng.integers(0, 5, 40)] + rng.normal(scale=0.8, size=(40, 20))
    pred = truth + rng.normal(scale=1.5, size=truth.shape)
    expected, graph = _scanpy_reference(truth, pred)
    ours = fuzzy_neighbour_graph(truth)
    graph = graph.tocsr()
    graph.sort_indices()
    np.testing.assert_array_equal(ours.indptr, graph.indptr)
    np.testing.assert_array_equal(ours.indices, graph.indices)
    # float32 weights bit for bit: Leiden's choices depend on them.
    np.testing.assert_array_equal(ours.data, graph.data)
    value = clustering_agreement(truth, pred)
    assert 0.0 < value[0] < 1.0
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-12)


def test_missing_igraph_is_an_error_naming_the_extra(blobs, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "igraph", None)
    with pytest.raises(MissingExtraError, match=re.escape(install_command("cluster"))):
        clustering_agreement(blobs, blobs)


def test_missing_igraph_gives_nan_with_the_reason_in_a_run(monkeypatch) -> None:
    from scperteval.simulation import simulate
    from scperteval.workflows.score import score

    screen = simulate(
        n_perturbations=5, n_genes=20, cells_per_perturbation=12, n_covariates=1, seed=2
    )
    monkeypatch.setitem(sys.modules, "igraph", None)
    perturbed = screen[screen.obs["perturbation"] != "control"].copy()
    result = score(
        screen,
        {"copy": perturbed},
        protocols="cell_eval",
        truth="all",
        baselines=False,
        workers=1,
        figures=False,
        progress=False,
    )
    table = result.results
    rows = table[table["protocol"] == "clustering_agreement"]
    assert len(rows) and rows["value"].isna().all()
    assert rows["reason"].str.contains(install_command("cluster"), regex=False).all()
    others = table[table["protocol"] != "clustering_agreement"]
    assert not others["reason"].str.contains("igraph").any()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("score='f1'", "score must be one of"),
        ("resolutions=()", "resolutions must be"),
        ("resolutions=(0.5, -1.0)", "resolutions must be"),
        ("real_resolution=0", "real_resolution must be"),
        ("n_neighbors=1", "n_neighbors must be"),
        ("seed=-1", "seed must be"),
    ],
)
def test_invalid_options_fail_when_the_protocol_is_built(options: str, message: str) -> None:
    from scperteval.engine.protocol import Protocol

    spec = {
        "name": "x",
        "metric": f"cell_eval_clustering_agreement({options})",
        "negative": "matched_perturbed_sample",
    }
    with pytest.raises(SpecError, match=message):
        Protocol.from_mapping(spec)


def test_registered_as_a_dataset_scope_centroid_metric() -> None:
    meta = METRICS.get("cell_eval_clustering_agreement").meta
    assert (meta["representation"], meta["scope"], meta["perfect"]) == ("centroid", "dataset", 1.0)


@needs_igraph
def test_leiden_runs_on_several_threads_draw_each_from_its_own_seed():
    import random
    import threading

    from scperteval.metrics.clustering import _CallingThreadsGenerator

    points = np.random.default_rng(0).normal(size=(300, 10))
    graph = fuzzy_neighbour_graph(points)
    alone = {seed: leiden_labels(graph, 1.0, seed=seed) for seed in range(4)}
    # The seeds matter (else the check below could not fail).
    assert len({labels.tobytes() for labels in alone.values()}) == 4
    found: dict[int, list[np.ndarray]] = {seed: [] for seed in alone}

    def run(seed: int) -> None:
        for _ in range(4):
            found[seed].append(leiden_labels(graph, 1.0, seed=seed))

    threads = [threading.Thread(target=run, args=(seed,)) for seed in alone]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(np.array_equal(labels, alone[s]) for s, runs in found.items() for labels in runs)
    # A thread without a seeded generator draws from Python's random, igraph's default.
    random.seed(5)
    first = _CallingThreadsGenerator().random()
    random.seed(5)
    assert first == random.random()
