"""The extras hint names the install command that fits how the package was installed."""

from __future__ import annotations

import json
from pathlib import Path

from scperteval.errors import MissingExtraError, install_command


def _record(url: str, **info: object) -> str:
    return json.dumps({"url": url, **info})


def test_a_checkout_installed_editable_gets_an_editable_command(tmp_path: Path) -> None:
    checkout = tmp_path / "scperteval"
    checkout.mkdir()
    record = _record(checkout.as_uri(), dir_info={"editable": True})
    assert install_command("cluster", record, cwd=checkout) == 'pip install -e ".[cluster]"'
    elsewhere = install_command("cluster", record, cwd=tmp_path)
    assert elsewhere == f'pip install -e "{checkout}[cluster]"'


def test_a_folder_installed_as_a_copy_and_an_index_install() -> None:
    copy = _record("file:///opt/src/scperteval", dir_info={})
    assert install_command("ot", copy, cwd=Path("/")) == 'pip install "/opt/src/scperteval[ot]"'
    wheel = _record("https://files.example.org/scperteval-1.0-py3-none-any.whl", archive_info={})
    assert install_command("ot", wheel) == "pip install 'scperteval[ot]'"
    assert install_command("ot", "") == "pip install 'scperteval[ot]'"


def test_the_error_uses_the_command_of_this_install() -> None:
    error = MissingExtraError("Leiden clustering", "cluster", "igraph")
    assert str(error).endswith(f"install it with: {install_command('cluster')}")
