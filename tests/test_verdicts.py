"""Leaderboard verdicts on the Norman subset: headline rule, trust, flags, coverage, outputs."""

from __future__ import annotations

import html
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy import stats

from scperteval.reporting.terminal import terminal_lines
from scperteval.scoring.headline import headline_ci, score_definition
from scperteval.scoring.leaderboard import RANKED, build_leaderboard
from scperteval.workflows.score import score

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PROTOCOLS = (
    "pearson_delta_ctrl,mse,mae,weighted_mse,de_auroc,rank_full,pds,energy_pca,mse_perturbed_genes"
)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "leaderboards.md"


def _models(adata: ad.AnnData) -> dict[str, ad.AnnData]:
    """good: multiplicative noise on non-zero values; bad: the mean of all perturbed cells."""
    rng = np.random.default_rng(0)
    dense = adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)
    labels = adata.obs["condition"].astype(str).to_numpy()
    perturbed = labels != "control"
    cells = dense[perturbed]

    def make(matrix: np.ndarray) -> ad.AnnData:
        obs = pd.DataFrame(
            {"condition": labels[perturbed]}, index=[f"c{i}" for i in range(cells.shape[0])]
        )
        return ad.AnnData(np.asarray(matrix, dtype=np.float32), obs=obs, var=adata.var[[]].copy())

    return {
        "good": make(cells * np.exp(rng.normal(0.0, 0.3, cells.shape))),
        "bad": make(np.repeat(cells.mean(axis=0, keepdims=True), cells.shape[0], axis=0)),
        "truth": make(cells),
    }


@pytest.fixture(scope="module")
def norman(devel_path: Path, tmp_path_factory: pytest.TempPathFactory):
    adata = ad.read_h5ad(devel_path)
    adata = adata[adata.obs["dataset"] == "norman19"].copy()
    out = tmp_path_factory.mktemp("verdicts")
    result = score(
        adata,
        _models(adata),
        protocols=PROTOCOLS,
        perturbation_key="condition",
        out=out,
        figures=False,
        workers=2,
        progress=False,
    )
    return result, out


def test_good_model_near_positive_control_and_above_bad_and_negatives(norman) -> None:
    result, _ = norman
    table = result.leaderboard.table.set_index("model")
    assert table.loc["good", "score"] == pytest.approx(1.0, abs=0.15)
    assert table.loc["good", "listing"] == RANKED
    assert table.loc["good", "rank"] < table.loc["bad", "rank"]
    for negative in ("dataset_mean", "control_mean"):
        assert table.loc["good", "score"] > table.loc[negative, "score"]
    # additive scores the combinations only: listed apart, not ranked above anyone.
    assert table.loc["additive", "listing"] != RANKED
    listing = table.loc["additive", "listing"]
    assert listing.startswith("listed apart; rank ")
    assert table.loc["additive", "rank"] == int(listing.split("; rank ")[1].split(" ")[0])
    rows = result.results
    additive = rows[(rows["source_name"] == "additive") & rows["calibrated"].notna()]
    scored = additive.loc[additive["protocol"].isin(result.leaderboard.trusted), "perturbation"]
    assert scored.nunique() > 0 and all("+" in str(p) for p in scored.unique())
    total = table.loc["good", "perturbations"].split("/")[1]
    assert table.loc["additive", "perturbations"] == f"{scored.nunique()}/{total}"
    assert table.loc["good", "ci_low"] <= table.loc["good", "score"] <= table.loc["good", "ci_high"]


def test_one_extreme_column_does_not_change_the_ranking(norman) -> None:
    result, _ = norman
    board = result.leaderboard
    aggregates = result.aggregates.copy()
    before = board.table.loc[board.table["listing"] == RANKED, "model"].tolist()
    for protocol in board.trusted:
        for extreme in (-1e9, 1e9):
            corrupted = aggregates.copy()
            row = (corrupted["protocol"] == protocol) & (corrupted["source_name"] == "good")
            corrupted.loc[row, "median"] = extreme
            again = build_leaderboard(
                corrupted, board.protocols, board.better, board.trusted, board.excluded
            )
            order = again.table.sort_values("score", ascending=False)["model"].tolist()
            assert [m for m in order if m in before] == before, (protocol, extreme)
    # A mean over protocols would let the same corruption decide the ranking.
    corrupted = aggregates.copy()
    row = (corrupted["protocol"] == board.trusted[0]) & (corrupted["source_name"] == "good")
    corrupted.loc[row, "median"] = -1e9
    wide = corrupted.pivot_table(index="source_name", columns="protocol", values="median")
    assert wide.loc["good", board.trusted].mean() < wide.loc["bad", board.trusted].mean()


def test_protocol_on_one_perturbation_is_not_trusted(norman) -> None:
    result, _ = norman
    board = result.leaderboard
    calibration = result.calibration.set_index("protocol")
    assert int(calibration.loc["mse_perturbed_genes", "n"]) < 10
    assert "mse_perturbed_genes" not in board.trusted
    assert board.excluded["mse_perturbed_genes"].startswith("insufficient evidence")
    assert board.verdicts["mse_perturbed_genes"].startswith("not trusted")
    n = int(calibration.loc["mse", "n"])
    wins = round(float(calibration.loc["mse", "bds"]) * n)
    assert board.verdicts["mse"].startswith(
        f"trusted: the technical duplicate beats the dataset mean on {wins}/{n} perturbations"
    )


def test_flags_fire_on_collapse_and_leakage_only(norman) -> None:
    result, out = norman
    flags = result.info["flags"]
    assert flags["bad"]["collapse_ratio"] == pytest.approx(0.0, abs=1e-12)
    assert any(f.startswith("mode collapse") for f in flags["bad"]["flags"])
    assert flags["truth"]["leaked_share"] == 1.0
    assert any(f.startswith("leakage") for f in flags["truth"]["flags"])
    assert flags["good"]["flags"] == []
    assert flags["good"]["leaked_share"] == 0.0
    assert flags["good"]["collapse_ratio"] > 0.5
    table = result.leaderboard.table.set_index("model")
    assert table.loc["bad", "flags"] == "mode collapse"
    assert table.loc["truth", "flags"] == "leakage"
    assert table.loc["good", "flags"] == "none"
    stored = pd.read_json(out / "run.json", typ="series")["options"]["flags"]
    assert stored["truth"]["flags"] == flags["truth"]["flags"]
    text = "\n".join(terminal_lines(result))
    assert "FLAG bad: mode collapse" in text and "FLAG truth: leakage" in text
    assert "FLAG good" not in text


def test_definition_is_the_same_everywhere(norman) -> None:
    result, out = norman
    board = result.leaderboard
    definition = score_definition(board.aggregate, len(board.trusted))
    assert board.definition == definition
    assert definition in terminal_lines(result)
    assert definition in (out / "leaderboard.md").read_text(encoding="utf-8").replace("\\", "")
    assert definition in (out / "leaderboard.tex").read_text(encoding="utf-8")
    assert definition in html.unescape((out / "report.html").read_text(encoding="utf-8"))
    assert definition in html.unescape(board._repr_html_())
    assert definition in (out / "methods.md").read_text(encoding="utf-8")
    assert score_definition("median", "N") in DOCS.read_text(encoding="utf-8").replace("\n", " ")


def test_headline_csv_columns_and_no_empty_test_rows(norman) -> None:
    result, out = norman
    csv = pd.read_csv(out / "leaderboard.csv")
    assert list(csv.columns) == list(result.leaderboard.headline.columns)
    assert (pd.read_csv(out / "tests.csv")["n"] > 0).all()
    pairs = pd.read_csv(out / "pairwise_tests.csv")
    assert (pairs["n"] > 0).all()
    assert {"score", *result.leaderboard.trusted} >= set(pairs["protocol"])
    wins = pd.read_csv(out / "win_tie_loss.csv").set_index(["entry", "other"])
    assert wins.loc[("good", "bad"), "wins"] > wins.loc[("good", "bad"), "losses"]
    assert wins.loc[("good", "bad"), "score_outcome"] == "win"


def test_methods_paragraph_names_the_run(norman) -> None:
    result, out = norman
    text = (out / "methods.md").read_text(encoding="utf-8")
    assert result.info["input_checksum"] in text
    assert f"{result.info['n_cells']} cells" in text
    assert f"seed {result.info['seed']}" in text
    assert f"at least {result.thresholds.bds_min}" in text
    assert "Miller et al." in text and "10.1101/2025.10.20.683304" in text


def test_headline_ci_equals_a_textbook_bootstrap() -> None:
    rng = np.random.default_rng(3)
    matrix = rng.normal(0.5, 0.3, size=(25, 5))
    matrix[rng.random(matrix.shape) < 0.1] = np.nan
    low, high = headline_ci(matrix, "median", seed=11, n_resamples=300)
    draws = np.random.default_rng(11).integers(0, 25, size=(300, 25))
    values = []
    for rows in draws:
        columns = []
        for j in range(5):
            column = matrix[rows, j]
            column = column[np.isfinite(column)]
            columns.append(np.median(column))
        values.append(np.median(columns))
    expected = np.quantile(values, [0.025, 0.975])
    assert (low, high) == pytest.approx(tuple(expected), rel=1e-12)
    reference = stats.bootstrap(
        (np.arange(25),),
        lambda rows: np.median(np.nanmedian(matrix[rows.astype(int)], axis=0)),
        n_resamples=4000,
        method="percentile",
        vectorized=False,
        random_state=1,
    ).confidence_interval
    assert low == pytest.approx(reference.low, abs=0.08)
    assert high == pytest.approx(reference.high, abs=0.08)
