"""Cross-validation splits of a dataset's perturbations into folds.

:func:`make_folds` draws a seeded K-fold split within each covariate group,
:func:`read_split` reads the user's own (a table or an ``obs`` column) and checks it
against the dataset, :func:`write_split` writes the table that ``scperteval split``
writes, and :func:`split_record` is what a run's ``run.json`` records of its split.
"""

from scperteval.splits.folds import make_folds
from scperteval.splits.reading import read_split
from scperteval.splits.split import Split
from scperteval.splits.table import split_record, split_table, write_split

__all__ = ["Split", "make_folds", "read_split", "split_record", "split_table", "write_split"]
