"""Bad input on the command line: refused before any work, in one line, with exit code 2.

Every case is one row of :data:`CASES`: the arguments (``{data}``, ``{out}`` and
``{tmp}`` are filled in with a small generated dataset, a fresh output folder
and the test's temporary folder) and a pattern the error line must match. Each
case must exit with code 2, print exactly one ``error:`` line and no traceback,
and leave nothing at ``{out}``. A new input, option or file format adds its bad
cases here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scperteval.cli import main


@pytest.fixture(scope="module")
def small_path(tmp_path_factory) -> Path:
    from scperteval.simulation import simulate

    adata = simulate(n_perturbations=4, n_genes=30, cells_per_perturbation=12, seed=3)
    path = tmp_path_factory.mktemp("bad_input") / "small.h5ad"
    adata.write_h5ad(path)
    return path


#: (case id, arguments, pattern of the error line)
CASES: list[tuple[str, list[str], str]] = [
    (
        "missing file",
        ["calibrate", "{tmp}/absent.h5ad", "-p", "mse", "--out", "{out}"],
        r"absent\.h5ad",
    ),
    (
        "unknown protocol",
        ["calibrate", "{data}", "-p", "not_a_protocol", "--out", "{out}"],
        r"not_a_protocol",
    ),
    (
        "missing perturbation column",
        ["calibrate", "{data}", "-p", "mse", "--perturbation-key", "nope", "--out", "{out}"],
        r"perturbation column 'nope'",
    ),
    (
        "missing control label",
        ["calibrate", "{data}", "-p", "mse", "--control-label", "NT", "--out", "{out}"],
        r"control label 'NT'",
    ),
    (
        "missing layer",
        ["calibrate", "{data}", "-p", "mse", "--layer", "nope", "--out", "{out}"],
        r"layer 'nope'",
    ),
    (
        "subset without '='",
        ["calibrate", "{data}", "-p", "mse", "--subset", "A172", "--out", "{out}"],
        r"--subset expects COLUMN=VALUE",
    ),
    (
        "score without predictions",
        ["score", "{data}", "-p", "mse", "--out", "{out}"],
        r"--pred",
    ),
    (
        "prediction file absent",
        ["score", "{data}", "-p", "mse", "--pred", "m={tmp}/absent.h5ad", "--out", "{out}"],
        r"absent\.h5ad",
    ),
    (
        "float32 without a device",
        ["calibrate", "{data}", "-p", "mse", "--precision", "float32", "--out", "{out}"],
        r"float32",
    ),
    (
        "unknown DE method",
        ["de", "{data}", "--method", "magic", "--out", "{out}"],
        r"magic",
    ),
]


@pytest.mark.parametrize(
    ("arguments", "pattern"),
    [pytest.param(arguments, pattern, id=case) for case, arguments, pattern in CASES],
)
def test_bad_input_is_refused_in_one_line(small_path, tmp_path, capsys, arguments, pattern):
    out = tmp_path / "out"
    filled = [
        a.format(data=small_path, out=out, tmp=tmp_path) for a in arguments
    ]
    try:
        code = main(filled)
    except SystemExit as exc:  # argparse refuses its own errors this way
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1, captured.err
    assert re.search(pattern, errors[0]), errors[0]
    assert not out.exists()
