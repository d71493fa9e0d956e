"""The result of scoring models: tables, leaderboard, run record, and how they are written."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd

from scperteval.engine.calibrators import Thresholds
from scperteval.engine.failures import failure_counts
from scperteval.reporting import write_reports
from scperteval.runinfo import write_run_json, write_tables
from scperteval.scoring.derive import Derived

__all__ = ["PROTOCOL_FILE", "RESULT_FILE", "RUN_FILE", "ScoreResult"]

PAIRS_FILE = "pairwise_tests.csv"
WINS_FILE = "win_tie_loss.csv"
PROTOCOL_SCORES_FILE = "leaderboard_protocols.csv"

#: Tables of a run under a split, by file (written only under a split).
SPLIT_FILES = MappingProxyType(
    {
        "fold_scores.csv": "fold_scores",
        "leaderboard_folds.csv": "fold_summary",
        "mean_ratio.csv": "criterion",
        "verdict_changes.csv": "verdict_changes",
    }
)

RESULT_FILE = "results.parquet"
#: Under a split, the values of the protocols run for the criterion alone.
CRITERION_VALUES_FILE = "criterion_values.parquet"
RUN_FILE = "run.json"
PROTOCOL_FILE = "protocols.csv"


@dataclass
class ScoreResult:
    """Scores of models and baselines, their calibration and the leaderboard.

    Attributes
    ----------
    results
        Tidy per-perturbation values of every model, baseline and control:
        ``covariate, perturbation, protocol, source, source_name, value, reason,
        calibrated``.
    calibration
        DRF/BDS per protocol and covariate group (empty in plain mode).
    protocols
        Description of each protocol.
    aggregates
        Per protocol and entry: n, mean, median and bootstrap 95% CIs.
    leaderboard
        The :class:`~scperteval.scoring.leaderboard.Leaderboard`.
    tests
        Paired one-sided tests against the negative baselines.
    thresholds
        The trust thresholds used.
    pairs
        Two-sided paired tests of every pair of entries, per trusted protocol
        and on the headline score (:func:`~scperteval.scoring.pairwise.pairwise_tests`).
    wins
        Win/tie/loss record of each entry against each other
        (:func:`~scperteval.scoring.pairwise.win_tie_loss`).
    fold_scores
        Under a split: each fold's headline score per entry
        (:func:`~scperteval.scoring.folds.fold_scores`); empty otherwise.
    fold_summary
        Under a split: the pooled score, the folds' spread and Ahlmann-Eltze et
        al.'s criterion per entry (:func:`~scperteval.scoring.folds.fold_summary`).
    criterion
        Under a split: the error ratio to the training-mean baseline per entry and
        error protocol (:func:`~scperteval.scoring.mean_ratio.mean_ratio_table`).
    criterion_values
        Under a split: the per-perturbation values, with their fold, of the
        protocols run for the criterion alone (not ranked); kept so that
        :func:`~scperteval.workflows.report.report` rebuilds the criterion of
        pooled fold runs on them too.
    verdict_changes
        Under a split (calibrated runs): each protocol's overall verdict beside the
        one of the same data without the split
        (:func:`~scperteval.scoring.verdict_changes.verdict_changes`); empty otherwise.
    info
        Run information (data checksum, seed, options, coverage, timings).

    """

    results: pd.DataFrame
    calibration: pd.DataFrame
    protocols: pd.DataFrame
    aggregates: pd.DataFrame
    leaderboard: Any
    tests: pd.DataFrame
    thresholds: Thresholds
    info: dict[str, Any] = field(default_factory=dict)
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    wins: pd.DataFrame = field(default_factory=pd.DataFrame)
    fold_scores: pd.DataFrame = field(default_factory=pd.DataFrame)
    fold_summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    criterion: pd.DataFrame = field(default_factory=pd.DataFrame)
    verdict_changes: pd.DataFrame = field(default_factory=pd.DataFrame)
    criterion_values: pd.DataFrame = field(default_factory=pd.DataFrame)

    def _repr_html_(self) -> str:
        return str(self.leaderboard._repr_html_())

    def __repr__(self) -> str:
        return repr(self.leaderboard)

    def write(self, folder: str | Path, figures: bool = True, progress: bool | None = None) -> None:
        """Write every table, the reports and ``run.json`` into ``folder``.

        Parameters
        ----------
        folder
            Output folder.
        figures
            Draw the figures of the reports.
        progress
            Show a bar over the figures (default: when stderr is a terminal).

        """
        folder = Path(folder)
        board = self.leaderboard
        optional = {
            "calibration.csv": self.calibration,
            **{file: getattr(self, table) for file, table in SPLIT_FILES.items()},
            CRITERION_VALUES_FILE: self.criterion_values,
        }
        tables = {
            RESULT_FILE: self.results,
            PROTOCOL_FILE: self.protocols,
            "aggregates.csv": self.aggregates,
            "tests.csv": self.tests,
            PAIRS_FILE: self.pairs,
            WINS_FILE: self.wins,
            "failures.csv": failure_counts(self.results),
            "leaderboard.csv": board.headline,
            PROTOCOL_SCORES_FILE: board.table[["model", "kind", *board.protocols]],
        }
        write_tables(folder, {**tables, **{f: t for f, t in optional.items() if not t.empty}})
        write_reports(self, folder, figures=figures, progress=progress)
        write_run_json(folder / RUN_FILE, self.info.get("command", "score"), self.info)

    @classmethod
    def from_derived(
        cls,
        derived: Derived,
        protocols: pd.DataFrame,
        thresholds: Thresholds,
        info: dict[str, Any],
    ) -> ScoreResult:
        """A run's result from its derived tables (:func:`~scperteval.scoring.derive.derive`)."""
        tables = {f.name: getattr(derived, f.name) for f in fields(derived)}
        return cls(protocols=protocols, thresholds=thresholds, info=info, **tables)
