"""Reports of a scored run: Markdown, LaTeX, figures and a self-contained HTML page.

:func:`write_reports` writes, into a run's output folder:

- ``leaderboard.md``: the leaderboard with the best value of each column in
  bold, the trusted and excluded protocols and notes on the models' coverage;
- ``leaderboard.tex``: the same table as a LaTeX ``booktabs`` tabular;
- ``figures/*.png`` and ``figures/*.svg``: a heatmap of the leaderboard, the
  protocols' calibration (DRF and BDS), per-perturbation score distributions,
  models against the positive control, the win/tie/loss matrix and the
  per-perturbation scores on every trusted protocol, a page of protocols per
  ``per_perturbation_N`` figure (calibration figures only in calibrated mode);
- ``methods.md``: a methods paragraph describing the run, ready to paste;
- ``report.html``: all of the above in one file with no external resource.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scperteval.progress import progress_bar
from scperteval.reporting.formatting import created_now, write_file
from scperteval.reporting.html import PAGED_PREFIX, html_report
from scperteval.reporting.methods import methods_text
from scperteval.reporting.tables import latex_table, markdown_report

__all__ = ["write_reports", "FIGURE_NAMES", "FIGURE_FOLDER"]

FIGURE_FOLDER = "figures"
FIGURE_NAMES = ("heatmap", "calibration", "distributions", "versus_positive", "versus")


def _write_figures(
    result: Any, folder: Path, progress: bool | None = None
) -> dict[str, tuple[bytes, str]]:
    from scperteval.reporting.figures import caption, draw_figures, render

    images: dict[str, tuple[bytes, str]] = {}
    target = folder / FIGURE_FOLDER
    drawn = draw_figures(result)
    # Rendering is most of a small run's time once the protocols are scored.
    with progress_bar("figures", len(drawn), progress, "figures") as bar:
        for name, figure in drawn.items():
            # The paged per-perturbation figures are for reading, not for print: PNG only
            # (their many labels make SVG rendering several times slower).
            paged = name.startswith(PAGED_PREFIX)
            png, svg = render(figure, svg=not paged)
            write_file(target / f"{name}.png", png)
            if paged:
                (target / f"{name}.svg").unlink(missing_ok=True)
            else:
                write_file(target / f"{name}.svg", svg)
            images[name] = (png, caption(name, figure))
            bar.update(1)
    pages = [p.stem for p in target.glob(f"{PAGED_PREFIX}_*.png")] if target.is_dir() else []
    for name in [n for n in [*FIGURE_NAMES, *pages] if n not in drawn]:
        for suffix in (".png", ".svg"):
            (target / f"{name}{suffix}").unlink(missing_ok=True)
    return images


def write_reports(
    result: Any, folder: str | Path, figures: bool = True, progress: bool | None = None
) -> None:
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
    progress
        Show a bar over the figures rendered (default: when stderr is a terminal).

    """
    folder = Path(folder)
    created = created_now()
    write_file(folder / "leaderboard.md", markdown_report(result, created))
    write_file(folder / "leaderboard.tex", latex_table(result.leaderboard))
    write_file(folder / "methods.md", methods_text(result))
    images = _write_figures(result, folder, progress) if figures else {}
    write_file(folder / "report.html", html_report(result, images, created))
