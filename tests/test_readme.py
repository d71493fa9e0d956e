"""The README: every command in its table, a test command that works on a bare machine."""

from __future__ import annotations

import re
from pathlib import Path

from scperteval.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_every_command_is_in_the_readme_table() -> None:
    # The commands as ``scperteval --help`` lists them: four spaces, then the name.
    text = build_parser().format_help()
    listing = text[text.index("COMMAND\n") : text.index("options:")]
    commands = set(re.findall(r"^    ([a-z]+)\b", listing, flags=re.MULTILINE))
    assert {"score", "calibrate", "distances"} <= commands
    table = _section(README.read_text(encoding="utf-8"), "What is there")
    listed = set(re.findall(r"^\| `scperteval (\w+)", table, flags=re.MULTILINE))
    assert listed == commands


def test_the_quick_start_is_two_commands_that_work_without_a_cached_wheel() -> None:
    quick = _section(README.read_text(encoding="utf-8"), "Quick start")
    blocks = re.findall(r"```bash\n(.*?)```", quick, flags=re.DOTALL)
    assert len(blocks) == 2 and all(block.count("\n") == 1 for block in blocks)
    tests = blocks[1]
    assert "--index-url https://download.pytorch.org/whl/cpu" in tests
    assert tests.index("torch==") < tests.index(".[test,ot]") < tests.index("pytest")
    assert "SCPERTEVAL_DATA" in quick


def test_continuous_integration_runs_the_readme_test_command() -> None:
    quick = _section(README.read_text(encoding="utf-8"), "Quick start")
    test_command = re.findall(r"```bash\n(.*?)```", quick, flags=re.DOTALL)[1].strip()
    ci_script = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci_script.splitlines()
