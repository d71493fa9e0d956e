"""Reports of a scored run: Markdown, LaTeX, figures and the self-contained HTML page."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from scperteval.engine.calibrators import Thresholds
from scperteval.reporting import FIGURE_NAMES, write_reports
from scperteval.reporting.html import LEADERBOARD_ID, SIGNIFICANCE
from scperteval.reporting.tables import latex_escape, markdown_escape
from scperteval.scoring.result import ScoreResult
from scperteval.simulation import simulate, simulate_predictions
from scperteval.workflows.score import score

pytestmark = pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")

PROTOCOLS = "pearson_delta_ctrl,mse,weighted_mse,energy_pca,rank_full"
TEXT_COLUMNS = ("model", "kind", "perturbations", "protocols", "listing", "flags")
DASH = "–"


def _inputs():
    adata = simulate(n_perturbations=8, n_genes=80, cells_per_perturbation=40, seed=0)
    predictions = {
        "good": simulate_predictions(adata, "noisy_truth", noise=0.1, seed=1),
        "mean": simulate_predictions(adata, "mean", seed=2),
        "pb": simulate_predictions(adata, "noisy_truth", noise=0.1, pseudobulk=True, seed=3),
    }
    return adata, predictions


@pytest.fixture(scope="module")
def inputs():
    return _inputs()


@pytest.fixture(scope="module")
def calibrated(inputs, tmp_path_factory) -> tuple[ScoreResult, Path]:
    """A calibrated run whose strict DRF threshold excludes some protocols."""
    out = tmp_path_factory.mktemp("calibrated")
    adata, predictions = inputs
    result = score(
        adata,
        predictions,
        protocols=PROTOCOLS,
        thresholds=Thresholds(drf_min=0.95),
        # 8 perturbations: below the default minimum of 10, so lowered to keep protocols.
        min_perturbations=4,
        out=out,
        progress=False,
    )
    return result, out


@pytest.fixture(scope="module")
def plain(inputs, tmp_path_factory) -> tuple[ScoreResult, Path]:
    """A plain run (truth = all cells) written over stale calibration figures."""
    out = tmp_path_factory.mktemp("plain")
    (out / "figures").mkdir()
    for suffix in (".png", ".svg"):
        (out / "figures" / f"calibration{suffix}").write_bytes(b"stale")
    adata, predictions = inputs
    result = score(adata, predictions, protocols=PROTOCOLS, truth="all", out=out, progress=False)
    return result, out


# -- parsing helpers -------------------------------------------------------------------


def _split_markdown_row(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [cell.strip() for cell in cells]


def _markdown_unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The first table of the document (the headline table)."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    header = [_markdown_unescape(c) for c in _split_markdown_row(lines[0])]
    return header, [_split_markdown_row(line) for line in lines[2:]]


class _TableParser(HTMLParser):
    """Rows of cell texts of the table with a given id."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id = table_id
        self.inside = False
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


class _AttributeParser(HTMLParser):
    """Every src and href value, and the tags seen."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.links += [value or "" for name, value in attrs if name in ("src", "href")]


def _html_table(html: str, table_id: str) -> tuple[list[str], list[list[str]]]:
    parser = _TableParser(table_id)
    parser.feed(html)
    assert parser.rows, f"no table with id {table_id}"
    return parser.rows[0], parser.rows[1:]


def _assert_matches_csv(header, rows, csv: pd.DataFrame, tolerance: float) -> None:
    assert header == list(csv.columns)
    assert len(rows) == len(csv)
    for cells, (_, expected) in zip(rows, csv.iterrows(), strict=True):
        for column, cell in zip(header, cells, strict=True):
            cell = _markdown_unescape(cell.replace("**", ""))
            value = expected[column]
            if column in TEXT_COLUMNS:
                assert cell == str(value)
            elif pd.isna(value):
                assert cell == DASH
            else:
                assert float(cell) == pytest.approx(float(value), rel=tolerance, abs=tolerance)


# -- files ---------------------------------------------------------------------------------


def test_all_report_files_are_written(calibrated):
    _, out = calibrated
    for name in ("leaderboard.md", "leaderboard.tex", "report.html", "leaderboard.csv"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "methods.md").stat().st_size > 0
    assert (out / "figures" / "per_perturbation_1.png").exists()
    for name in FIGURE_NAMES:
        png = (out / "figures" / f"{name}.png").read_bytes()
        svg = (out / "figures" / f"{name}.svg").read_text(encoding="utf-8")
        assert png.startswith(b"\x89PNG") and len(png) > 5000, name
        assert "<svg" in svg, name
    assert not list(out.rglob("*.tmp")), "temporary files left behind"


def test_per_perturbation_pages_cover_every_trusted_protocol(calibrated):
    result, out = calibrated
    from scperteval.reporting.pages import PROTOCOLS_PER_PAGE, per_perturbation_figures

    trusted = result.leaderboard.trusted
    pages = sorted((out / "figures").glob("per_perturbation_*.png"))
    assert len(pages) == -(-len(trusted) // PROTOCOLS_PER_PAGE)
    figures = per_perturbation_figures(result)
    shown = [ax.get_title() for fig in figures.values() for ax in fig.axes if ax.get_visible()]
    assert shown == trusted
    labels = {t.get_text() for t in next(iter(figures.values())).axes[0].get_yticklabels()}
    assert labels == set(result.results["perturbation"].astype(str)) - {"control"}


def test_writing_does_not_change_the_matplotlib_backend(calibrated, tmp_path):
    result, _ = calibrated
    backend = matplotlib.get_backend()
    write_reports(result, tmp_path, figures=True)
    assert matplotlib.get_backend() == backend


def test_without_figures_the_html_says_so(calibrated, tmp_path):
    result, _ = calibrated
    write_reports(result, tmp_path, figures=False)
    assert not (tmp_path / "figures").exists()
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Figures were not drawn" in html and "base64" not in html


# -- Markdown ------------------------------------------------------------------------------


def test_markdown_table_equals_leaderboard_csv(calibrated):
    _, out = calibrated
    header, rows = _markdown_table((out / "leaderboard.md").read_text(encoding="utf-8"))
    _assert_matches_csv(header, rows, pd.read_csv(out / "leaderboard.csv"), 5e-3)


def test_markdown_bold_marks_each_columns_best(calibrated):
    result, out = calibrated
    board = result.leaderboard
    header, rows = _markdown_table((out / "leaderboard.md").read_text(encoding="utf-8"))
    best = board.best_per_column()
    ranked = board.table[(board.table["listing"] == "ranked") & (board.table["flags"] == "none")]
    scores = ["score", *(c for c in ("vcc_score", "population_score") if c in ranked)]
    assert set(best) == {*scores, *board.protocols} - {
        p for p in [*scores, *board.protocols] if ranked[p].isna().all()
    }
    for j, column in enumerate(header):
        bold = [i for i, cells in enumerate(rows) if cells[j].startswith("**")]
        if column in best:
            expected = np.flatnonzero(board.table[column].to_numpy(dtype=float) == best[column])
            assert bold == expected.tolist(), column
        else:
            assert bold == [], column


def test_markdown_names_trusted_excluded_and_pseudobulk(calibrated):
    result, out = calibrated
    board = result.leaderboard
    text = (out / "leaderboard.md").read_text(encoding="utf-8")
    assert board.excluded, "the strict DRF threshold should exclude protocols"
    trusted_line = next(line for line in text.splitlines() if "used by `score`" in line)
    listed = trusted_line.split(": ", 1)[1].rstrip(".").split(", ")
    assert listed == board.trusted
    for protocol, reason in board.excluded.items():
        line = next(line for line in text.splitlines() if line.startswith(f"- {protocol}: "))
        assert line.startswith(f"- {protocol}: not trusted") and reason in line
    assert "BDS (bound discrimination score)" in text and "DRF (dynamic range fraction)" in text
    pb_line = next(line for line in text.splitlines() if line.startswith("- pb:"))
    assert "pseudobulk" in pb_line and "population protocols were skipped" in pb_line
    assert "energy_pca" in pb_line
    good = next(line for line in text.splitlines() if line.startswith("- good:"))
    assert "covers 100% of" in good


def test_markdown_escape_keeps_the_table_intact(calibrated, tmp_path):
    result, _ = calibrated
    odd = "a|b<i>_c*"
    table = result.leaderboard.table.copy()
    table.loc[0, "model"] = odd
    board = dataclasses.replace(result.leaderboard, table=table)
    write_reports(dataclasses.replace(result, leaderboard=board), tmp_path, figures=False)
    header, rows = _markdown_table((tmp_path / "leaderboard.md").read_text(encoding="utf-8"))
    assert all(len(cells) == len(header) for cells in rows)
    assert _markdown_unescape(rows[0][0]) == odd
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "b<i>" not in html and "a|b&lt;i&gt;_c*" in html
    tex = (tmp_path / "leaderboard.tex").read_text(encoding="utf-8")
    assert r"a\textbar{}b\textless{}i\textgreater{}\_c*" in tex
    assert markdown_escape("pearson_delta_ctrl") == "pearson_delta_ctrl"
    assert markdown_escape("_x_") == r"\_x\_"


# -- LaTeX -----------------------------------------------------------------------------------


def test_latex_table_escapes_names_and_bolds_the_best(calibrated):
    result, out = calibrated
    board = result.leaderboard
    tex = (out / "leaderboard.tex").read_text(encoding="utf-8")
    assert "\\begin{tabular}" in tex and "\\toprule" in tex and "\\bottomrule" in tex
    assert "pearson\\_delta\\_ctrl" in tex and "technical\\_duplicate" in tex
    body = "\n".join(line for line in tex.splitlines() if not line.startswith("%"))
    assert re.search(r"(?<!\\)_", body) is None, "unescaped underscore"
    n_best = sum(
        int((board.table[c].to_numpy(dtype=float) == v).sum())
        for c, v in board.best_per_column().items()
    )
    assert body.count("\\textbf{") == n_best
    assert body.count("\\dag") == len(board.excluded) + 1
    rows = [line for line in body.splitlines() if line.endswith("\\\\") and " & " in line]
    widths = {len(board.headline.columns) - 1, len(board.protocols) + 1}
    assert {line.count(" & ") for line in rows} == widths


def test_latex_escape_covers_special_characters():
    assert latex_escape("a_b&c%d$e#f{g}h~i^j\\") == (
        r"a\_b\&c\%d\$e\#f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}"
    )


# -- HTML ------------------------------------------------------------------------------------


def test_html_is_self_contained(calibrated):
    _, out = calibrated
    html = (out / "report.html").read_text(encoding="utf-8")
    # "http:" cannot occur inside base64 (no colon), so this finds only real links.
    assert "http:" not in html.lower() and "https:" not in html.lower()
    parser = _AttributeParser()
    parser.feed(html)
    assert all(link.startswith(("data:", "#")) for link in parser.links)
    assert not parser.tags & {"script", "link", "iframe", "object"}
    drawn = len(list((out / "figures").glob("*.png")))
    assert drawn > len(FIGURE_NAMES)
    assert html.count('src="data:image/png;base64,') == drawn
    assert "<title>scperteval report</title>" in html and "<h1>scperteval report</h1>" in html


def test_html_leaderboard_equals_leaderboard_csv(calibrated):
    _, out = calibrated
    html = (out / "report.html").read_text(encoding="utf-8")
    header, rows = _html_table(html, LEADERBOARD_ID)
    _assert_matches_csv(header, rows, pd.read_csv(out / "leaderboard.csv"), 5e-3)


def test_html_shows_run_info_exclusions_calibration_and_tests(calibrated):
    result, out = calibrated
    html = (out / "report.html").read_text(encoding="utf-8")
    for needle in (result.info["input_checksum"], "BDS &gt;= 0.75", "DRF median &gt;= 0.95"):
        assert needle in html
    for protocol, reason in result.leaderboard.excluded.items():
        assert f"<strong>{protocol}</strong> \u2020: not trusted" in html
        assert reason.replace("<", "&lt;") in html
        # The dagger the text promises is in the per-protocol table's header.
        assert f'<th class="excluded">{protocol} \u2020</th>' in html
    assert html.count('class="excluded"') >= len(result.leaderboard.excluded)
    adjusted = result.tests[["t_pvalue_adj", "wilcoxon_pvalue_adj"]].to_numpy(dtype=float)
    assert html.count('class="sig"') == int((adjusted < SIGNIFICANCE).sum()) > 0
    n_untrusted = int((~result.calibration["trusted"].astype(bool)).sum())
    assert html.count('<tr class="untrusted">') == n_untrusted > 0


# -- plain mode ------------------------------------------------------------------------------


def test_plain_mode_writes_reports_without_calibration_figures(plain):
    result, out = plain
    assert not result.leaderboard.calibrated
    for name in ("heatmap", "distributions"):
        for suffix in (".png", ".svg"):
            assert (out / "figures" / f"{name}{suffix}").exists()
    for name in ("calibration", "versus_positive"):
        assert not list((out / "figures").glob(f"{name}.*")), "stale figure kept"
    text = (out / "leaderboard.md").read_text(encoding="utf-8")
    assert result.leaderboard.definition in text and "plain scores on all truth cells" in text
    header, rows = _markdown_table(text)
    csv = pd.read_csv(out / "leaderboard.csv")
    _assert_matches_csv(header, rows, csv, 5e-3)
    html = (out / "report.html").read_text(encoding="utf-8")
    _assert_matches_csv(*_html_table(html, LEADERBOARD_ID), csv, 5e-3)
    drawn = len(list((out / "figures").glob("*.png")))
    assert "no calibration" in html and html.count("data:image/png;base64,") == drawn
    assert "\\textbf{" in (out / "leaderboard.tex").read_text(encoding="utf-8")


# -- a real browser --------------------------------------------------------------------------


def _browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_browser() is None, reason="chromium is not installed")
def test_report_renders_in_headless_chromium(calibrated, tmp_path):
    _, out = calibrated
    shot = tmp_path / "shot.png"
    command = [
        str(_browser()),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        f"--screenshot={shot}",
        "--window-size=1400,2000",
        (out / "report.html").resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert shot.exists(), done.stderr[-2000:]
    assert shot.stat().st_size > 10_000
    assert "Uncaught" not in done.stderr
