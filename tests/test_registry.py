"""The registry: spec forms, option checks and literal-only option values."""

from __future__ import annotations

import numpy as np
import pytest

from scperteval.engine.sources import SOURCES
from scperteval.engine.spaces import SPACES
from scperteval.errors import SpecError
from scperteval.metrics import METRICS, DEView
from scperteval.registry import BoundSpec, Registry, parse_spec


def scale(x, ctx=None, *, factor=1.0, offset=0.0):
    """Multiply by a factor and add an offset."""
    return x * factor + offset


@pytest.fixture
def registry():
    reg = Registry("widget")
    reg.add("scale", scale, description="scale a number", better="higher")
    return reg


# ---------------------------------------------------------------- spec forms


@pytest.mark.parametrize(
    "spec",
    [
        "scale(factor=3, offset=1)",
        " scale( factor = 3 , offset = 1 ) ",
        ("scale", {"factor": 3, "offset": 1}),
        {"name": "scale", "factor": 3, "offset": 1},
    ],
)
def test_every_option_form_binds_the_same_options(registry, spec):
    bound = registry.resolve(spec)
    assert isinstance(bound, BoundSpec)
    assert bound.name == "scale"
    assert dict(bound.options) == {"factor": 3, "offset": 1}
    assert bound(2.0) == 7.0
    assert bound.entry.meta["better"] == "higher"


def test_plain_name_has_no_options(registry):
    bound = registry.resolve("scale")
    assert dict(bound.options) == {}
    assert bound(2.0) == 2.0
    assert bound.label() == "scale"


def test_explicit_keyword_wins_over_bound_option(registry):
    bound = registry.resolve("scale(factor=3)")
    assert bound(2.0, factor=10) == 20.0


def test_label_reads_back_to_the_same_options(registry):
    bound = registry.resolve({"name": "scale", "factor": 0.5, "offset": -2})
    name, options = parse_spec(bound.label())
    assert name == "scale"
    assert options == {"factor": 0.5, "offset": -2}


def test_callable_spec_is_used_as_given():
    def halve(gt, pred, ctx=None):
        """Half the difference."""
        return (gt - pred) / 2

    bound = METRICS.resolve(halve, better="lower", perfect=0.0)
    assert bound.entry.func is halve
    assert bound.name == "halve"
    assert bound.entry.description == "Half the difference."
    assert bound.entry.meta == {"better": "lower", "perfect": 0.0}
    assert bound(5.0, 1.0) == 2.0
    assert "halve" not in METRICS


def test_callable_with_options_is_checked(registry):
    bound = registry.resolve((scale, {"factor": 4}))
    assert bound(1.5) == 6.0
    with pytest.raises(SpecError, match="valid options: factor, offset$"):
        registry.resolve((scale, {"factr": 4}))


def test_literal_values_of_every_kind():
    name, options = parse_spec("f(a=1, b='x', c=[1, 2], d=None, e=True, g=-2.5, h={'k': (1,)})")
    assert name == "f"
    assert options == {
        "a": 1,
        "b": "x",
        "c": [1, 2],
        "d": None,
        "e": True,
        "g": -2.5,
        "h": {"k": (1,)},
    }


def test_registered_metric_with_options_in_every_form_computes_the_same():
    rng = np.random.default_rng(0)
    n = 80
    truth = DEView(statistic=rng.normal(size=n), pvalue_adj=rng.uniform(size=n))
    pred = DEView(statistic=rng.normal(size=n), pvalue_adj=rng.uniform(size=n))

    def overlap(k):
        top_truth = set(np.argsort(-np.abs(truth.statistic))[:k].tolist())
        top_pred = set(np.argsort(-np.abs(pred.statistic))[:k].tolist())
        return len(top_truth & top_pred) / k

    forms = [
        "de_topk_overlap(k=7)",
        ("de_topk_overlap", {"k": 7}),
        {"name": "de_topk_overlap", "k": 7},
    ]
    assert [METRICS.resolve(form)(truth, pred) for form in forms] == [overlap(7)] * 3
    # Without the option, the default k = 50 applies.
    assert METRICS.resolve("de_topk_overlap")(truth, pred) == overlap(50)
    assert overlap(50) != overlap(7)


# ------------------------------------------------------------------ failures


@pytest.mark.parametrize(
    ("registry_", "name"),
    [(METRICS, "pearsn"), (SPACES, "topk"), (SOURCES, "dataset_meen")],
)
def test_misspelt_name_lists_every_valid_name(registry_, name):
    with pytest.raises(SpecError) as info:
        registry_.resolve(name)
    message = str(info.value)
    assert repr(name) in message
    assert "valid names" in message
    for valid in registry_.names():
        assert valid in message


def test_unknown_option_lists_valid_options():
    with pytest.raises(SpecError, match=r"no option 'kk'.*valid options: k"):
        METRICS.resolve("de_topk_overlap(kk=3)")
    with pytest.raises(SpecError, match=r"valid options: distance"):
        METRICS.resolve(("rank", {"metric": "l1"}))
    with pytest.raises(SpecError, match=r"valid options: \(none\)"):
        METRICS.resolve({"name": "mse", "k": 3})


@pytest.mark.parametrize("name", ["gt", "pred", "ctx"])
def test_inputs_are_not_options(name):
    # gt, pred and the context are passed by the engine; binding one would clash.
    with pytest.raises(SpecError, match=f"no option '{name}'"):
        METRICS.resolve(f"pearson({name}=1)")


def test_var_keyword_function_accepts_any_option():
    reg = Registry("thing")

    def loose(x, **kwargs):
        return kwargs

    reg.add("loose", loose, description="anything goes")
    assert reg.resolve("loose(a=1, b='z')")(0) == {"a": 1, "b": "z"}


@pytest.mark.parametrize(
    "spec",
    [
        "mse(3)",
        "mse(**{'k': 1})",
        "mse(k=1",
        "mse(k=)",
        "mse(x=1).foo()",
        "top_k(k=3)(k=4)",
        "mse(x=1) + g()",
        42,
        ("mse",),
        ("mse", "k=1"),
        {"k": 1},
    ],
)
def test_malformed_specs_fail(spec):
    with pytest.raises(SpecError):
        METRICS.resolve(spec)


@pytest.mark.parametrize(
    "spec",
    [
        "mse(x=__import__('os'))",
        "mse(x=open('/dev/null'))",
        "mse(x=1 + 1)",
        "mse(x=[i for i in range(3)])",
        "mse(x=lambda: 0)",
        "mse(x=os.getcwd())",
    ],
)
def test_option_values_must_be_literals(spec):
    with pytest.raises(SpecError, match="must be a literal"):
        parse_spec(spec)
    with pytest.raises(SpecError):
        METRICS.resolve(spec)


def test_nothing_in_a_spec_is_executed(tmp_path):
    sentinel = tmp_path / "executed"
    spec = f"top_k(k=__import__('pathlib').Path({str(sentinel)!r}).touch())"
    with pytest.raises(SpecError, match="must be a literal"):
        SPACES.resolve(spec)
    assert not sentinel.exists()


def test_duplicate_registration_is_an_error(registry):
    # The same function again is harmless; another function under the name is not.
    registry.add("scale", scale, description="again")
    with pytest.raises(SpecError, match="already registered"):
        registry.add("scale", lambda x: x, description="impostor")


def test_registry_lists_names_sorted():
    reg = Registry("thing")
    for name in ("b", "c", "a"):
        reg.add(name, scale, description=name)
    assert reg.names() == ["a", "b", "c"]
    assert [entry.name for entry in reg] == ["a", "b", "c"]
    assert len(reg) == 3
    assert "a" in reg
    assert "z" not in reg


def test_a_bad_spec_fails_before_anything_is_computed():
    from scperteval.workflows.calibrate import calibrate

    calls = []

    def counted(gt, pred, ctx=None):
        calls.append(1)
        return 0.0

    good = {"name": "counted", "metric": counted, "better": "lower", "perfect": 0.0}
    # The data argument is a file that does not exist: had the run started, it
    # would fail on reading it; the spec error must come first.
    for bad in (
        {"name": "bad", "metric": "msee"},
        {"name": "bad", "metric": "mse(bogus=1)"},
        {"name": "bad", "metric": "mse", "space": "top_k(kk=3)"},
    ):
        with pytest.raises(SpecError):
            calibrate("no/such/file.h5ad", protocols=[good, bad])
    with pytest.raises(SpecError, match="valid names"):
        calibrate("no/such/file.h5ad", protocols="pearson_delta_ctrl,msee")
    assert calls == []


def test_a_parsed_spec_is_the_callers_own_even_when_parsed_before():
    from scperteval.registry import parse_spec

    first_name, first = parse_spec("top_k(k=5, genes=['A', 'B'], label='x')")
    first["k"] = 6
    first["genes"].append("C")
    second_name, second = parse_spec("top_k(k=5, genes=['A', 'B'], label='x')")
    assert first_name == second_name == "top_k"
    assert second == {"k": 5, "genes": ["A", "B"], "label": "x"}
    _, plain = parse_spec("pca(k=50)")
    plain["k"] = 1
    assert parse_spec("pca(k=50)") == ("pca", {"k": 50})
