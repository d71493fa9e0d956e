"""Reports of a scored run: Markdown, LaTeX, figures and a self-contained HTML page.

:func:`write_reports` writes, into a run's output folder:

- ``leaderboard.md``: the leaderboard with the best value of each column in
  bold, the trusted and excluded protocols and notes on the models' coverage;
- ``leaderboard.tex``: the same table as a LaTeX ``booktabs`` tabular;
- ``figures/*.png`` and ``figures/*.svg``: a heatmap of the leaderboard, the
  protocols' calibration (DRF and BDS), per-perturbation score distributions
  and models against the positive control (calibration figures only in
  calibrated mode);
- ``report.html``: all of the above in one file with no external resource.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from scperteval.reporting.html import html_report
from scperteval.reporting.tables import latex_table, markdown_report
from scperteval.runinfo import write_atomic

__all__ = ["write_reports", "FIGURE_NAMES", "FIGURE_FOLDER"]

FIGURE_FOLDER = "figures"
FIGURE_NAMES = ("heatmap", "calibration", "distributions", "versus_positive")


def _writer(data: str | bytes) -> Any:
    def write(path: Path) -> None:
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")

    return write


def _write_figures(result: Any, folder: Path) -> dict[str, tuple[bytes, str]]:
    from scperteval.reporting.figures import FIGURES, draw_figures, render

    images: dict[str, tuple[bytes, str]] = {}
    target = folder / FIGURE_FOLDER
    drawn = draw_figures(result)
    for name, figure in drawn.items():
        png, svg = render(figure)
        write_atomic(target / f"{name}.png", _writer(png))
        write_atomic(target / f"{name}.svg", _writer(svg))
        images[name] = (png, FIGURES[name])
    for name in FIGURE_NAMES:
        if name not in drawn:
            for suffix in (".png", ".svg"):
                (target / f"{name}{suffix}").unlink(missing_ok=True)
    return images


def write_reports(result: Any, folder: str | Path, figures: bool = True) -> None:
    """Write the Markdown, LaTeX and HTML reports (and figures) of a scored run.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.
    folder
        Output folder (created if needed). Each file is written atomically.
    figures
        Draw the figures into ``folder/figures`` (PNG and SVG) and embed them
        in ``report.html``. Figures a run cannot support (calibration figures
        in plain mode) are skipped and stale copies removed.

    """
    folder = Path(folder)
    created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    write_atomic(folder / "leaderboard.md", _writer(markdown_report(result, created)))
    write_atomic(folder / "leaderboard.tex", _writer(latex_table(result.leaderboard)))
    images = _write_figures(result, folder) if figures else {}
    write_atomic(folder / "report.html", _writer(html_report(result, images, created)))
