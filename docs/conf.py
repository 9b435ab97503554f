"""Sphinx configuration of llfabric's documentation: MyST Markdown pages, the PyData theme, and
reference pages generated from the code (sphinx-click for the CLI, `_ext/reference.py` for the
settings, the wire protocol and the metrics)."""

from __future__ import annotations

import sys
from importlib.metadata import version as installed_version
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]  # the code it documents, the extension

project = "llfabric"
author = "the llfabric authors"
release = version = installed_version("llfabric")

extensions = ["myst_parser", "sphinx_click", "reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # links to a page's sections by their titles' slugs
myst_enable_extensions = ["colon_fence"]
suppress_warnings = ["myst.header"]  # pages moved from the README start at ## in places
nitpicky = True

html_theme = "pydata_sphinx_theme"
html_title = "llfabric"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2,
                      # the generated tables take the page's whole width
                      "secondary_sidebar_items": {"reference/*": []}}
html_static_path: list[str] = []
