"""Sphinx configuration of the scperteval documentation.

Build with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``
(``pip install -e ".[docs]"`` first). Nothing is downloaded and no notebook is
executed during the build.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import scperteval

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

# -- Project -------------------------------------------------------------------------

project = "scperteval"
author = "scperteval contributors"
copyright = "scperteval contributors"
release = scperteval.__version__
version = ".".join(release.split(".")[:2])

# -- General -------------------------------------------------------------------------

extensions = [
    "myst_nb",  # MyST markdown and notebooks (includes myst_parser)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinxcontrib.autoprogram",
]
# ".rst" first: autosummary writes its generated API pages in reStructuredText.
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
templates_path = ["_templates"]
# docs/calibration/ holds result tables (csv, json, txt), not pages.
exclude_patterns = ["_build", "calibration", "Thumbs.db", ".DS_Store"]

# -- MyST and notebooks --------------------------------------------------------------

myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
# The notebooks are stored without outputs and are not executed here: the test suite
# runs them (tests/test_notebooks.py), and the rendered pages show the code and text.
nb_execution_mode = "off"

# -- API reference -------------------------------------------------------------------

autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
# Shown by name: expanded, the alias's ``numpy.str_`` reads as a reST reference.
autodoc_type_aliases = {"FeatureNames": "scperteval.metrics.metric_context.FeatureNames"}
napoleon_google_docstring = False
napoleon_numpy_docstring = True
# "Attributes" sections become fields of the class, so that a dataclass field listed
# there is not documented twice.
napoleon_use_ivar = True
napoleon_use_rtype = False

# -- HTML ----------------------------------------------------------------------------

html_theme = "furo"
html_title = f"scperteval {release}"
html_static_path: list[str] = []
html_show_sourcelink = False

# -- Notebooks: copied from the repository's notebooks/ folder -----------------------

NOTEBOOK_SOURCE = ROOT / "notebooks"
NOTEBOOK_TARGET = DOCS / "notebooks"  # generated; ignored by git


def _copy_notebooks() -> None:
    """Mirror ``notebooks/*.ipynb`` into ``docs/notebooks/`` (kept in step with the source)."""
    NOTEBOOK_TARGET.mkdir(exist_ok=True)
    wanted = {path.name for path in NOTEBOOK_SOURCE.glob("*.ipynb")}
    for stale in NOTEBOOK_TARGET.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()
    for name in sorted(wanted):
        shutil.copy2(NOTEBOOK_SOURCE / name, NOTEBOOK_TARGET / name)


_copy_notebooks()

# -- Pages that are not listed in index.md -------------------------------------------


def _extra_pages() -> list[str]:
    """Top-level pages of docs/ that index.md does not name (added to the navigation)."""
    named = {line.strip() for line in (DOCS / "index.md").read_text(encoding="utf-8").splitlines()}
    return sorted(p.stem for p in DOCS.glob("*.md") if p.stem != "index" and p.stem not in named)


def _add_extra_pages(app: Any, docname: str, source: list[str]) -> None:
    extra = _extra_pages()
    if docname == "index" and extra:
        entries = "\n".join(extra)
        source[0] += f"\n\n```{{toctree}}\n:hidden:\n:caption: More\n\n{entries}\n```\n"


def setup(app: Any) -> dict[str, Any]:
    """Register the hook that lists extra pages in the navigation."""
    app.connect("source-read", _add_extra_pages)
    return {"parallel_read_safe": True}
