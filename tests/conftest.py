"""Shared fixtures: the real data folder (skipped when absent) and small generated datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA_ENV = "SCPERTEVAL_DATA"
DEVEL_FILE = "perturbench_devel.h5ad"
COUNTS_FILE = "shifrut2018_subset_counts.h5ad"


def _data_dir() -> Path | None:
    """$SCPERTEVAL_DATA when set (even if absent, to force skipping), else ../shared/data."""
    configured = os.environ.get(DATA_ENV)
    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    folder = Path(configured) if configured else default
    return folder if folder.is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The folder of real datasets; the test is skipped when it is absent."""
    folder = _data_dir()
    if folder is None:
        pytest.skip(f"real data folder not found (set {DATA_ENV} or provide ../shared/data)")
    return folder


def _data_file(data_dir: Path, name: str) -> Path:
    path = data_dir / name
    if not path.is_file():
        pytest.skip(f"{name} not found in {data_dir}")
    return path


@pytest.fixture(scope="session")
def devel_path(data_dir: Path) -> Path:
    """perturbench_devel.h5ad: log-normalised Norman 2019 + McFaline 2023 cells."""
    return _data_file(data_dir, DEVEL_FILE)


@pytest.fixture(scope="session")
def counts_path(data_dir: Path) -> Path:
    """shifrut2018_subset_counts.h5ad: raw integer counts."""
    return _data_file(data_dir, COUNTS_FILE)


@pytest.fixture(scope="session")
def _devel_adata(devel_path: Path):
    import anndata as ad

    return ad.read_h5ad(devel_path)


@pytest.fixture
def devel_adata(_devel_adata):
    """A fresh in-memory copy of perturbench_devel.h5ad (safe to modify)."""
    return _devel_adata.copy()


@pytest.fixture(scope="session")
def _counts_adata(counts_path: Path):
    import anndata as ad

    return ad.read_h5ad(counts_path)


@pytest.fixture
def counts_adata(_counts_adata):
    """A fresh in-memory copy of the raw-count dataset."""
    return _counts_adata.copy()


@pytest.fixture(scope="session")
def _sim_adata():
    from scperteval.simulation import simulate

    return simulate(
        n_perturbations=6,
        n_genes=60,
        cells_per_perturbation=30,
        n_covariates=2,
        n_combinations=2,
        effect_size=1.0,
        seed=3,
    )


@pytest.fixture
def sim_adata(_sim_adata):
    """A small generated dataset: 2 cell lines, 6 singles and 2 combinations, 60 genes."""
    return _sim_adata.copy()


@pytest.fixture
def engine_of():
    """Build a run's engine from an AnnData, with the run defaults unless overridden."""
    import scperteval
    from scperteval.workflows.steps import build_engine

    def build(adata, **options):
        settings = {
            "seed": 0,
            "de_method": "t-test",
            "truth": "half",
            "sample_cells": 8192,
            "device": None,
            "precision": "float64",
        }
        settings.update(options)
        return build_engine(scperteval.load_dataset(adata), **settings)

    return build
