"""Sphinx configuration of mpicomm's documentation: ``python -m sphinx -W -b html docs docs/_build/html``."""

from __future__ import annotations

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(DOCS), os.path.join(DOCS, "_ext")]

import mpicomm  # noqa: E402  (after the path: the checkout's mpicomm, not an installed copy)

project = "mpicomm"
author = "the mpicomm authors"
copyright = "the mpicomm authors, BSD-3-Clause"
release = version = mpicomm.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "mpicomm_docs"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# The docs extra alone builds these pages too: without PyTorch, autodoc reads mpicomm.torch with torch mocked (the
# pages are the same; only the type names of torch's classes lose their links). CI builds both ways (.ci/run).
try:
    import torch  # noqa: F401  (autodoc imports it for mpicomm.torch anyway)

    autodoc_mock_imports: list[str] = []
except ImportError:
    autodoc_mock_imports = ["torch"]
napoleon_google_docstring = True
napoleon_numpy_docstring = True
html_theme = "alabaster"
html_title = f"mpicomm {release}"
