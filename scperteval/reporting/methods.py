"""``methods.md``: a methods paragraph describing a scored run, ready to paste into a paper."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

from scperteval._version import __version__
from scperteval.reporting.formatting import controls_of

__all__ = ["methods_text", "REFERENCES"]

REFERENCES = (
    "Miller et al. (2025). A framework for calibrating metrics of perturbation response "
    "prediction. bioRxiv 10.1101/2025.10.20.683304.",
    "Mejia et al. (2025). Diversity by Design: addressing mode collapse improves scRNA-seq "
    "perturbation modeling. arXiv 2506.22641.",
    "Vollenweider & Buhlmann (2026). Signal, Bounds, and Baselines. bioRxiv "
    "10.64898/2026.04.20.719650.",
    "Schafer et al. (2026). Evaluation protocols for perturbation response prediction. "
    "bioRxiv 10.64898/2026.07.23.740433.",
)
PACKAGES = ("numpy", "scipy", "pandas", "anndata", "matplotlib")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _controls(result: Any) -> str:
    pairs = dict.fromkeys(controls_of(result).values())
    if not pairs:
        return "the protocols' own controls"
    return "; ".join(f"{negative} (0) and {positive} (1)" for negative, positive in pairs)


def methods_text(result: Any) -> str:
    """The methods paragraph of a run.

    Parameters
    ----------
    result
        A :class:`~scperteval.scoring.result.ScoreResult`.

    Returns
    -------
    str
        Markdown: data (cells, perturbations, covariates, checksum), protocols
        and which were trusted, controls, seed, trust thresholds, aggregation,
        tests and their correction, package versions and references.

    """
    info = result.info
    board = result.leaderboard
    thresholds = result.thresholds
    covariates = info.get("covariates") or []
    n_protocols = len(board.protocols)
    covariate_text = (
        f"{len(covariates)} covariate groups ({', '.join(map(str, covariates))})"
        if len(covariates) > 1
        else "one covariate group"
    )
    trusted = ", ".join(board.trusted) or "none"
    lines = ["# Methods", ""]
    data = (
        f"Predictions were evaluated with scperteval {__version__} on "
        f"{info.get('n_cells', 'an unrecorded number of')} cells and "
        f"{info.get('n_perturbations', 'an unrecorded number of')} perturbations in "
        f"{covariate_text} ({info.get('n_genes', '?')} genes; input checksum "
        f"{info.get('input_checksum', 'unknown')})."
    )
    if not board.calibrated:
        lines.append(
            data + f" Each of {n_protocols} protocols scored the predictions against all cells "
            f"of each perturbation (no calibration); models were ranked by {board.definition}. "
            f"Seed {info.get('seed', 0)}."
        )
    else:
        lines.append(
            data + " The cells of each perturbation were split at random (seed "
            f"{info.get('seed', 0)}) into a truth half and a technical duplicate. Each of "
            f"{n_protocols} protocols (metric x representation x reference) scored every model "
            f"and baseline against the truth half, together with a negative and a positive "
            f"control ({_controls(result)}); a model's per-perturbation score was expressed "
            "as c = (s_model - s_neg) / (s_pos - s_neg), so that 0 is the negative and 1 the "
            "positive control (Miller et al. 2025)."
        )
        lines += [
            "",
            "A protocol was trusted on this dataset when its bound discrimination score (BDS: "
            "the fraction of perturbations on which the positive control beats the negative "
            f"one; Vollenweider & Buhlmann 2026) was at least {thresholds.bds_min}, its "
            f"{thresholds.drf_statistic} dynamic range fraction (DRF: the share of the room "
            "between the negative control and a perfect score covered by the positive control; "
            f"Miller et al. 2025) at least {thresholds.drf_min}, and it was scored on at least "
            f"{info.get('min_perturbations', 10)} perturbations with both controls defined. "
            f"{len(board.trusted)} of {n_protocols} protocols were trusted: {trusted}.",
            "",
            f"Models were ranked by the headline {board.definition}. Entries covering fewer "
            "perturbations or trusted protocols than the others were listed apart, with the "
            "rank they would take among the ranked entries on their own coverage. "
            "Every pair of entries was compared on each trusted protocol and on the "
            "per-perturbation median calibrated score with two-sided paired t-tests and "
            "Wilcoxon signed-rank tests over perturbations, "
            f"{info.get('correction', 'bonferroni')}-corrected over all pairs within each "
            "protocol; a win is a corrected Wilcoxon p < 0.05. Predictions were checked for "
            "mode collapse (the spread of predicted profiles across perturbations below 2% of "
            "the truth's) and leakage (predicted cells identical to the truth's).",
        ]
    software = [f"scperteval {__version__}", f"Python {platform.python_version()}"]
    software += [f"{name} {_version(name)}" for name in PACKAGES]
    lines += ["", f"Software: {', '.join(software)}.", "", "## References", ""]
    lines += [f"- {reference}" for reference in REFERENCES]
    return "\n".join(lines) + "\n"
