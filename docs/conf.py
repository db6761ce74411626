"""Sphinx configuration for astralvessel's documentation."""

from __future__ import annotations

from importlib.metadata import version as _version

project = "astralvessel"
author = "astralvessel developers"
copyright = "2026, astralvessel developers"
release = _version("astralvessel")
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "astralvessel"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# attrs and typing produce references Sphinx cannot resolve; they are not our docs' errors.
nitpicky = False
suppress_warnings = ["myst.xref_missing"]
