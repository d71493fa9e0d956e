"""The command line's malloc arena limit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scperteval._malloc import limit_malloc_arenas


def test_an_environment_setting_is_kept(monkeypatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_limit_is_set_with_glibc(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    # In a child process, so that this test process keeps its own arenas.
    code = "from scperteval._malloc import limit_malloc_arenas as f; print(f(2), f(0))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.stdout.split() == ["True", "True"]
