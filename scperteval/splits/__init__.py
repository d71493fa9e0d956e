"""Cross-validation splits of a dataset's perturbations into folds."""

from scperteval.splits.split import Split

__all__ = ["Split"]
