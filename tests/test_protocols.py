"""Protocol descriptors, families and suites (TOML data, validated before any computation)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

import scperteval
from scperteval.engine.protocol import CENTERINGS, Protocol
from scperteval.engine.sources import SOURCES
from scperteval.engine.spaces import SPACES
from scperteval.engine.suites import available_suites, load_suite, resolve_protocols
from scperteval.errors import SpecError
from scperteval.metrics import METRICS
from scperteval.simulation import simulate
from scperteval.workflows.calibrate import calibrate

SUITES_DIR = Path(scperteval.__file__).parent / "suites"


def protocol(**fields):
    return Protocol.from_mapping({"name": "p", "metric": "mse", **fields})


@pytest.fixture(scope="module")
def small_adata():
    return simulate(n_perturbations=4, n_genes=30, cells_per_perturbation=16, seed=7)


# --------------------------------------------------------------------- suites


def test_shipped_suites_are_listed_and_load():
    suites = available_suites()
    files = sorted(p.stem for p in SUITES_DIR.glob("*.toml"))
    assert sorted(suites) == files
    assert {"default", "vcc2025", "ahlmann_eltze2025"} <= set(suites)
    for name, description in suites.items():
        assert description, f"suite {name} has no description"
        protocols = load_suite(name)
        assert protocols, name
        assert all(isinstance(p, Protocol) for p in protocols)
        names = [p.name for p in protocols]
        assert len(names) == len(set(names))


def test_all_is_the_default_suite():
    assert [p.name for p in load_suite("all")] == [p.name for p in load_suite("default")]


def test_suite_loads_from_its_file_path():
    by_name = load_suite("default")
    by_path = load_suite(str(SUITES_DIR / "default.toml"))
    assert [p.describe() for p in by_path] == [p.describe() for p in by_name]


def test_default_suite_uses_every_registered_metric():
    # cell-eval's definitions need a Wilcoxon test on the cells of every source, so
    # they live in their own suite rather than in every default run.
    used = {p.metric.name for p in load_suite("default")}
    used |= {p.metric.name for p in load_suite("cell_eval")}
    assert set(METRICS.names()) <= used
    assert not any(
        name.startswith("cell_eval_") for name in {p.metric.name for p in load_suite("default")}
    )


def test_default_suite_covers_every_representation_and_scope():
    protocols = load_suite("default")
    assert {p.representation for p in protocols} == {"centroid", "population", "de"}
    assert {p.scope for p in protocols} == {"perturbation", "dataset"}
    assert {p.centering for p in protocols} == set(CENTERINGS)


def test_metric_metadata_fills_direction_and_perfect_value():
    for p in load_suite("default"):
        meta = p.metric.entry.meta
        assert p.better == meta["better"]
        assert p.perfect == meta["perfect"]
        assert p.representation == meta["representation"]
        assert p.scope == meta["scope"]


def test_unknown_suite_lists_shipped_suites():
    with pytest.raises(SpecError, match="shipped suites: .*default"):
        load_suite("defualt")
    with pytest.raises(SpecError, match="not found"):
        load_suite("no/such/suite.toml")


# ------------------------------------------------------------------- families


def test_family_default_and_single_parameter_instances():
    (default,) = resolve_protocols("mse_top_k")
    assert default.space == "top_k(k=50)"
    (p,) = resolve_protocols("mse_top_k=30")
    assert p.name == "mse_top_k=30"
    assert p.space == "top_k(k=30)"
    assert p.metric.name == "mse"


def test_family_call_form():
    (p,) = resolve_protocols("energy_pca(k=10)")
    assert p.name == "energy_pca(k=10)"
    assert p.space == "pca(k=10)"
    assert p.representation == "population"
    (overlap,) = resolve_protocols("de_topk_overlap(k=7)")
    assert dict(overlap.metric.options) == {"k": 7}


def test_comma_separated_names_keep_their_order():
    protocols = resolve_protocols("pearson_delta_ctrl, energy_pca(k=10),mse_top_k=30")
    assert [p.name for p in protocols] == ["pearson_delta_ctrl", "energy_pca(k=10)", "mse_top_k=30"]
    assert protocols[0].centering == "control"


def test_family_with_unknown_parameter_lists_valid_ones():
    with pytest.raises(SpecError, match="no parameter j; valid: k"):
        resolve_protocols("energy_pca(j=10)")


def test_parameter_of_a_plain_protocol_is_rejected():
    with pytest.raises(SpecError, match="pearson_delta_ctrl"):
        resolve_protocols("pearson_delta_ctrl=3")
    with pytest.raises(SpecError, match="no parameter k"):
        resolve_protocols("pearson_delta_ctrl(k=3)")


def test_same_protocol_twice_is_rejected():
    with pytest.raises(SpecError, match="given twice"):
        resolve_protocols("mse,mse")


# ------------------------------------------------------ names and validation


def test_unknown_protocol_lists_every_valid_name():
    with pytest.raises(SpecError) as info:
        resolve_protocols("pearson_delta_ctr")
    message = str(info.value)
    assert "valid names" in message
    for p in load_suite("default"):
        assert p.name.split("=")[0] in message


@pytest.mark.parametrize(
    ("fields", "registry"),
    [
        ({"metric": "mse_"}, METRICS),
        ({"space": "topk(k=3)"}, SPACES),
        ({"negative": "dataset_meen"}, SOURCES),
        ({"positive": "technical_duplicat"}, SOURCES),
    ],
)
def test_unknown_registered_names_list_valid_names(fields, registry):
    with pytest.raises(SpecError, match="valid names") as info:
        protocol(**fields)
    for name in registry.names():
        assert name in str(info.value)


def test_unknown_space_option_lists_valid_options():
    with pytest.raises(SpecError, match="no option 'kk'; valid options: k"):
        protocol(space="top_k(kk=3)")
    with pytest.raises(SpecError, match="no option 'kk'"):
        protocol(space="hvg(k=3) | top_k(kk=3)")


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("centering", "ctrl", "none, control, perturbed"),
        ("representation", "cells", "centroid, population, de"),
        ("scope", "global", "perturbation, dataset"),
        ("better", "smaller", "higher, lower"),
    ],
)
def test_unknown_choices_list_valid_ones(field, value, valid):
    with pytest.raises(SpecError, match=f"unknown {field} '{value}'; valid: {valid}"):
        protocol(**{field: value})


def test_unknown_field_lists_valid_fields():
    with pytest.raises(SpecError) as info:
        protocol(spcae="full")
    message = str(info.value)
    assert "spcae" in message
    for field in ("metric", "space", "centering", "positive", "negative", "better", "perfect"):
        assert field in message


def test_protocol_needs_name_and_metric():
    with pytest.raises(SpecError, match="'name' and 'metric'"):
        Protocol.from_mapping({"name": "x"})


@pytest.mark.parametrize(
    "space", ["top_k(k=5)", "degs_padj", "perturbed_genes", "hvg(k=5) | top_k(k=5)"]
)
def test_dataset_scope_needs_a_shared_space(space):
    with pytest.raises(SpecError, match="shared space"):
        Protocol.from_mapping({"name": "r", "metric": "nir", "space": space})


@pytest.mark.parametrize(
    "space", ["full", "hvg(k=5)", "heg(k=5)", "pca(k=3)", "hvg(k=5) & heg(k=9)"]
)
def test_dataset_scope_accepts_shared_spaces(space):
    p = Protocol.from_mapping({"name": "r", "metric": "nir", "space": space})
    assert p.scope == "dataset"


@pytest.mark.parametrize("role", ["positive", "negative"])
@pytest.mark.parametrize("source", ["dataset_mean", "control_mean", "interpolated_duplicate"])
def test_population_protocol_needs_cells(role, source):
    with pytest.raises(SpecError, match="has no cells"):
        Protocol.from_mapping(
            {"name": "e", "metric": "energy_distance", "space": "pca(k=3)", role: source}
        )


def test_de_protocol_needs_a_gene_space():
    with pytest.raises(SpecError, match="gene space"):
        Protocol.from_mapping({"name": "d", "metric": "de_auroc", "space": "pca(k=5)"})


def test_user_callable_metric_needs_its_perfect_value():
    def spread(gt, pred, ctx=None):
        return float(np.abs(gt - pred).max())

    with pytest.raises(SpecError, match="perfect"):
        Protocol.from_mapping({"name": "spread", "metric": spread, "better": "lower"})
    p = Protocol.from_mapping({"name": "spread", "metric": spread, "better": "lower", "perfect": 0})
    assert p.perfect == 0.0
    assert p.representation == "centroid"


def test_describe():
    p = protocol(space="heg(k=9)", centering="control", negative="control_mean")
    assert p.describe() == {
        "protocol": "p",
        "metric": "mse",
        "representation": "centroid",
        "scope": "perturbation",
        "space": "heg(k=9)",
        "centering": "control",
        "positive": "technical_duplicate",
        "negative": "control_mean",
        "better": "lower",
        "perfect": 0.0,
        "description": METRICS.get("mse").description,
    }


# ------------------------------------------------------------ user TOML suites


USER_SUITE = """
    description = "a user suite"
    use = ["pearson_delta_ctrl", "mse_top_k=20"]

    [[protocol]]
    name = "my_l2_heg"
    metric = "l2"
    space = "heg(k={k})"
    params = { k = 12 }

    [[protocol]]
    name = "my_nir_hvg"
    metric = "nir"
    space = "hvg(k=10)"
    negative = "control_mean"

    [[protocol]]
    name = "my_overlap"
    metric = "de_topk_overlap(k=5)"
    negative = "all_perturbed_sample"
"""


def write(path, text):
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_user_suite_file_loads_and_runs(tmp_path, small_adata):
    path = write(tmp_path / "mine.toml", USER_SUITE)
    protocols = load_suite(str(path))
    assert [p.name for p in protocols] == [
        "pearson_delta_ctrl",
        "mse_top_k=20",
        "my_l2_heg",
        "my_nir_hvg",
        "my_overlap",
    ]
    assert protocols[2].space == "heg(k=12)"
    assert protocols[3].negative == "control_mean"
    assert [p.name for p in resolve_protocols(str(path))] == [p.name for p in protocols]
    result = calibrate(small_adata, protocols=str(path))
    table = result.results
    assert sorted(table["protocol"].unique()) == sorted(p.name for p in protocols)
    assert len(table) == len(protocols) * 4 * 2
    assert table["value"].notna().all()
    assert sorted(result.calibration["protocol"].unique()) == sorted(p.name for p in protocols)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('colour = "red"\n', "unknown key"),
        (
            '[[protocol]]\nname = "a"\nmetric = "mse"\n[[protocol]]\nname = "a"\nmetric = "l2"\n',
            "defined twice",
        ),
        ('[[protocol]]\nmetric = "mse"\n', "no name"),
        ('[[protocol]]\nname = "a"\nmetric = "mse"\nweight = 2\n', "unknown field"),
        ('[[protocol]\nname = "a"\n', "not valid TOML"),
        ('use = ["no_such_protocol"]\n', "valid names"),
    ],
)
def test_bad_user_suites_fail_with_a_message(tmp_path, text, message):
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(SpecError, match=message):
        load_suite(str(path))


def test_toml_values_are_data_never_code(tmp_path):
    sentinel = tmp_path / "executed"
    payload = f"__import__('pathlib').Path({str(sentinel)!r}).touch()"
    tables = [
        f'metric = "mse(x={payload})"',
        f'metric = "mse"\nspace = "top_k(k={payload})"',
        f'metric = "mse"\nspace = "hvg(k=3) | top_k(k={payload})"',
        f'metric = "mse"\nspace = "top_k(k={{k}})"\nparams = {{ k = "{payload}" }}',
    ]
    for i, table in enumerate(tables):
        path = write(tmp_path / f"evil{i}.toml", f'[[protocol]]\nname = "evil"\n{table}\n')
        with pytest.raises(SpecError, match="literal"):
            load_suite(str(path))
    # A family parameter given in a name is a value too.
    with pytest.raises(SpecError):
        resolve_protocols(f"mse_top_k={payload}")
    with pytest.raises(SpecError, match="literal"):
        resolve_protocols("mse_top_k=os")
    assert not sentinel.exists()
