"""Running on a dask cluster gives the tables of a thread-pool run, bit for bit.

The group statistics are folded in the local pass's chunk order and every random
choice is seeded by names, so no value depends on where it was computed: the
tables are compared with ``check_exact=True``. Dask workers run BLAS on one
thread and a local run on several; the products whose sums BLAS could split by
thread (PCA fits and projections, pairwise distances) run on one BLAS thread in
fixed tiles, so local runs with any BLAS thread count give the cluster's values.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

from scperteval.cli import main  # noqa: E402
from scperteval.context import Context  # noqa: E402
from scperteval.data.dataset import Dataset  # noqa: E402
from scperteval.engine.dispatch import group_statistics, task_count  # noqa: E402
from scperteval.engine.engine import Engine  # noqa: E402
from scperteval.engine.suites import resolve_protocols  # noqa: E402
from scperteval.errors import MissingExtraError, install_command  # noqa: E402
from scperteval.simulation import simulate, simulate_predictions  # noqa: E402
from scperteval.workflows.calibrate import calibrate  # noqa: E402
from scperteval.workflows.score import score  # noqa: E402

# One protocol of each kind: centroid, DE, population (energy, fast path) and
# dataset scope (rank).
PROTOCOLS = "pearson_delta_ctrl,mse_top_k,de_topk_overlap,energy_pca,rank_full"
FEW_PROTOCOLS = "pearson_delta_ctrl,energy_pca"
CHUNK = 97  # several chunks, cut mid-group, so the fold order matters
NORMAN = {"perturbation_key": "condition", "subset": {"dataset": "norman19"}}


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster) as connected:
        yield connected
    cluster.close()


@pytest.fixture(scope="module")
def screen() -> ad.AnnData:
    return simulate(
        n_perturbations=10,
        n_genes=60,
        cells_per_perturbation=30,
        n_covariates=2,
        n_combinations=2,
        seed=3,
    )


@pytest.fixture(scope="module")
def models(screen: ad.AnnData) -> dict[str, ad.AnnData]:
    return {
        "noisy": simulate_predictions(screen, "noisy_truth", noise=0.3, seed=1),
        "mean": simulate_predictions(screen, "mean", pseudobulk=True, seed=2),
    }


def _local(function, *args, **options):
    """``function`` run on a thread pool, with BLAS on two threads (a worker's has one)."""
    with threadpool_limits(2):
        return function(*args, workers=2, **options)


def _dataset(adata: ad.AnnData, **options) -> Dataset:
    return Dataset(adata, covariate_key="cell_line", chunk_cells=CHUNK, **options)


def _assert_same_score(local, remote) -> None:
    for table in ("results", "calibration", "aggregates", "tests"):
        pd.testing.assert_frame_equal(
            getattr(local, table), getattr(remote, table), check_exact=True
        )
    pd.testing.assert_frame_equal(
        local.leaderboard.table, remote.leaderboard.table, check_exact=True
    )


@pytest.fixture(scope="module")
def cluster_calibration(client, screen):
    """A calibration on the cluster, the names and workers of its tasks, and engine picklings."""
    pickled = []
    original = Engine.__getstate__

    def counting(self):
        pickled.append(1)
        return original(self)

    with pytest.MonkeyPatch.context() as patch, distributed.get_task_stream(client) as stream:
        patch.setattr(Engine, "__getstate__", counting)
        result = calibrate(_dataset(screen), protocols=PROTOCOLS, executor=client)
    tasks = [
        (task["key"] if isinstance(task["key"], str) else task["key"][0], task["worker"])
        for task in stream.data
    ]
    return result, tasks, len(pickled)


def test_calibrate_on_cluster_equals_thread_pool(cluster_calibration, screen) -> None:
    remote, _, _ = cluster_calibration
    local = _local(calibrate, _dataset(screen), protocols=PROTOCOLS)
    pd.testing.assert_frame_equal(local.results, remote.results, check_exact=True)
    pd.testing.assert_frame_equal(local.calibration, remote.calibration, check_exact=True)
    assert local.results["value"].notna().all()


def test_work_is_spread_over_the_workers(cluster_calibration, screen) -> None:
    _, tasks, _ = cluster_calibration
    n_chunks = len(_dataset(screen).chunk_slices())
    assert n_chunks > 1
    assert sum(name.startswith("_chunk_stats") for name, _ in tasks) == n_chunks
    workers = {worker for name, worker in tasks if name.startswith("protocol-task-")}
    assert len(workers) == 2, "protocol tasks run on both workers"


def test_a_perturbations_tasks_prefer_one_worker(cluster_calibration, screen) -> None:
    _, tasks, _ = cluster_calibration
    workers_of: dict[str, list[str]] = {}
    for name, worker in tasks:
        if name.startswith("protocol-task-") and not name.startswith("protocol-task-dataset"):
            condition = name.removeprefix("protocol-task-").split("-")[0]
            workers_of.setdefault(condition, []).append(worker)
    n_conditions = Engine(Context(_dataset(screen))).context.layout.n_conditions
    assert len(workers_of) == n_conditions  # every perturbation of every cell line
    on_preferred = sum(max(Counter(found).values()) for found in workers_of.values())
    # Placement is a preference (a free worker may take a queued task), so a few
    # may run elsewhere; scattered tasks would put about half on each worker.
    assert on_preferred >= 0.9 * sum(map(len, workers_of.values()))
    # Both workers have perturbations of their own.
    preferred = {Counter(found).most_common(1)[0][0] for found in workers_of.values()}
    assert len(preferred) == 2


def test_engine_travels_once_not_per_task(client, cluster_calibration, screen) -> None:
    _, tasks, n_pickled = cluster_calibration
    n_tasks = sum(name.startswith("protocol-task-") for name, _ in tasks)
    engine = Engine(Context(_dataset(screen)))
    assert n_tasks == task_count(engine, resolve_protocols(PROTOCOLS))
    assert 1 <= n_pickled <= len(client.scheduler_info()["workers"]) < n_tasks


def test_cluster_equals_multithreaded_blas_exactly(cluster_calibration, screen) -> None:
    remote, _, _ = cluster_calibration
    for blas_threads in (1, 2, 4):
        with threadpool_limits(blas_threads):
            local = calibrate(_dataset(screen), protocols=PROTOCOLS, workers=2)
        pd.testing.assert_frame_equal(local.results, remote.results, check_exact=True)


def test_gram_route_pca_on_cluster_equals_multithreaded_blas(client) -> None:
    # Over 1,000 cells and genes: the axes come from tiled Gram products, not an SVD.
    wide = simulate(n_perturbations=6, n_genes=1100, cells_per_perturbation=160, seed=8)
    local = _local(calibrate, Dataset(wide), protocols=FEW_PROTOCOLS)
    remote = calibrate(Dataset(wide), protocols=FEW_PROTOCOLS, executor=client)
    pd.testing.assert_frame_equal(local.results, remote.results, check_exact=True)
    assert local.results["value"].notna().all()


def test_score_on_cluster_equals_thread_pool(client, screen, models) -> None:
    options = {"protocols": PROTOCOLS, "figures": False}
    local = _local(score, _dataset(screen), models, **options)
    remote = score(_dataset(screen), models, executor=client, **options)
    _assert_same_score(local, remote)
    assert set(remote.results["source_name"]) >= {"noisy", "mean", "linear"}


def test_cluster_group_statistics_equal_local_pass(client, screen) -> None:
    local = Context(_dataset(screen)).group_stats
    remote = group_statistics(Engine(Context(_dataset(screen))), client)
    for field in ("n", "mean", "m2"):
        np.testing.assert_array_equal(getattr(local, field), getattr(remote, field))


def _lazy_and_eager(screen: ad.AnnData, sparse: bool) -> tuple[Dataset, Dataset]:
    matrix = screen.X if sparse else np.asarray(screen.X.toarray())
    lazy = ad.AnnData(X=da.from_array(matrix, chunks=(CHUNK, -1)), obs=screen.obs, var=screen.var)
    eager = ad.AnnData(X=matrix, obs=screen.obs, var=screen.var)
    # The dask array's blocks set its chunks; the in-memory matrix is cut the same way.
    return Dataset(lazy, covariate_key="cell_line"), _dataset(eager)


@pytest.mark.parametrize("sparse", [True, False])
def test_dask_array_is_read_block_by_block(screen, sparse) -> None:
    lazy, eager = _lazy_and_eager(screen, sparse)
    blocks = [block for _, block in lazy.iter_chunks()]
    assert max(block.shape[0] for block in blocks) == CHUNK
    assert all(sp.issparse(block) == sparse for block in blocks)
    assert lazy.chunk_slices() == eager.chunk_slices()
    expected, found = Context(eager).group_stats, Context(lazy).group_stats
    for field in ("n", "mean", "m2"):
        np.testing.assert_array_equal(getattr(expected, field), getattr(found, field))
    positions = np.array([0, 5, CHUNK - 1, CHUNK, 3 * CHUNK + 2, lazy.n_cells - 1])
    rows, expected_rows = lazy.rows(positions), eager.rows(positions)
    assert sp.issparse(rows) == sparse
    np.testing.assert_array_equal(
        rows.toarray() if sparse else rows,
        expected_rows.toarray() if sparse else expected_rows,
    )


def test_dask_array_dataset_equals_in_memory(client, screen) -> None:
    lazy, eager = _lazy_and_eager(screen, sparse=True)
    in_memory = _local(calibrate, eager, protocols=FEW_PROTOCOLS)
    local = _local(calibrate, lazy, protocols=FEW_PROTOCOLS)
    remote = calibrate(lazy, protocols=FEW_PROTOCOLS, executor=client)
    for result in (local, remote):
        pd.testing.assert_frame_equal(in_memory.results, result.results, check_exact=True)


def test_norman_backed_on_cluster_equals_thread_pool(client, devel_path: Path) -> None:
    # Workers reopen the backed file by name; the local run reads it into memory.
    backed = Dataset(devel_path, backed=True, chunk_cells=1000, **NORMAN)
    in_memory = Dataset(devel_path, backed=False, chunk_cells=1000, **NORMAN)
    assert backed.is_backed and not in_memory.is_backed
    adata = ad.read_h5ad(devel_path)
    norman = adata[(adata.obs["dataset"] == "norman19") & (adata.obs["condition"] != "control")]
    shifted = ad.AnnData(
        X=norman.X.toarray() + 0.1, obs=norman.obs[["condition"]], var=norman.var[[]]
    )
    options = {"protocols": PROTOCOLS, "figures": False, "baselines": ("linear", "control_mean")}
    local = _local(score, in_memory, {"shifted": shifted}, **options)
    remote = score(backed, {"shifted": shifted}, executor=client, **options)
    _assert_same_score(local, remote)
    assert not local.calibration.empty


def test_norman_calibrate_on_cluster_equals_thread_pool(client, devel_path: Path) -> None:
    dataset = Dataset(devel_path, backed=False, chunk_cells=1000, **NORMAN)
    local = _local(calibrate, dataset, protocols=PROTOCOLS)
    remote = calibrate(dataset, protocols=PROTOCOLS, executor=client)
    pd.testing.assert_frame_equal(local.results, remote.results, check_exact=True)
    pd.testing.assert_frame_equal(local.calibration, remote.calibration, check_exact=True)
    assert local.results["value"].notna().mean() > 0.95


def test_cli_scheduler_option_runs_on_the_cluster(client, tmp_path: Path) -> None:
    command = ["calibrate", "--example", "-p", FEW_PROTOCOLS, "--seed", "1"]
    address = client.scheduler.address
    assert main([*command, "--scheduler", address, "--out", str(tmp_path / "cluster")]) == 0
    with threadpool_limits(2):
        assert main([*command, "--workers", "2", "--out", str(tmp_path / "local")]) == 0
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "local" / "results.parquet"),
        pd.read_parquet(tmp_path / "cluster" / "results.parquet"),
        check_exact=True,
    )


def test_missing_distributed_names_the_extra(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)
    from scperteval.engine.distributed import connect

    with pytest.raises(MissingExtraError, match=re.escape(install_command("dask"))):
        connect("tcp://127.0.0.1:8786")
    status = main(
        ["calibrate", "--example", "--scheduler", "tcp://127.0.0.1:8786", "--out", str(tmp_path)]
    )
    assert status == 2
    assert install_command("dask") in capsys.readouterr().err


def test_importing_scperteval_does_not_import_dask() -> None:
    code = (
        "import sys, scperteval, scperteval.cli, scperteval.engine.dispatch\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "[]"
