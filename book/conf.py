"""Sphinx's configuration of the course book. ``make book`` (instructor/book.py) writes the sources, with
book.json (the line every page shows), and runs Sphinx with this file and DDLCOURSE_BOOK_SRC naming them."""
import json
import os
from pathlib import Path

if "DDLCOURSE_BOOK_SRC" not in os.environ:
    raise RuntimeError("build the book with 'make book' (python -m instructor.book build), not with sphinx-build")
SRC = Path(os.environ["DDLCOURSE_BOOK_SRC"])
SITE = json.loads((SRC / "book.json").read_text(encoding="utf-8"))

project = "Distributed Deep Learning on HPC"
extensions = ["myst_nb", "sphinxcontrib.katex"]
exclude_patterns = ["_assets", "book.json", "**/.ipynb_checkpoints"]

# The notebooks come run (instructor.slides.executed_copy): MyST-NB executes nothing.
nb_execution_mode = "off"
nb_merge_streams = True
nb_ipywidgets_js = {}                  # no widget script from a CDN (the book drops the widgets' outputs)
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

# KaTeX: its script ships with sphinxcontrib-katex, its CSS and fonts with slides/vendor (copied into _assets)
katex_css_path = "katex/katex.min.css"
katex_options = "throwOnError: false"

html_theme = "sphinx_book_theme"
html_title = project
html_static_path = [str(SRC / "_assets" / "static")]
html_extra_path = [str(SRC / "_assets" / "extra")]      # slides/decks, slides/pdf, slides/vendor
html_context = {"default_mode": "light"}
html_theme_options = {
    "announcement": SITE["announcement"],
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": True,
    "use_fullscreen_button": False,
}
html_last_updated_fmt = None
