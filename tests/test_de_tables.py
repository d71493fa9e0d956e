"""Differential expression read from earlier runs or other tools instead of computed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import scperteval
from scperteval.context import Context
from scperteval.data.dataset import Dataset
from scperteval.errors import DatasetError, SpecError
from scperteval.stats.de_tables import read_de_table

PROTOCOLS = "de_auprc,de_auroc,de_topk_overlap,weighted_mse,mse_top_k,pearson_delta_ctrl_top_k"


def _values(result) -> pd.DataFrame:
    keys = ["protocol", "covariate", "perturbation", "source", "source_name"]
    return result.results.sort_values(keys).reset_index(drop=True)


@pytest.mark.parametrize("method", ["t-test", "wilcoxon"])
def test_a_de_folder_gives_the_results_of_computing_it(sim_adata, tmp_path, method):
    options = {"covariate_key": "cell_line", "de_method": method, "seed": 3}
    computed = scperteval.calibrate(sim_adata, PROTOCOLS, **options)
    scperteval.de(
        sim_adata,
        covariate_key="cell_line",
        method=method,
        half="truth",
        seed=3,
        out=tmp_path / "de",
    )
    read = scperteval.calibrate(sim_adata, PROTOCOLS, de_tables=tmp_path / "de", **options)
    pd.testing.assert_frame_equal(_values(computed), _values(read))
    assert read.info["de_tables"] == [
        {
            "source": str(tmp_path / "de" / "de.parquet"),
            "method": method,
            "reference": "rest",
            "half": "truth",
        }
    ]


def test_an_in_memory_de_table_is_read_back(sim_adata, tmp_path):
    table = scperteval.de(sim_adata, covariate_key="cell_line", half="all")
    model = {"model": sim_adata[sim_adata.obs["perturbation"] != "control"].copy()}
    computed = scperteval.score(
        sim_adata, model, PROTOCOLS, covariate_key="cell_line", truth="all", figures=False
    )
    read = scperteval.score(
        sim_adata,
        model,
        PROTOCOLS,
        covariate_key="cell_line",
        truth="all",
        figures=False,
        de_tables=[table],
        out=tmp_path / "run",
    )
    pd.testing.assert_frame_equal(_values(computed), _values(read))
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["options"]["de_tables"][0]["source"] == "DataFrame"


def _cell_eval_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Our DE table in cell-eval / pdex's column names."""
    return frame.rename(
        columns={
            "perturbation": "target",
            "gene": "feature",
            "pvalue": "p_value",
            "pvalue_adj": "fdr",
            "log_fold_change": "log2_fold_change",
        }
    ).drop(columns=["covariate", "mean_target", "mean_reference"])


def test_a_cell_eval_table_replaces_the_wilcoxon_de_against_the_control(sim_adata):
    one_line = sim_adata[sim_adata.obs["cell_line"] == sim_adata.obs["cell_line"].iloc[0]].copy()
    ours = scperteval.de(one_line, method="wilcoxon", reference="control")
    table = _cell_eval_table(ours).sample(frac=1.0, random_state=0)  # any row order
    # A predicted-control block, as pdex writes one, is ignored.
    control = table[table["target"] == table["target"].iloc[0]].assign(target="control")
    table = pd.concat([table, control], ignore_index=True)
    computed = Context(Dataset(one_line)).de("wilcoxon", "control", "all")
    context = Context(Dataset(one_line))
    dataset = context.dataset
    context.use_de_table(
        read_de_table(table, context.layout.conditions, dataset.var_names, "control", 0)
    )
    read = context.de("wilcoxon", "control", "all")
    for name in ("statistic", "pvalue", "pvalue_adj", "log_fold_change", "mean_target"):
        np.testing.assert_array_equal(getattr(read, name), getattr(computed, name))
    assert context.de_tables[0]["method"] == "wilcoxon"


def test_tables_that_do_not_match_the_data_are_refused(sim_adata, tmp_path):
    dataset = Dataset(sim_adata, covariate_key="cell_line")
    conditions = Context(dataset).layout.conditions
    genes = dataset.var_names
    table = scperteval.de(sim_adata, covariate_key="cell_line", half="truth", seed=1)

    def read(frame, seed=1):
        return read_de_table(frame, conditions, genes, "control", seed)

    with pytest.raises(DatasetError, match=r"1 gene\(s\) of the data missing"):
        read(table[table["gene"] != genes[0]])
    first = str(table["perturbation"].iloc[0])
    missing_one = table[table["perturbation"] != first].copy()
    missing_one.attrs = table.attrs
    with pytest.raises(DatasetError, match=r"perturbation\(s\) of the data missing"):
        read(missing_one)
    with pytest.raises(DatasetError, match=r"seed 1, but this run's halves use seed 2"):
        read(table, seed=2)
    with pytest.raises(DatasetError, match=r"neither scperteval's columns"):
        read(table.drop(columns="statistic"))
    unrecorded = table.copy()
    unrecorded.attrs = {}
    with pytest.raises(DatasetError, match="needs its run record"):
        read(unrecorded)
    twice = pd.concat([table, table.iloc[:1]], ignore_index=True)
    twice.attrs = table.attrs
    with pytest.raises(DatasetError, match="appears more than once"):
        read(twice)
    with pytest.raises(DatasetError, match="covariate groups"):
        read(_cell_eval_table(table))
    with pytest.raises(DatasetError, match="must be a path or a pandas DataFrame"):
        read(5)
    bad = tmp_path / "broken.parquet"
    bad.write_text("not parquet")
    with pytest.raises(DatasetError, match="cannot read it"):
        read(bad)
    context = Context(dataset, seed=1)
    context.use_de_table(read(table))
    with pytest.raises(SpecError, match="given twice"):
        context.use_de_table(read(table))
