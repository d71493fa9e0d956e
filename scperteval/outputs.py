"""Output folders: checked before a run starts, filled only when the run is complete.

A run writes its files into a hidden staging folder beside the output folder
(:func:`staged_output`) and moves them into place when everything is written,
so a failed, interrupted or killed run leaves the previous contents as they
were, and old and new results never mix. The files a run publishes are listed
in a small manifest in the folder; the next run into the same folder removes
those of them it does not write itself (another command's report, figures or
tables), and leaves every other file alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scperteval.errors import SpecError

__all__ = ["MANIFEST", "check_output_folder", "check_folder_owner", "staged_output"]

#: The file listing what the last run published in a folder.
MANIFEST = ".scperteval-outputs.json"


def check_output_folder(out: str | os.PathLike[str]) -> Path:
    """Check, before any work, that a run can write its results to ``out``.

    Parameters
    ----------
    out
        The output folder; it may not exist yet (it is created when the run
        publishes its results), but the nearest existing folder above it must be
        writable.

    Returns
    -------
    pathlib.Path
        ``out`` as a path.

    Raises
    ------
    SpecError
        If ``out`` is an existing file (or a device such as ``/dev/null``), or the
        folder it would go into cannot be written.

    """
    path = Path(out)
    if str(out).strip() == "":
        raise SpecError("the output folder is empty; give --out FOLDER")
    if path.exists() and not path.is_dir():
        raise SpecError(f"output folder {path} is an existing file, not a folder")
    # The results are staged beside the folder: that is where writing must work.
    parent = path.absolute().parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir() or not _can_create_in(existing):
        raise SpecError(f"cannot write to {existing}: output folder {path} is not writable")
    if path.is_dir() and not _can_create_in(path):
        # The results are published into the folder itself: it must take new files too.
        raise SpecError(
            f"cannot write into {path}: the output folder exists and is not writable; "
            "choose another --out or make it writable"
        )
    return path


#: Commands whose runs may replace one another in one folder (a report of a score
#: run is written beside it; the demo is a score run).
_KINDRED_COMMANDS = frozenset({"score", "report", "demo"})


def check_folder_owner(out: str | os.PathLike[str], command: str, overwrite: bool = False) -> None:
    """Refuse to write into a folder that holds another command's run or foreign files.

    Parameters
    ----------
    out
        The output folder.
    command
        The command about to write there (``calibrate``, ``score``, ...).
    overwrite
        Write anyway (CLI: ``--overwrite``).

    Raises
    ------
    SpecError
        If ``out`` holds the run of another command (its ``run.json`` says which),
        or files that no run wrote (not in the folder's manifest); hidden files are
        not counted.

    """
    path = Path(out)
    if overwrite or not path.is_dir():
        return
    entries = sorted(e.name for e in path.iterdir() if not e.name.startswith("."))
    recorded = _recorded_command(path)
    if recorded is None:
        foreign = entries
    else:
        if recorded != command and not {recorded, command} <= _KINDRED_COMMANDS:
            raise SpecError(
                f"output folder {path} holds the output of 'scperteval {recorded}', which "
                f"'scperteval {command}' would replace; choose another --out, or pass "
                "--overwrite"
            )
        listed = set(_manifest(path))
        foreign = [e for e in entries if listed and e not in listed and e != "run.json"]
    if foreign:
        shown = ", ".join(repr(name) for name in foreign[:5])
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise SpecError(
            f"output folder {path} holds files scperteval did not write ({shown}{more}); "
            "choose another --out, or pass --overwrite"
        )


def _recorded_command(folder: Path) -> str | None:
    """The command that wrote the run in ``folder`` (its ``run.json``), if any."""
    try:
        record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    command = record.get("command") if isinstance(record, dict) else None
    return command if isinstance(command, str) else None


def _can_create_in(folder: Path) -> bool:
    """Whether a folder can be created in ``folder`` (tried, not inferred from permissions)."""
    try:
        Path(tempfile.mkdtemp(prefix=".scperteval-check-", dir=folder)).rmdir()
    except OSError:
        return False
    return True


@contextmanager
def staged_output(out: str | os.PathLike[str]) -> Iterator[Path]:
    """A staging folder to write a run's files into; published into ``out`` on success.

    Parameters
    ----------
    out
        The output folder (see :func:`check_output_folder`).

    Yields
    ------
    pathlib.Path
        An empty hidden folder beside ``out``. When the block completes, every
        file and folder in it replaces its namesake in ``out``; when the block
        raises (or is interrupted), the staging folder is removed and ``out`` is
        left as it was.

    """
    path = check_output_folder(out)
    parent = path.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=parent))
    try:
        yield staging
        _publish(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    produced = sorted(entry.name for entry in staging.iterdir())
    previous = _manifest(out)
    for name in produced:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            # A folder (figures/) cannot be replaced in one rename: move the old one
            # aside first, so the new one is complete the moment it appears.
            aside = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=out))
            target.rename(aside / name)
            os.replace(staging / name, target)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(staging / name, target)
    for name in sorted(set(previous) - set(produced)):
        stale = out / name
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        elif stale.exists() or stale.is_symlink():
            stale.unlink()
    (out / MANIFEST).write_text(json.dumps(produced) + "\n", encoding="utf-8")


def _manifest(out: Path) -> list[str]:
    try:
        names = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    # Only plain names inside the folder, whatever the file says.
    return [n for n in names if isinstance(n, str) and n and "/" not in n and n not in (".", "..")]
