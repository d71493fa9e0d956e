"""Exception types raised by scperteval, and the install command their hints give."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse


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
            f"install it with: {install_command(extra)}"
        )


def install_command(extra: str, direct_url: str | None = None, cwd: Path | None = None) -> str:
    """The pip command that adds ``extra`` to scperteval as this copy was installed.

    An install from a folder (``pip install -e .`` in a checkout, or ``pip install
    PATH``) records it in the distribution's ``direct_url.json``; the extra is then
    installed from that folder, ``pip install -e ".[extra]"`` in it. Otherwise the
    package came from an index: ``pip install 'scperteval[extra]'``.

    Parameters
    ----------
    extra
        The optional dependency group (``cluster``, ``dask``, ``ot``, ...).
    direct_url
        The text of ``direct_url.json``; by default read from the installed
        distribution (none when it was installed from an index or is not installed).
    cwd
        The folder the command is run from (default: the current one), so that a
        checkout is named ``.`` from inside it.

    Returns
    -------
    str
        The command, e.g. ``pip install -e ".[cluster]"``.

    Examples
    --------
    >>> install_command("dask", '{"url": "file:///src/scperteval", '
    ...                 '"dir_info": {"editable": true}}', cwd=Path("/src/scperteval"))
    'pip install -e ".[dask]"'
    >>> install_command("dask", '{"url": "https://example.org/x.whl", "archive_info": {}}')
    "pip install 'scperteval[dask]'"

    """
    if direct_url is None:
        from importlib import metadata

        try:
            direct_url = metadata.distribution("scperteval").read_text("direct_url.json")
        except metadata.PackageNotFoundError:
            direct_url = None
    record = json.loads(direct_url) if direct_url else {}
    url = urlparse(str(record.get("url", "")))
    if url.scheme != "file" or "dir_info" not in record:
        return f"pip install 'scperteval[{extra}]'"
    folder = Path(unquote(url.path))
    here = (cwd or Path.cwd()).resolve()
    shown = "." if folder.resolve() == here else str(folder)
    editable = "-e " if record["dir_info"].get("editable") else ""
    return f'pip install {editable}"{shown}[{extra}]"'


class ScpertevalWarning(UserWarning):
    """Something scperteval did with the input that the user should know about."""
