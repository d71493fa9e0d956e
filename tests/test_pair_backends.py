"""Pair backends of the population fast path: torch agrees with the NumPy reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from scperteval.engine.pairs import NumpyPairs, pair_backend
from scperteval.errors import SpecError
from scperteval.kernels.pairs import SQRT, rbf_transform
from scperteval.metrics.population import median_pairwise_distance

torch = pytest.importorskip("torch")

from scperteval.torch_backend import DeviceUnavailable  # noqa: E402
from scperteval.torch_backend.pairs import TorchPairs  # noqa: E402

TRANSFORMS = [SQRT, rbf_transform(0.7), rbf_transform(3.0)]
POPULATION = ["energy_top_k", "energy_pca", "mmd_top_k", "mmd_pca"]


def cloud(seed, n, dim=6, zeros=0):
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(n, dim)) + 1.5
    points[:zeros] = 0.0
    return points


def brute_force(x, y):
    """Sums of each transform over (x_i, y_j) pairs, or i < j pairs when y is None."""
    if y is None:
        d = cdist(x, x)[np.triu_indices(x.shape[0], k=1)]
    else:
        d = cdist(x, y).ravel()
    return [d.sum(), *(np.exp(-(d**2) / (2 * s * s)).sum() for s in (0.7, 3.0))]


@pytest.mark.parametrize("block_bytes", [512, 64 * 2**20])
@pytest.mark.parametrize("n", [2, 9, 150])
def test_torch_sums_equal_brute_force_and_numpy(n, block_bytes):
    x, y = cloud(0, n, zeros=n // 3), cloud(1, 31)
    backend = TorchPairs("cpu", max_block_bytes=block_bytes)
    reference = NumpyPairs()
    for second in (None, y):
        got = backend.sums(x, second, TRANSFORMS)
        np.testing.assert_allclose(got, brute_force(x, second), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got, reference.sums(x, second, TRANSFORMS), rtol=1e-12)


def test_torch_store_equals_direct_sums():
    x = cloud(3, 120, zeros=10)
    backend = TorchPairs("cpu", max_block_bytes=4096)
    store = backend.store(x)
    assert store.nbytes == backend.store_nbytes(120) == 8 * 120 * 119 // 2
    np.testing.assert_allclose(
        store.sums(TRANSFORMS), backend.sums(x, None, TRANSFORMS), rtol=1e-13
    )
    np.testing.assert_allclose(store.sums(TRANSFORMS), brute_force(x, None), rtol=1e-12)


def test_torch_median_equals_numpy():
    z = cloud(4, 200, zeros=40)
    assert TorchPairs("cpu").median(z) == pytest.approx(median_pairwise_distance(z), rel=1e-13)
    assert TorchPairs("cpu").median(np.zeros((5, 3))) == 0.0


def test_float32_sums_are_close():
    x = cloud(5, 80)
    got = TorchPairs("cpu", torch.float32).sums(x, None, TRANSFORMS)
    np.testing.assert_allclose(got, brute_force(x, None), rtol=1e-5)


def test_backend_choice_and_errors():
    assert pair_backend().name == "numpy"
    assert pair_backend("cpu").name == "torch:cpu:float64"
    assert pair_backend("cpu", "float32").name == "torch:cpu:float32"
    with pytest.raises(SpecError, match="needs a torch device"):
        pair_backend(None, "float32")
    with pytest.raises(SpecError, match="precision must be one of"):
        pair_backend("cpu", "float16")
    with pytest.raises(ValueError, match="unknown pair transform"):
        TorchPairs("cpu").sums(cloud(0, 3), None, [("cube", 1.0)])
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailable, match="CUDA is not available"):
            pair_backend("cuda")


@pytest.fixture(scope="module")
def screen():
    from scperteval.simulation import simulate

    return simulate(n_perturbations=6, n_genes=120, cells_per_perturbation=40, seed=7)


def _values(screen, **options):
    import scperteval

    result = scperteval.calibrate(screen, protocols=POPULATION, progress=False, **options)
    return result.results


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
        ),
    ],
)
def test_calibrate_on_torch_device_matches_numpy(screen, device):
    reference = _values(screen)
    table = _values(screen, device=device, workers=2)
    assert table[["protocol", "perturbation", "source_name"]].equals(
        reference[["protocol", "perturbation", "source_name"]]
    )
    ref, got = reference["value"].to_numpy(), table["value"].to_numpy()
    assert np.isfinite(ref).all()
    # Unbiased estimates can sit near zero: compare against each protocol's scale.
    for protocol, rows in reference.groupby("protocol").groups.items():
        scale = np.median(np.abs(ref[rows]))
        assert np.abs(got[rows] - ref[rows]).max() <= 1e-10 * scale, protocol
    single = _values(screen, device=device, precision="float32")
    assert np.allclose(single["value"], ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max())


def test_cli_device_option_is_recorded(screen, tmp_path):
    from scperteval.cli import main

    path = tmp_path / "screen.h5ad"
    screen.write_h5ad(path)
    out = tmp_path / "out"
    code = main(["calibrate", str(path), "-p", "energy_pca", "--device", "cpu", "--out", str(out)])
    assert code == 0
    record = json.loads((out / "run.json").read_text())
    assert record["options"]["pair_backend"] == "torch:cpu:float64"
