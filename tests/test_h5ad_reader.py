"""``open_h5ad`` reads with h5py what ``anndata.read_h5ad`` would give, or defers to anndata."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import scperteval
from scperteval.data.h5ad import StoredAnnData, is_anndata, open_h5ad
from scperteval.errors import DatasetError


def _obs(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    labels = np.array(["control", "A", "B", "A+B"], dtype=object)[np.arange(n) % 4]
    label_cat = pd.Categorical(labels)
    label_cat[3] = np.nan  # a missing category code (-1)
    level = pd.Categorical(np.arange(n) % 3, categories=[0, 1, 2], ordered=True)
    counts = pd.array(np.arange(n), dtype="Int64")
    counts[1] = pd.NA
    flags = pd.array(np.arange(n) % 2 == 0, dtype="boolean")
    flags[2] = pd.NA
    notes = pd.array([f"note {i}" for i in range(n)], dtype="string")
    notes[4] = pd.NA
    return pd.DataFrame(
        {
            "perturbation": label_cat,
            "dose": level,
            "unique_text": [f"barcode-{i}" for i in range(n)],  # unique: stays text on write
            "score": rng.normal(size=n),
            "n_genes": np.arange(n, dtype=np.int32),
            "kept": np.arange(n) % 3 == 0,
            "counts": counts,
            "flags": flags,
            "notes": notes,
        },
        index=pd.Index([f"cell{i}" for i in range(n)], name="cell_id"),
    )


def _var(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "highly_variable": np.arange(n) % 2 == 0,
            "means": np.linspace(0, 1, n, dtype=np.float32),
            "chromosome": pd.Categorical(np.array(["1", "2", "X"], dtype=object)[np.arange(n) % 3]),
        },
        index=[f"G{i}" for i in range(n)],
    )


def _sparse(n_obs: int, n_vars: int, dtype: type, index_dtype: type, fmt: str) -> sp.spmatrix:
    dense = np.random.default_rng(1).poisson(0.4, size=(n_obs, n_vars)).astype(dtype)
    matrix = sp.csr_matrix(dense) if fmt == "csr" else sp.csc_matrix(dense)
    matrix.indices = matrix.indices.astype(index_dtype)
    matrix.indptr = matrix.indptr.astype(index_dtype)
    return matrix


def _write(path: Path, adata: ad.AnnData, convert: bool = True) -> Path:
    with ad.settings.override(allow_write_nullable_strings=True):
        adata.write_h5ad(path, convert_strings_to_categoricals=convert)
    return path


def _assert_same_matrix(found, expected) -> None:
    assert type(found) is type(expected)
    assert found.dtype == expected.dtype
    assert found.shape == expected.shape
    if sp.issparse(expected):
        for part in ("data", "indices", "indptr"):
            np.testing.assert_array_equal(getattr(found, part), getattr(expected, part))
            assert getattr(found, part).dtype == getattr(expected, part).dtype, part
    else:
        np.testing.assert_array_equal(found, expected)


def _assert_same_as_anndata(path: Path) -> StoredAnnData:
    stored = open_h5ad(path)
    assert isinstance(stored, StoredAnnData) and not stored.isbacked
    expected = ad.read_h5ad(path)
    pd.testing.assert_frame_equal(stored.obs, expected.obs)
    pd.testing.assert_frame_equal(stored.var, expected.var)
    pd.testing.assert_index_equal(stored.obs_names, expected.obs_names)
    pd.testing.assert_index_equal(stored.var_names, expected.var_names)
    assert stored.shape == expected.shape == (stored.n_obs, stored.n_vars)
    if expected.X is None:
        assert stored.X is None
    else:
        _assert_same_matrix(stored.X, expected.X)
    assert list(stored.layers.keys()) == list(expected.layers.keys())
    for name in expected.layers:
        _assert_same_matrix(stored.layers[name], expected.layers[name])
    return stored


MATRICES = {
    "csr float32 int32": lambda n, m: _sparse(n, m, np.float32, np.int32, "csr"),
    "csr float64 int64": lambda n, m: _sparse(n, m, np.float64, np.int64, "csr"),
    "csr float64 int32": lambda n, m: _sparse(n, m, np.float64, np.int32, "csr"),
    "csc float32 int32": lambda n, m: _sparse(n, m, np.float32, np.int32, "csc"),
    "csc float64 int64": lambda n, m: _sparse(n, m, np.float64, np.int64, "csc"),
    "dense float32": lambda n, m: np.random.default_rng(2).random((n, m), dtype=np.float32),
    "dense float64": lambda n, m: np.random.default_rng(2).random((n, m)),
    "dense int64": lambda n, m: np.arange(n * m, dtype=np.int64).reshape(n, m),
}


@pytest.mark.parametrize("kind", list(MATRICES))
def test_every_encoding_reads_as_anndata_reads_it(tmp_path, kind):
    n_obs, n_vars = 24, 7
    matrix = MATRICES[kind](n_obs, n_vars)
    adata = ad.AnnData(
        X=matrix,
        obs=_obs(n_obs),
        var=_var(n_vars),
        layers={"counts": MATRICES["csr float32 int32"](n_obs, n_vars), "dense": matrix},
    )
    # As usually written (text columns with repeats become categorical) and as is.
    _assert_same_as_anndata(_write(tmp_path / "converted.h5ad", adata.copy()))
    stored = _assert_same_as_anndata(_write(tmp_path / "as_is.h5ad", adata, convert=False))
    # The dtypes written are the dtypes read (anndata keeps 64-bit indices as stored).
    assert stored.X.dtype == matrix.dtype
    if sp.issparse(matrix):
        assert stored.X.format == matrix.format
        assert stored.X.indices.dtype == stored.X.indptr.dtype == matrix.indices.dtype
    assert stored.obs.index.name == "cell_id"
    assert stored.obs["perturbation"].isna().sum() == 1
    assert stored.obs["dose"].cat.ordered
    assert str(stored.obs["counts"].dtype) == "Int64"
    assert str(stored.obs["flags"].dtype) == "boolean"
    assert isinstance(stored.obs["notes"].dtype, pd.StringDtype)
    assert stored.obs["notes"].isna().sum() == 1
    assert stored.obs["unique_text"].dtype == object


def test_tables_without_columns_and_files_without_x(tmp_path):
    adata = ad.AnnData(
        obs=pd.DataFrame(index=[f"c{i}" for i in range(5)]),
        var=pd.DataFrame(index=["g1", "g2"]),
        layers={"only": np.ones((5, 2), dtype=np.float32)},
    )
    stored = _assert_same_as_anndata(_write(tmp_path / "bare.h5ad", adata))
    assert stored.X is None
    assert list(stored.obs.columns) == []


def test_the_real_files_read_as_anndata_reads_them(devel_path, counts_path):
    for path in (devel_path, counts_path):
        _assert_same_as_anndata(path)


def test_layers_are_read_only_when_asked_for_and_the_file_is_closed(tmp_path):
    n_obs, n_vars = 30, 6
    adata = ad.AnnData(
        X=MATRICES["csr float32 int32"](n_obs, n_vars),
        obs=_obs(n_obs),
        var=_var(n_vars),
        layers={"counts": MATRICES["csr float64 int64"](n_obs, n_vars), "big": np.ones((30, 6))},
    )
    path = _write(tmp_path / "layers.h5ad", adata)
    stored = open_h5ad(path)
    layers = stored.layers
    assert "counts" in layers and "big" in layers and "absent" not in layers
    assert sorted(layers.keys()) == ["big", "counts"] and len(layers) == 2
    assert layers.loaded == ()  # type: ignore[attr-defined]
    _assert_same_matrix(layers["counts"], adata.layers["counts"])
    assert layers.loaded == ("counts",)  # type: ignore[attr-defined]
    # Closed after reading: opening it for writing would fail while a handle is open.
    with h5py.File(path, "r+") as handle:
        del handle["layers/big"]
    # "big" was never read: it is gone with the file's copy, "counts" stays in memory.
    assert "big" in layers
    with pytest.raises(DatasetError, match="layer 'big' cannot be read any more"):
        layers["big"]
    _assert_same_matrix(layers["counts"], adata.layers["counts"])


def test_the_container_pickles_and_converts_to_anndata(tmp_path):
    n_obs, n_vars = 12, 5
    adata = ad.AnnData(
        X=MATRICES["csr float64 int32"](n_obs, n_vars),
        obs=_obs(n_obs),
        var=_var(n_vars),
        layers={"counts": MATRICES["dense float32"](n_obs, n_vars)},
        obsm={"X_pca": np.arange(n_obs * 2, dtype=np.float64).reshape(n_obs, 2)},
        uns={"note": "kept"},
    )
    adata.raw = adata.copy()
    path = _write(tmp_path / "full.h5ad", adata)
    stored = open_h5ad(path)
    copy = pickle.loads(pickle.dumps(stored))
    pd.testing.assert_frame_equal(copy.obs, stored.obs)
    _assert_same_matrix(copy.X, stored.X)
    _assert_same_matrix(copy.layers["counts"], adata.layers["counts"])

    full = stored.to_anndata()
    expected = ad.read_h5ad(path)
    assert is_anndata(full)
    pd.testing.assert_frame_equal(full.obs, expected.obs)
    _assert_same_matrix(full.X, expected.X)
    _assert_same_matrix(full.layers["counts"], expected.layers["counts"])
    np.testing.assert_array_equal(full.obsm["X_pca"], expected.obsm["X_pca"])
    assert full.uns["note"] == expected.uns["note"] == "kept"
    _assert_same_matrix(full.raw.X, expected.raw.X)
    with pytest.raises(AttributeError):
        stored.X = None  # type: ignore[misc]


def _bytes_column(path: Path) -> None:
    """An obs column stored as fixed-length bytes: anndata reads it, this reader does not."""
    with h5py.File(path, "r+") as handle:
        column = handle["obs"].create_dataset("raw_bytes", data=np.array([b"x"] * 24))
        column.attrs["encoding-type"] = "array"
        column.attrs["encoding-version"] = "0.2.0"
        order = list(handle["obs"].attrs["column-order"]) + ["raw_bytes"]
        handle["obs"].attrs["column-order"] = order


def _mixed_index_dtypes(path: Path) -> None:
    """A CSR X whose indptr is 64-bit and indices 32-bit (anndata keeps both as stored)."""
    with h5py.File(path, "r+") as handle:
        indptr = handle["X/indptr"][()].astype(np.int64)
        del handle["X/indptr"]
        handle["X"].create_dataset("indptr", data=indptr)


def _untagged_root(path: Path) -> None:
    """No encoding attributes on the file itself, as anndata before 0.8 wrote."""
    with h5py.File(path, "r+") as handle:
        for key in ("encoding-type", "encoding-version"):
            del handle.attrs[key]


def _newer_layer_version(path: Path) -> None:
    """A layer in a newer version of the dense encoding: this reader leaves it to anndata."""
    with h5py.File(path, "r+") as handle:
        handle["layers/dense"].attrs["encoding-version"] = "0.3.0"


@pytest.mark.parametrize(
    "change", [_bytes_column, _mixed_index_dtypes, _untagged_root, _newer_layer_version]
)
def test_what_it_cannot_read_goes_through_anndata(tmp_path, change):
    adata = ad.AnnData(
        X=MATRICES["csr float32 int32"](24, 7),
        obs=_obs(24),
        var=_var(7),
        layers={"dense": np.ones((24, 7))},
    )
    path = _write(tmp_path / "odd.h5ad", adata)
    change(path)
    try:
        expected = ad.read_h5ad(path)
    except Exception as exc:  # noqa: BLE001 - anndata's own refusal is the answer then
        with pytest.raises(type(exc)):
            open_h5ad(path)
        return
    found = open_h5ad(path)
    assert is_anndata(found)
    pd.testing.assert_frame_equal(found.obs, expected.obs)
    pd.testing.assert_frame_equal(found.var, expected.var)
    _assert_same_matrix(found.X, expected.X)


def test_an_unknown_column_encoding_fails_as_in_anndata(tmp_path):
    path = _write(tmp_path / "unknown.h5ad", ad.AnnData(X=np.ones((8, 2)), obs=_obs(8)))
    with h5py.File(path, "r+") as handle:
        handle["obs/score"].attrs["encoding-type"] = "my-own-encoding"
    with pytest.raises(Exception) as expected:  # noqa: PT011 - whatever anndata raises
        ad.read_h5ad(path)
    with pytest.raises(expected.type):
        open_h5ad(path)
    with pytest.raises(expected.type):
        open_h5ad(path, backed=True)


def test_is_anndata_tells_apart_without_importing():
    adata = ad.AnnData(X=np.ones((2, 2)))
    stored = StoredAnnData(adata.obs, adata.var, adata.X)
    assert is_anndata(adata)
    assert not is_anndata(stored)
    assert not is_anndata("file.h5ad")


@pytest.fixture(scope="module")
def simulated_path(tmp_path_factory) -> Path:
    adata = scperteval.simulate(
        n_perturbations=4, n_genes=30, cells_per_perturbation=12, n_covariates=2, seed=5
    )
    path = tmp_path_factory.mktemp("h5ad_reader") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


def _run_without_anndata(code: str, tmp_path: Path) -> str:
    script = textwrap.dedent(code) + "\nassert 'anndata' not in sys.modules, 'anndata imported'\n"
    completed = subprocess.run(
        [sys.executable, "-c", "import sys\n" + script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


def test_loading_a_file_never_imports_anndata(simulated_path, tmp_path):
    output = _run_without_anndata(
        f"""
        import scperteval
        path = {str(simulated_path)!r}
        for backed in (False, True):
            dataset = scperteval.load_dataset(path, covariate_key="cell_line", backed=backed)
            assert dataset.n_cells == dataset.adata.n_obs
        dataset = scperteval.load_dataset(
            path, layer="counts", normalize=True, backed=False, pool=True
        )
        print(type(dataset.adata).__name__, dataset.describe())
        """,
        tmp_path,
    )
    assert output.startswith("StoredAnnData")


def test_calibrate_and_score_on_the_command_line_never_import_anndata(simulated_path, tmp_path):
    prediction = scperteval.simulate_predictions(
        ad.read_h5ad(simulated_path), "noisy_truth", noise=0.1, seed=1
    )
    prediction.write_h5ad(tmp_path / "pred.h5ad")
    _run_without_anndata(
        f"""
        from scperteval.cli import main
        data, out = {str(simulated_path)!r}, {str(tmp_path)!r}
        common = ["-p", "mse", "--covariate-key", "cell_line"]
        assert main(["calibrate", data, *common, "--out", out + "/calibrate"]) == 0
        pred = "m=" + out + "/pred.h5ad"
        score = ["score", data, "--pred", pred, *common, "--no-figures"]
        assert main([*score, "--out", out + "/score"]) == 0
        """,
        tmp_path,
    )
    assert (tmp_path / "score" / "results.parquet").is_file()


@pytest.mark.parametrize(
    "options",
    [
        {"covariate_key": "cell_line"},
        {"covariate_key": "cell_line", "subset": {"cell_line": "cell_line_0"}},
        {"layer": "counts", "normalize": True, "pool": True},
    ],
)
def test_a_dataset_from_the_file_equals_one_from_the_anndata(simulated_path, options):
    from_file = scperteval.load_dataset(simulated_path, backed=False, **options)
    from_memory = scperteval.load_dataset(ad.read_h5ad(simulated_path), **options)
    assert isinstance(from_file.adata, StoredAnnData)
    assert from_file.conditions == from_memory.conditions
    np.testing.assert_array_equal(from_file.perturbation_labels, from_memory.perturbation_labels)
    np.testing.assert_array_equal(from_file.covariate_labels, from_memory.covariate_labels)
    np.testing.assert_array_equal(from_file.cell_index, from_memory.cell_index)
    pd.testing.assert_index_equal(from_file.var_names, from_memory.var_names)
    _assert_same_matrix(from_file.matrix(), from_memory.matrix())
    for (_, found), (_, expected) in zip(
        from_file.iter_chunks(), from_memory.iter_chunks(), strict=True
    ):
        _assert_same_matrix(found, expected)
    # Shipped to a worker: the matrix travels without the annotations, and back.
    copy = pickle.loads(pickle.dumps(from_file))
    assert isinstance(copy.adata, StoredAnnData)
    assert list(copy.adata.obs.columns) == []
    _assert_same_matrix(copy.matrix(), from_memory.matrix())


def test_threads_asking_for_a_layer_at_once_read_it_once(tmp_path, monkeypatch):
    import threading

    from scperteval.data import stored as stored_module

    path = tmp_path / "layers.h5ad"
    ad.AnnData(
        X=sp.random(30, 8, density=0.3, format="csr", random_state=1),
        layers={"counts": sp.random(30, 8, density=0.3, format="csr", random_state=2)},
    ).write_h5ad(path)
    layers = open_h5ad(path).layers
    reads = []
    started = threading.Barrier(4)
    original = stored_module.read_matrix

    def counted(node):
        reads.append(node.name)
        return original(node)

    monkeypatch.setattr(stored_module, "read_matrix", counted)
    found = []

    def ask():
        started.wait()
        found.append(layers["counts"])

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert reads == ["/layers/counts"]
    assert all(matrix is found[0] for matrix in found)
    copy = pickle.loads(pickle.dumps(layers))
    assert (copy["counts"] != found[0]).nnz == 0


def test_annotated_data_is_an_anndata_or_the_container(tmp_path):
    from scperteval.data.h5ad import is_annotated_data

    adata = ad.AnnData(X=np.ones((3, 2)))
    path = _write(tmp_path / "tiny.h5ad", adata)
    assert is_annotated_data(adata)
    assert is_annotated_data(open_h5ad(path))
    assert is_annotated_data(open_h5ad(path, backed=True))
    assert not is_annotated_data(np.ones((3, 2)))
    assert not is_annotated_data(str(path))


@pytest.mark.parametrize("change", [None, _bytes_column, _untagged_root])
def test_a_file_opened_backed_has_the_annotations_and_leaves_the_matrices_on_disk(tmp_path, change):
    adata = ad.AnnData(
        X=MATRICES["csr float32 int32"](24, 7),
        obs=_obs(24),
        var=_var(7),
        layers={"dense": np.ones((24, 7))},
    )
    path = _write(tmp_path / "file.h5ad", adata)
    if change is not None:
        change(path)  # annotations anndata reads for the reader: the matrices are h5py's
    expected = ad.read_h5ad(path)
    opened = open_h5ad(path, backed=True)
    assert isinstance(opened, StoredAnnData) and opened.isbacked
    assert opened.filename == path
    pd.testing.assert_frame_equal(opened.obs, expected.obs)
    pd.testing.assert_frame_equal(opened.var, expected.var)
    assert isinstance(opened.X, h5py.Group) and opened.X.name == "/X"
    assert isinstance(opened.layers["dense"], h5py.Dataset)
    np.testing.assert_array_equal(opened.layers["dense"][()], expected.layers["dense"])
    # "auto" leaves on disk only a file over a third of the available memory.
    assert not open_h5ad(path, backed="auto").isbacked


def test_auto_leaves_a_file_larger_than_a_third_of_memory_on_disk(tmp_path, monkeypatch):
    path = _write(tmp_path / "tiny.h5ad", ad.AnnData(X=np.ones((3, 2))))
    size = path.stat().st_size
    monkeypatch.setattr("scperteval.data.h5ad.available_memory", lambda: 3.0 * size - 3)
    assert open_h5ad(path, backed="auto").isbacked
    monkeypatch.setattr("scperteval.data.h5ad.available_memory", lambda: 3.0 * size)
    assert not open_h5ad(path, backed="auto").isbacked
