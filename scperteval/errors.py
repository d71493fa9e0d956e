"""Exception types raised by scperteval."""

from __future__ import annotations


class ScpertevalError(Exception):
    """Base class of every error scperteval raises on purpose."""


class DatasetError(ScpertevalError, ValueError):
    """The input dataset cannot be evaluated as given (bad column, label, values)."""


class SpecError(ScpertevalError, ValueError):
    """A name or option given for a metric, protocol, space or source is invalid."""


class ClusterError(ScpertevalError):
    """A dask cluster asked for cannot be reached."""


class MissingExtraError(ScpertevalError, ImportError):
    """An optional dependency needed for the requested feature is not installed."""

    def __init__(self, feature: str, extra: str, package: str) -> None:
        super().__init__(
            f"{feature} needs the optional package '{package}'; "
            f"install it with: pip install 'scperteval[{extra}]'"
        )


class ScpertevalWarning(UserWarning):
    """Something scperteval did with the input that the user should know about."""
