"""The per-population cell cap of population protocols (``max_population_cells``).

Checked against: the documented draw reimplemented here from its definition (BLAKE2b
of the names, NumPy's Generator), the textbook energy distance (scipy ``cdist``) on
the cells that rule picks, and the uncapped run, bit for bit, for every population
at or under the cap.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import cdist

import scperteval
from scperteval.engine.dispatch import run_protocols
from scperteval.engine.population_cap import check_max_population_cells, population_subset
from scperteval.engine.suites import resolve_protocols
from scperteval.errors import SpecError
from scperteval.simulation import simulate
from scperteval.workflows.steps import build_engine

ENERGY_FULL = {
    "name": "energy_full",
    "metric": "energy_distance",
    "space": "full",
    "positive": "technical_duplicate",
    "negative": "control_cells",
}
ENERGY_CONTROL = {
    "name": "energy_top_k_control",
    "metric": "energy_distance",
    "space": "top_k(k=10)",
    "positive": "technical_duplicate",
    "negative": "control_cells",
}
POPULATION = ["energy_top_k=10", "energy_pca=5", "mmd_pca=5", "mmd_top_k=10"]


@pytest.fixture(scope="module")
def screen():
    """8 perturbations of 20 cells (halves of 10) and 400 control cells, 40 genes."""
    return simulate(
        n_perturbations=8, n_genes=40, cells_per_perturbation=20, n_control_cells=400, seed=5
    )


def _independent_subset(seed, covariate, perturbation, source, n, cap):
    text = "\x1f".join([str(seed), "population", covariate, perturbation, source])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    return np.sort(rng.choice(n, cap, replace=False))


@pytest.mark.parametrize(
    ("value", "expected"), [("all", None), ("ALL", None), (None, None), ("500", 500), (2, 2)]
)
def test_cap_values_are_read(value, expected):
    assert check_max_population_cells(value) == expected


@pytest.mark.parametrize("value", [0, 1, -5, 1.5, True, "none", "2.5", ""])
def test_bad_caps_are_refused(value):
    with pytest.raises(SpecError, match="max_population_cells"):
        check_max_population_cells(value)


def test_the_draw_follows_the_documented_rule():
    chosen = population_subset(3, "all", "G7", "truth", 1000, 64)
    assert chosen is not None and chosen.size == 64 and np.unique(chosen).size == 64
    np.testing.assert_array_equal(chosen, _independent_subset(3, "all", "G7", "truth", 1000, 64))
    # Another seed or another population draws other cells; a small one is kept whole.
    assert not np.array_equal(chosen, population_subset(4, "all", "G7", "truth", 1000, 64))
    assert not np.array_equal(chosen, population_subset(3, "all", "G7", "m", 1000, 64))
    assert population_subset(3, "all", "G7", "truth", 64, 64) is None
    assert population_subset(3, "all", "G7", "truth", 10**6, None) is None


def _energy(x, y):
    """Unbiased energy distance, the textbook way (every pair, scipy distances)."""
    n, m = len(x), len(y)
    within_x = cdist(x, x).sum() / (n * (n - 1))
    within_y = cdist(y, y).sum() / (m * (m - 1))
    return 2.0 * cdist(x, y).mean() - within_x - within_y


def test_a_capped_population_is_the_documented_sample(screen):
    cap = 7
    engine = build_engine(
        scperteval.load_dataset(screen),
        seed=11,
        de_method="t-test",
        truth="half",
        sample_cells=8192,
        device=None,
        precision="float64",
        max_population_cells=cap,
    )
    table = run_protocols(engine, resolve_protocols([ENERGY_FULL]))
    dense = np.asarray(screen.X.toarray(), dtype=np.float64)
    layout = engine.context.layout
    for condition, target in enumerate(layout.conditions[:3]):
        truth = engine.positions(condition, "truth")
        duplicate = engine.positions(condition, "duplicate")
        controls = engine.control_sample(engine.covariate_index(condition))[0]
        picked = {}
        for name, cells in (
            ("truth", truth),
            ("technical_duplicate", duplicate),
            ("control_cells", controls),
        ):
            rule = _independent_subset(
                11, target.covariate, target.perturbation, name, cells.size, cap
            )
            picked[name] = dense[cells[rule]]
            assert picked[name].shape[0] == cap
        rows = table[table["perturbation"] == target.perturbation].set_index("source_name")
        for name in ("technical_duplicate", "control_cells"):
            expected = _energy(picked["truth"], picked[name])
            assert rows.loc[name, "value"] == pytest.approx(expected, rel=1e-10, abs=1e-12)
    assert len(engine.subsampled_populations) == 3 * len(layout.conditions)


def _values(results):
    return results.set_index(["protocol", "perturbation", "source_name"])["value"]


def test_populations_under_the_cap_are_unchanged_bit_for_bit(screen):
    # Cap 150: the 400 control cells are cut; the halves (10) and the other perturbed
    # cells (140 of a 160-cell sample) are not, though the sample itself is larger than
    # the cap, so its stored distances must give way to the tiles with the same sums.
    protocols = [*POPULATION, ENERGY_CONTROL]
    free = scperteval.calibrate(screen, protocols=protocols, max_population_cells=None, workers=1)
    capped = scperteval.calibrate(screen, protocols=protocols, max_population_cells=150, workers=1)
    before, after = _values(free.results), _values(capped.results)
    is_control = before.index.get_level_values("source_name") == "control_cells"
    assert np.isfinite(before.to_numpy()).all()
    np.testing.assert_array_equal(after[~is_control].to_numpy(), before[~is_control].to_numpy())
    assert (after[is_control].to_numpy() != before[is_control].to_numpy()).any()
    record = capped.info["population_cap"]
    assert record["by_source"] == {"control_cells": 8}
    assert {p["cells"] for p in record["populations"]} == {400}
    assert free.info["population_cap"]["n_subsampled"] == 0


def test_stored_distances_stay_under_the_cap(screen):
    def stores(cap):
        engine = build_engine(
            scperteval.load_dataset(screen),
            seed=0,
            de_method="t-test",
            truth="half",
            sample_cells=8192,
            device=None,
            precision="float64",
            max_population_cells=cap,
        )
        run_protocols(engine, resolve_protocols(["mmd_pca=5"]))
        return len(engine._pair_store)

    assert stores(None)  # the fast path keeps the 160-cell sample's distances
    assert not stores(150)


def test_capped_values_do_not_depend_on_workers_or_suite(screen):
    protocols = [*POPULATION, "sinkhorn_top_k=10", ENERGY_CONTROL]
    one = scperteval.calibrate(screen, protocols=protocols, max_population_cells=6, workers=1)
    two = scperteval.calibrate(screen, protocols=protocols, max_population_cells=6, workers=2)
    pd.testing.assert_frame_equal(one.results, two.results)
    alone = scperteval.calibrate(screen, protocols="mmd_pca=5", max_population_cells=6)
    in_suite = _values(one.results).loc["mmd_pca=5"]
    np.testing.assert_array_equal(
        _values(alone.results).loc["mmd_pca=5"].to_numpy(), in_suite.to_numpy()
    )
    other_seed = scperteval.calibrate(screen, protocols="mmd_pca=5", max_population_cells=6, seed=1)
    assert not np.array_equal(
        _values(other_seed.results).to_numpy(), _values(alone.results).to_numpy()
    )


def test_predicted_cells_are_capped_too(screen):
    prediction = screen[screen.obs["perturbation"] != "control"].copy()
    result = scperteval.score(
        screen,
        {"model": prediction},
        protocols="energy_pca=5",
        max_population_cells=15,
        baselines=False,
        figures=False,
    )
    # 20 predicted cells per perturbation (over 15); the truth halves (10) are not cut.
    by_source = result.info["population_cap"]["by_source"]
    assert by_source["model"] == 8 and "truth" not in by_source


def test_run_json_and_terminal_record_the_cap(screen, tmp_path, capsys):
    from scperteval.cli import main

    data = tmp_path / "screen.h5ad"
    screen.write_h5ad(data)
    out = tmp_path / "capped"
    arguments = ["calibrate", str(data), "-p", "energy_pca=5", "--workers", "1"]
    assert main([*arguments, "--max-population-cells", "9", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "run.json").read_text())
    assert record["options"]["max_population_cells"] == 9
    # Truth half, duplicate (10 cells each) and the other perturbed cells (140), per
    # perturbation; the 400 control cells are not a candidate of this protocol.
    cap = record["population_cap"]
    assert cap["n_subsampled"] == 3 * 8
    assert cap["by_source"] == {"all_perturbed_sample": 8, "technical_duplicate": 8, "truth": 8}
    assert printed.count("seeded sample of 9 cells") == 1
    assert main([*arguments, "--max-population-cells", "all", "--out", str(out)]) == 0
    record = json.loads((out / "run.json").read_text())
    assert record["options"]["max_population_cells"] == "all"
    assert record["population_cap"]["n_subsampled"] == 0
    assert "seeded sample" not in capsys.readouterr().out
