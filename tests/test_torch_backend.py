"""Torch backend: population metrics equal the NumPy reference, losses equal the metrics."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import sparse

torch = pytest.importorskip("torch")

from scperteval.errors import install_command  # noqa: E402
from scperteval.metrics import PerturbationContext, weighted_mse, weighted_r2  # noqa: E402
from scperteval.metrics import population as reference  # noqa: E402
from scperteval.metrics.common import DegenerateInput  # noqa: E402
from scperteval.torch_backend import (  # noqa: E402
    DEGWeights,
    DeviceUnavailable,
    deg_weight_tensor,
    energy_distance,
    median_pairwise_distance,
    mmd,
    weighted_mse_loss,
    weighted_r2_loss,
)

F64 = torch.float64
F32 = torch.float32
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")

# The float32 tolerance documented in docs/torch.md: |f32 - f64| <= REL |f64| + ABS s,
# with s = E|X - Y| for the energy distance and s = 1 for MMD.
F32_REL = 1e-4
F32_ABS = 1e-6


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """One intra-op thread: the inputs are small, and threads only add overhead."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _clouds(seed: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(37, 6))
    y = rng.normal(size=(29, 6)) + 0.4
    if kind == "ties":
        # Integer coordinates: many equal distances and exact duplicates, within and
        # across the clouds.
        x, y = np.round(2 * x), np.round(2 * y)
        x[:8] = x[0]
        y[:4] = x[0]
        y[10:14] = y[20]
    elif kind == "sparse":
        x[rng.random(x.shape) < 0.7] = 0.0
        y[rng.random(y.shape) < 0.7] = 0.0
    elif kind == "offset":
        x, y = x + 50.0, y + 50.0
    return x, y


KINDS = ["gaussian", "ties", "sparse", "offset"]


def _close(value: float, expected: float, rel: float) -> bool:
    return abs(value - expected) <= rel * max(abs(expected), 1e-300)


# ------------------------------------------------------------------------ import rules


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_import_scperteval_does_not_import_torch_and_missing_torch_is_reported():
    lazy = _run_python("import sys, scperteval; print('torch' in sys.modules)")
    assert lazy.returncode == 0, lazy.stderr
    assert lazy.stdout.strip() == "False"
    missing = _run_python(
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "from scperteval.errors import MissingExtraError\n"
        "try:\n"
        "    import scperteval.torch_backend\n"
        "except MissingExtraError as error:\n"
        "    print('missing:', error)\n"
    )
    assert missing.returncode == 0, missing.stderr
    assert "missing:" in missing.stdout
    assert install_command("ot") in missing.stdout and "'torch'" in missing.stdout


# ----------------------------------------------------------- population: float64 = numpy


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("unbiased", [True, False])
def test_energy_distance_equals_reference(kind, unbiased):
    x, y = _clouds(1, kind)
    expected = reference.energy_distance(x, y, unbiased=unbiased)
    assert _close(energy_distance(x, y, unbiased=unbiased), expected, 1e-10)
    # Small blocks: many row blocks, same value.
    small = energy_distance(x, y, unbiased=unbiased, max_block_bytes=3000)
    assert _close(small, expected, 1e-10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bandwidth", [None, "truth", 0.8])
@pytest.mark.parametrize("unbiased", [True, False])
def test_mmd_equals_reference(kind, bandwidth, unbiased):
    x, y = _clouds(2, kind)
    expected = reference.mmd(x, y, bandwidth=bandwidth, unbiased=unbiased)
    value = mmd(x, y, bandwidth=bandwidth, unbiased=unbiased)
    assert _close(value, expected, 1e-10)
    small = mmd(x, y, bandwidth=bandwidth, unbiased=unbiased, max_block_bytes=3000)
    assert _close(small, expected, 1e-10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", [None, 16, 4096])
def test_median_pairwise_distance_equals_reference(kind, block):
    x, y = _clouds(3, kind)
    z = np.vstack([x, y])
    expected = reference.median_pairwise_distance(z)
    options = {} if block is None else {"max_block_bytes": block}
    assert _close(median_pairwise_distance(z, **options), expected, 1e-12)


def test_median_selection_paths_on_crafted_points():
    # Distances 1, 2, 3, 4, 6, 7: the two middle values (3, 4) lie in different
    # buckets, so the bounded-memory selection takes a maximum and a minimum.
    line = np.array([[0.0], [1.0], [3.0], [7.0]])
    assert median_pairwise_distance(line, max_block_bytes=16) == 3.5
    # An integer lattice: the median value is repeated more often than the memory
    # budget holds, so the selection narrows down to a single bit pattern.
    lattice = np.arange(40, dtype=float)[:, None]
    expected = reference.median_pairwise_distance(lattice)
    assert median_pairwise_distance(lattice, max_block_bytes=16) == expected
    assert median_pairwise_distance(lattice, max_block_bytes=16, dtype=F32) == expected
    # Coinciding points are left out; none differ: 0.
    dup = np.array([[1.0, 2.0]] * 5 + [[1.0, 3.0]] * 2)
    assert median_pairwise_distance(dup) == reference.median_pairwise_distance(dup) == 1.0
    assert median_pairwise_distance(np.ones((4, 3))) == 0.0


def test_inputs_may_be_sparse_or_tensors():
    x, y = _clouds(4, "sparse")
    expected = reference.energy_distance(x, y)
    assert _close(energy_distance(sparse.csr_matrix(x), sparse.csr_matrix(y)), expected, 1e-10)
    tx = torch.tensor(x, requires_grad=True)
    assert _close(energy_distance(tx, torch.tensor(y)), expected, 1e-10)
    expected_mmd = reference.mmd(x, y)
    value = mmd(torch.tensor(x, dtype=F32), torch.tensor(y, dtype=F32))
    assert _close(value, reference.mmd(x.astype(np.float32), y.astype(np.float32)), 1e-10)
    assert abs(value - expected_mmd) < 1e-6
    assert isinstance(value, float)


def test_coinciding_populations():
    same = np.tile([[1.0, -2.0, 0.5]], (6, 1))
    for unbiased in (True, False):
        assert energy_distance(same, same, unbiased=unbiased) == 0.0
        assert mmd(same, same, unbiased=unbiased) == pytest.approx(0.0, abs=1e-15)
        assert mmd(same, same, unbiased=unbiased) == reference.mmd(same, same, unbiased=unbiased)
    zeros = np.zeros((5, 4))
    assert energy_distance(zeros, zeros + 1.0) == pytest.approx(4.0, rel=1e-12)


# -------------------------------------------------------------------- degenerate inputs


def test_degenerate_and_invalid_inputs():
    x, y = _clouds(5, "gaussian")
    for function in (energy_distance, mmd):
        with pytest.raises(DegenerateInput, match="at least 2"):
            function(x[:1], y)
        with pytest.raises(DegenerateInput, match="at least 1"):
            function(x, y[:0], unbiased=False)
        assert math.isfinite(function(x[:1], y[:1], unbiased=False))
        bad = x.copy()
        bad[2, 3] = np.nan
        with pytest.raises(DegenerateInput, match="non-finite"):
            function(bad, y)
        inf = torch.tensor(y)
        inf[0, 0] = math.inf
        with pytest.raises(DegenerateInput, match="non-finite"):
            function(x, inf)
        with pytest.raises(ValueError, match="features"):
            function(x, y[:, :3])
        with pytest.raises(ValueError, match="two-dimensional"):
            function(x[0], y)
        with pytest.raises(ValueError, match="dtype"):
            function(x, y, dtype=torch.float16)
    for bandwidth in ("pooled", -1.0, 0.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="bandwidth"):
            mmd(x, y, bandwidth=bandwidth)
    assert mmd(x[:1], y[:1], unbiased=False, bandwidth=1.0) == pytest.approx(
        reference.mmd(x[:1], y[:1], unbiased=False, bandwidth=1.0), rel=1e-12
    )


# ------------------------------------------------------------------- float32 and devices


def _float32_error_ok(value32: float, value64: float, scale: float) -> bool:
    return abs(value32 - value64) <= F32_REL * abs(value64) + F32_ABS * scale


def test_float32_within_documented_tolerance():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(100, 50))
    y = rng.normal(size=(600, 50)) + 0.2
    cross = float(torch.cdist(torch.tensor(x), torch.tensor(y)).mean())
    for unbiased in (True, False):
        e64 = energy_distance(x, y, unbiased=unbiased)
        e32 = energy_distance(x, y, unbiased=unbiased, dtype=F32)
        assert _float32_error_ok(e32, e64, cross)
        assert _close(e32, e64, F32_REL)
        for bandwidth in (None, "truth"):
            m64 = mmd(x, y, bandwidth=bandwidth, unbiased=unbiased)
            m32 = mmd(x, y, bandwidth=bandwidth, unbiased=unbiased, dtype=F32)
            assert _float32_error_ok(m32, m64, 1.0)
            assert _close(m32, m64, F32_REL)
    # Exact duplicates stay at distance 0 in float32; the energy distance of a cloud
    # to itself is then within the documented bound of 0 (the sums over i < j and
    # over all ordered pairs may round differently).
    from scperteval.torch_backend.pairs import _Pairs, _prepared, _row_norms

    dup = np.vstack([x[:10]] * 3)
    (cloud,) = _prepared(F32, torch.tensor(dup))
    norms = _row_norms(cloud)
    squared = _Pairs(F32, 1 << 20).squared(cloud, norms, cloud, norms)
    same = np.equal.outer(np.arange(30) % 10, np.arange(30) % 10)
    assert (squared.numpy()[same] == 0.0).all() and (squared.numpy()[~same] > 0.0).all()
    scale = float(torch.cdist(torch.tensor(dup), torch.tensor(dup)).mean())
    assert _float32_error_ok(energy_distance(dup, dup, unbiased=False, dtype=F32), 0.0, scale)


def test_device_checks():
    x, y = _clouds(7, "gaussian")
    with pytest.raises(ValueError, match="device"):
        energy_distance(x, y, device="nonsense")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailable, match="CUDA is not available"):
            energy_distance(x, y, device="cuda")
        with pytest.raises(DeviceUnavailable):
            DEGWeights(torch.zeros(0, 0), (), ()).to("cuda")


@CUDA
@pytest.mark.parametrize("kind", ["gaussian", "ties"])
def test_cuda_matches_cpu(kind):
    x, y = _clouds(8, kind)
    expected_e = reference.energy_distance(x, y)
    expected_m = reference.mmd(x, y)
    assert _close(energy_distance(x, y, device="cuda"), expected_e, 1e-10)
    assert _close(mmd(x, y, device="cuda"), expected_m, 1e-10)
    cross = float(torch.cdist(torch.tensor(x), torch.tensor(y)).mean())
    assert _float32_error_ok(energy_distance(x, y, device="cuda", dtype=F32), expected_e, cross)
    assert _float32_error_ok(mmd(x, y, device="cuda", dtype=F32), expected_m, 1.0)
    z = np.vstack([x, y])
    expected = reference.median_pairwise_distance(z)
    assert _close(median_pairwise_distance(z, device="cuda", max_block_bytes=256), expected, 1e-12)


# ------------------------------------------------------------------------------ losses


def _loss_data(seed: int, batch: int = 4, genes: int = 12):
    rng = np.random.default_rng(seed)
    target = rng.normal(size=(batch, genes))
    pred = target + rng.normal(scale=0.7, size=(batch, genes))
    weights = rng.random((batch, genes)) ** 2
    weights[:, ::4] = 0.0  # genes without weight, as DEG weights have
    weights /= weights.sum(axis=1, keepdims=True)
    return pred, target, weights


def _reference_rows(metric, pred, target, weights):
    return np.array(
        [
            metric(t, p, PerturbationContext("p", weights=w))
            for p, t, w in zip(pred, target, weights, strict=True)
        ]
    )


@pytest.mark.parametrize("shared", [False, True])
def test_losses_equal_the_metrics(shared):
    pred, target, weights = _loss_data(9)
    if shared:
        weights = np.broadcast_to(weights[0], weights.shape).copy()
    w = torch.tensor(weights[0] if shared else weights)
    p, t = torch.tensor(pred), torch.tensor(target)
    mse_rows = weighted_mse_loss(p, t, w, reduction="none")
    r2_rows = weighted_r2_loss(p, t, w, reduction="none")
    expected_mse = _reference_rows(weighted_mse, pred, target, weights)
    expected_r2 = 1.0 - _reference_rows(weighted_r2, pred, target, weights)
    np.testing.assert_allclose(mse_rows.numpy(), expected_mse, rtol=1e-12, atol=0)
    np.testing.assert_allclose(r2_rows.numpy(), expected_r2, rtol=1e-12, atol=0)
    assert float(weighted_mse_loss(p, t, w)) == pytest.approx(expected_mse.mean(), rel=1e-12)
    assert float(weighted_r2_loss(p, t, w, reduction="sum")) == pytest.approx(
        expected_r2.sum(), rel=1e-12
    )
    one = weighted_r2_loss(p[1], t[1], torch.tensor(weights[1]))
    assert one.shape == () and float(one) == pytest.approx(expected_r2[1], rel=1e-12)
    # Scale of the weights does not matter, as in the metrics.
    assert torch.allclose(weighted_mse_loss(p, t, 7.0 * w, reduction="none"), mse_rows)


def test_losses_gradcheck():
    pred, target, weights = _loss_data(10, batch=3, genes=7)
    p = torch.tensor(pred, requires_grad=True)
    t, w = torch.tensor(target), torch.tensor(weights)
    for loss in (weighted_mse_loss, weighted_r2_loss):
        assert torch.autograd.gradcheck(lambda q, loss=loss: loss(q, t, w), (p,))
        assert torch.autograd.gradcheck(
            lambda q, loss=loss: loss(q, t[0], w[0]), (p[0].detach().requires_grad_(),)
        )
        # Gradients with respect to the target and the weights are defined too.
        tt = t.clone().requires_grad_()
        ww = (w + 0.05).requires_grad_()  # positive, so that finite steps stay valid
        assert torch.autograd.gradcheck(lambda a, b, loss=loss: loss(p.detach(), a, b), (tt, ww))


def test_losses_on_degenerate_rows():
    pred, target, weights = _loss_data(11, batch=3, genes=6)
    p = torch.tensor(pred, requires_grad=True)
    t, w = torch.tensor(target), torch.tensor(weights)
    w[1] = 0.0
    for loss in (weighted_mse_loss, weighted_r2_loss):
        with pytest.raises(ValueError, match=r"row\(s\) 1: all weights are zero"):
            loss(p, t, w)
        rows = loss(p, t, w, reduction="none", degenerate="nan")
        assert torch.isnan(rows[1]) and torch.isfinite(rows[[0, 2]]).all()
        assert torch.isnan(loss(p, t, w, degenerate="nan"))
        rows[[0, 2]].sum().backward()
        assert p.grad is not None and torch.isfinite(p.grad).all()
        assert (p.grad[1] == 0).all()
        p.grad = None
    # The metrics agree: NaN on all-zero weights.
    assert math.isnan(weighted_mse(target[1], pred[1], PerturbationContext("p", weights=w[1])))

    # Weighted R^2: a target constant over the weighted genes, or a single gene.
    constant = t.clone()
    constant[2] = 3.0
    with pytest.raises(ValueError, match="constant"):
        weighted_r2_loss(p, constant, torch.tensor(weights))
    assert math.isnan(
        weighted_r2(constant[2].numpy(), pred[2], PerturbationContext("p", weights=weights[2]))
    )
    single = torch.tensor([[1.5]], dtype=F64)
    with pytest.raises(ValueError, match="constant"):
        weighted_r2_loss(single, single + 1.0, torch.ones(1, dtype=F64))
    # A single weighted gene is a well-defined weighted MSE, as in the metric.
    value = weighted_mse_loss(single, single + 1.0, torch.ones(1, dtype=F64))
    assert float(value) == weighted_mse([2.5], [1.5], PerturbationContext("p", weights=np.ones(1)))

    # Invalid weights or targets: ValueError, or NaN with degenerate="nan".
    negative = torch.tensor(weights)
    negative[0, 1] = -0.1
    with pytest.raises(ValueError, match="non-negative"):
        weighted_mse_loss(p, t, negative)
    assert torch.isnan(weighted_mse_loss(p, t, negative, reduction="none", degenerate="nan")[0])
    broken = t.clone()
    broken[2, 0] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        weighted_r2_loss(p, broken, torch.tensor(weights))
    with pytest.raises(ValueError, match="the input: all weights are zero"):
        weighted_mse_loss(p[0], t[0], torch.zeros(6, dtype=F64))


def test_loss_argument_checks():
    p = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError, match="shape"):
        weighted_mse_loss(p, torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match="weights must have shape"):
        weighted_mse_loss(p, p, torch.ones(2, dtype=F64))
    with pytest.raises(ValueError, match="reduction"):
        weighted_mse_loss(p, p, torch.ones(3, dtype=F64), reduction="avg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="degenerate"):
        weighted_r2_loss(p, p, torch.ones(3, dtype=F64), degenerate="zero")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="real tensor"):
        weighted_mse_loss(p, p, torch.ones(3, dtype=torch.complex128))
    with pytest.raises(TypeError, match="floating-point"):
        weighted_mse_loss(torch.ones(3, dtype=torch.long), p, torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match="shape"):
        weighted_mse_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.ones(3))
    # Target and weights take pred's dtype (float64 DEG weights with a float32 model).
    value = weighted_r2_loss(
        torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 3.0, 4.0], dtype=F64), torch.ones(3)
    )
    assert value.dtype == F32 and float(value) == pytest.approx(1.0 / (14.0 / 3.0))


# ---------------------------------------------------------------------------- weights


@pytest.fixture(scope="module")
def context():
    from scperteval.context import Context
    from scperteval.data.dataset import Dataset
    from scperteval.simulation import simulate

    adata = simulate(
        n_perturbations=5, n_genes=30, cells_per_perturbation=20, n_covariates=2, seed=3
    )
    return Context(Dataset(adata, covariate_key="cell_line"))


def test_deg_weights_follow_the_context(context):
    expected = context.deg_weights()
    weights = DEGWeights.from_context(context)
    np.testing.assert_array_equal(weights.weights.numpy(), expected)
    assert weights.weights.dtype == F64
    assert weights.genes == tuple(context.genes)
    assert weights.conditions == tuple(
        (c.covariate, c.perturbation) for c in context.layout.conditions
    )
    cubed = deg_weight_tensor(context, exponent=3.0, half="all")
    np.testing.assert_array_equal(cubed.numpy(), context.deg_weights(3.0, half="all"))
    assert not weights.degenerate.any()


def test_deg_weights_are_aligned_by_name(context):
    rng = np.random.default_rng(12)
    genes = list(context.genes)
    full = context.deg_weights()
    conditions = list(context.layout.conditions)
    order = rng.permutation(len(genes))  # the model's gene order
    model_genes = [genes[i] for i in order]

    # Rows by (covariate, name), Condition or bare name within a covariate group;
    # columns by gene name.
    picked = [3, 7, 0]
    keys = [
        (conditions[3].covariate, conditions[3].perturbation),
        conditions[7],
        conditions[0],
    ]
    tensor = deg_weight_tensor(context, keys, model_genes)
    np.testing.assert_array_equal(tensor.numpy(), full[np.ix_(np.array(picked), order)])
    covariate = conditions[0].covariate
    in_group = [k for k, c in enumerate(conditions) if c.covariate == covariate][::-1]
    names = [conditions[k].perturbation for k in in_group]
    table = DEGWeights.from_context(
        context, perturbations=names, genes=model_genes[:12], covariate=covariate
    )
    np.testing.assert_array_equal(
        table.weights.numpy(), full[np.ix_(np.array(in_group), order[:12])]
    )
    assert table.genes == tuple(model_genes[:12]) and table.perturbations == tuple(names)

    # Per-batch lookup by name or by index; the loss on the model's gene order equals
    # the metric on the context's gene order.
    table = DEGWeights.from_context(context, genes=model_genes)
    batch = [conditions[5], (conditions[2].covariate, conditions[2].perturbation)]
    rows = [5, 2]
    looked = table.lookup(batch)
    assert torch.equal(looked, table.lookup(table.index(batch)))
    truth = rng.normal(size=(2, len(genes)))
    guess = truth + rng.normal(size=(2, len(genes)))
    target, pred = torch.tensor(truth[:, order]), torch.tensor(guess[:, order])
    mse = weighted_mse_loss(pred, target, looked, reduction="none")
    r2 = weighted_r2_loss(pred, target, looked, reduction="none")
    for i, row in enumerate(rows):
        ctx = PerturbationContext("p", weights=full[row])
        assert float(mse[i]) == pytest.approx(weighted_mse(truth[i], guess[i], ctx), rel=1e-12)
        assert float(r2[i]) == pytest.approx(1 - weighted_r2(truth[i], guess[i], ctx), rel=1e-12)


def test_deg_weights_errors(context):
    genes = list(context.genes)
    name = context.layout.conditions[0].perturbation
    with pytest.raises(ValueError, match="several covariate groups"):
        DEGWeights.from_context(context, perturbations=[name])
    with pytest.raises(KeyError, match="no perturbation"):
        DEGWeights.from_context(context, perturbations=["not-a-perturbation"])
    with pytest.raises(KeyError, match="not genes of the context"):
        DEGWeights.from_context(context, genes=[genes[0], "not-a-gene"])
    with pytest.raises(ValueError, match="repeated"):
        DEGWeights.from_context(context, genes=[genes[0], genes[1], genes[0]])
    table = DEGWeights.from_context(context)
    with pytest.raises(ValueError, match="several covariate groups"):
        table.lookup([name])
    with pytest.raises(TypeError, match="perturbation must be"):
        table.index([3])
    with pytest.raises(ValueError, match="shape"):
        DEGWeights(torch.zeros(2, 3), (("a", "b"),), ("g",))
    half = table.to(dtype=F32)
    assert half.weights.dtype == F32 and half.conditions == table.conditions
