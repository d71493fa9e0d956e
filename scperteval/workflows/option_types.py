"""Types of the Python API's options, checked before any data is read.

The command line parses its options into the right types; a Python caller can pass
anything. These checks turn a value of the wrong type into one
:class:`~scperteval.errors.SpecError` naming the option and the expected type,
where it would otherwise fail deep inside the run (or, for a flag, be read by
its truth value: ``figures="no"`` is true).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

from scperteval.engine.calibrators import Thresholds
from scperteval.errors import SpecError

__all__ = ["as_thresholds", "check_option_types", "is_whole", "refuse_de_tables_under_split"]

#: The fewest cells a seeded cell sample (PCA fit, cell-level controls) may hold.
MIN_SAMPLE_CELLS = 2


def as_thresholds(thresholds: Any) -> Thresholds:
    """The trust thresholds from ``None``, a :class:`Thresholds` or a mapping of its fields.

    Parameters
    ----------
    thresholds
        ``None`` (the defaults), a :class:`~scperteval.engine.calibrators.Thresholds`,
        or a mapping such as ``{"bds_min": 0.8, "drf_min": 0.3}`` (the short
        names ``bds``, ``drf`` and ``statistic`` of ``--thresholds`` as well).

    Returns
    -------
    Thresholds
        The thresholds to judge protocols by.

    Raises
    ------
    SpecError
        For another type, or a mapping with a key that is not a field.

    """
    if thresholds is None:
        return Thresholds()
    if isinstance(thresholds, Thresholds):
        return thresholds
    if isinstance(thresholds, Mapping):
        # The short names of the command line's --thresholds are accepted too.
        aliases = {"bds": "bds_min", "drf": "drf_min", "statistic": "drf_statistic"}
        fields = ("bds_min", "drf_min", "drf_statistic")
        named = {aliases.get(str(key), str(key)): value for key, value in thresholds.items()}
        unknown = [key for key in named if key not in fields]
        if unknown:
            raise SpecError(
                f"thresholds: unknown key {unknown[0]!r}; the keys are {', '.join(fields)} "
                "(or bds, drf, statistic)"
            )
        return Thresholds(**named)
    raise SpecError(
        "thresholds must be a scperteval.Thresholds or a mapping of bds_min, drf_min "
        f"and drf_statistic, got {type(thresholds).__name__}"
    )


def check_option_types(**options: Any) -> None:
    """Refuse an option of the wrong type, naming it and the type expected.

    Parameters
    ----------
    **options
        Any of ``out`` (``None``, a string or a path), ``sample_cells`` (a whole
        number of at least 2), ``figures`` (``True`` or ``False``), ``progress``
        (``None``, ``True`` or ``False``), ``baselines`` (``True``, ``False``, a
        name or a list of names), ``aggregate`` (``"mean"`` or ``"median"``) and
        ``correction`` (``"bonferroni"`` or ``"bh"``), ``min_perturbations`` (a
        whole number of at least 1) and ``folders`` (a folder or a list of them).
        ``None`` passes for ``aggregate``, ``correction`` and ``min_perturbations``
        (the stored run's choice).

    Raises
    ------
    SpecError
        Naming the first option of the wrong type or value.

    """
    out = options.get("out")
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise SpecError(f"out must be a folder path (str or Path), got {type(out).__name__}")
    if "sample_cells" in options:
        cells = options["sample_cells"]
        if not is_whole(cells) or cells < MIN_SAMPLE_CELLS:
            raise SpecError(
                f"sample_cells must be a whole number of at least {MIN_SAMPLE_CELLS}, got {cells!r}"
            )
    for flag, allow_none in (("figures", False), ("progress", True)):
        if flag in options:
            value = options[flag]
            if not (isinstance(value, bool) or (allow_none and value is None)):
                expected = "None, True or False" if allow_none else "True or False"
                raise SpecError(f"{flag} must be {expected}, got {value!r}")
    if "baselines" in options:
        baselines = options["baselines"]
        if not (isinstance(baselines, bool) or _one_or_list(baselines, str)):
            raise SpecError(
                "baselines must be True, False, a baseline name or a list of names, "
                f"got {baselines!r}"
            )
    choices_of = {"aggregate": ("mean", "median"), "correction": ("bonferroni", "bh")}
    for option, choices in choices_of.items():
        if options.get(option) is not None and options[option] not in choices:
            raise SpecError(
                f"{option} must be {' or '.join(map(repr, choices))}, got {options[option]!r}"
            )
    least = options.get("min_perturbations")
    if least is not None and (not is_whole(least) or least < 1):
        raise SpecError(f"min_perturbations must be a whole number of at least 1, got {least!r}")
    if "folders" in options:
        folders = options["folders"]
        if not _one_or_list(folders, (str, os.PathLike)):
            raise SpecError(f"folders must be a results folder or a list of them, got {folders!r}")


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number (an integer, not ``True`` or ``False``)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _one_or_list(value: Any, kinds: type | tuple[type, ...]) -> bool:
    """Whether ``value`` is one of ``kinds``, or a list or tuple of them."""
    listed = [value] if isinstance(value, kinds) else value
    return isinstance(listed, (list, tuple)) and all(isinstance(item, kinds) for item in listed)


def refuse_de_tables_under_split(split: Any, de_tables: Any) -> None:
    """Refuse precomputed DE tables in a run under a split.

    A table holds each perturbation's DE against every other perturbed cell; under
    a split the DE is against the training perturbations of each fold, which the
    run computes from the data.

    Parameters
    ----------
    split
        The run's split, or ``None``.
    de_tables
        The run's ``de_tables`` option.

    Raises
    ------
    SpecError
        If both are given.

    """
    if split is None or de_tables is None:
        return
    one_table = isinstance(de_tables, (str, os.PathLike)) or hasattr(de_tables, "columns")
    if one_table or len(de_tables) > 0:
        raise SpecError(
            "a DE table holds DE against every other perturbation; under a split DE is "
            "tested against each fold's training perturbations, computed from the data: "
            "give the DE table or the split, not both"
        )
