"""Cells mapped to a space are shared by the population protocols on that space."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import scperteval
from scperteval.engine import engine as engine_module
from scperteval.engine import views

PROTOCOLS = "energy_pca=5,mmd_pca=5,sinkhorn_pca=5,energy_top_k=20,mmd_top_k=20"
MAPPED = views._population_cells
KEPT = engine_module.Engine.population_points


@pytest.fixture(scope="module")
def screen():
    return scperteval.simulate(n_perturbations=6, n_genes=60, cells_per_perturbation=30, seed=5)


@pytest.fixture(scope="module", params=["in_memory", "backed"])
def stored_screen(request, screen, tmp_path_factory):
    """The screen in memory, or as a file opened backed (its sample rows then kept)."""
    if request.param == "in_memory":
        return screen
    path = tmp_path_factory.mktemp("backed") / "screen.h5ad"
    screen.write_h5ad(path)
    return scperteval.load_dataset(str(path), backed=True)


def _run(screen, monkeypatch, points_bytes, workers=1):
    """Results, the spaces of every mapping made, and the keys asked of the store."""
    mapped, asked = [], []

    def counted(engine, protocol, source, space):
        mapped.append(protocol.space)
        return MAPPED(engine, protocol, source, space)

    def recorded(engine, key, build):
        asked.append(key)
        return KEPT(engine, key, build)

    monkeypatch.setattr(views, "_population_cells", counted)
    monkeypatch.setattr(engine_module.Engine, "population_points", recorded)
    monkeypatch.setattr(engine_module, "POPULATION_POINTS_BYTES", points_bytes)
    result = scperteval.calibrate(screen, PROTOCOLS, workers=workers)
    return result.results, mapped, asked


def test_each_source_is_mapped_once_per_space_with_the_same_values(screen, monkeypatch):
    shared, mapped, asked = _run(screen, monkeypatch, 64 * 2**20)
    alone, mapped_alone, _ = _run(screen, monkeypatch, 0)
    # Kept: one mapping per source, perturbation and space, however many protocols ask.
    assert len(mapped) == len(set(asked))
    assert max(Counter(asked).values()) == 3  # the three protocols on pca(k=5)
    assert len(mapped_alone) == len(asked) > 2 * len(mapped)
    np.testing.assert_array_equal(shared["value"].to_numpy(), alone["value"].to_numpy())
    # Two workers may map a source twice at once; the values are the same.
    parallel, _, _ = _run(screen, monkeypatch, 64 * 2**20, workers=2)
    np.testing.assert_array_equal(parallel["value"].to_numpy(), alone["value"].to_numpy())
    assert np.isfinite(shared["value"].to_numpy()).mean() > 0.9


def test_kept_cells_are_read_only_and_shared():
    store = engine_module.Engine.__new__(engine_module.Engine)
    store._points_store = engine_module.BoundedStore(1024)
    kept = store.population_points("key", lambda: np.arange(4.0))
    with pytest.raises(ValueError):
        kept[0] = 1.0
    assert store.population_points("key", lambda: np.zeros(4)) is kept
    # Larger than the bound: built, returned, not kept.
    large = store.population_points("large", lambda: np.zeros(1000))
    assert store.population_points("large", lambda: np.ones(1000)) is not large


@pytest.mark.parametrize("space_spec", ["top_k(k=20)", "pca(k=5)"])
def test_few_sample_cells_are_those_of_the_dataset(stored_screen, space_spec, engine_of):
    from scperteval.engine.population_cap import cap_source
    from scperteval.engine.spaces import resolve_space
    from scperteval.engine.suites import resolve_protocols

    engine = engine_of(stored_screen, max_population_cells=10)
    name = "energy_top_k=20" if space_spec.startswith("top_k") else "energy_pca=5"
    (protocol,) = resolve_protocols(name)
    for condition in range(engine.context.layout.n_conditions):
        source = engine.source("all_perturbed_sample", condition)
        capped, record = cap_source(engine, condition, "all_perturbed_sample", source)
        assert record is not None  # fewer cells than half the sample: the cut path
        space = resolve_space(engine, protocol.space, condition)
        cells = views._population_cells(engine, protocol, capped, space)
        expected = space.matrix(engine.context.dataset.rows(capped.positions))
        np.testing.assert_array_equal(cells, expected)


def test_matched_sample_statistics_are_those_of_the_dataset(stored_screen, engine_of):
    engine = engine_of(stored_screen)
    for condition in range(engine.context.layout.n_conditions):
        source = engine.source("matched_perturbed_sample", condition)
        read = engine.moments_of(source.positions)
        for field in ("n", "mean", "m2"):
            np.testing.assert_array_equal(
                getattr(source.moments, field), getattr(read, field), err_msg=field
            )


def test_sample_rows_are_kept_only_for_a_backed_matrix(stored_screen, engine_of):
    engine = engine_of(stored_screen)
    backed = engine.context.dataset.is_backed
    for covariate in range(len(engine.covariates)):
        positions, _ = engine.perturbed_sample(covariate)
        rows = engine.sample_rows(covariate)
        np.testing.assert_array_equal(
            rows.toarray(), engine.context.dataset.rows(positions).toarray()
        )
        # Kept (the same object again) for a file; a matrix in memory is not copied.
        assert (engine.sample_rows(covariate) is rows) == backed
        index = np.arange(0, positions.size, 3)
        subset = engine.sample_subset_rows(covariate, index)
        np.testing.assert_array_equal(subset.toarray(), rows[index].toarray())
        assert engine.sample_is_sparse(covariate)
