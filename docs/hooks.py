"""mkdocs hooks: what the site shows from elsewhere in the repository, read at build time.

- The Results page is ``benchmarks/RESULTS.md`` as it is in the repository, with its figures. The
  file is not copied into ``docs/`` (one source of truth): :func:`on_files` adds it to the build as
  the page ``results.md``, and every PNG it links (``results/<grid>/<figure>.png``, relative to
  ``benchmarks/``) as a file at the same relative place, so its links resolve as they do on GitHub.
- The home page's table of methods is the registry's (``docs/registry_table.py``): the line
  :data:`METHODS_TABLE` of a page becomes that table (:func:`on_page_markdown`).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
# docs/registry_table.py, by path: mkdocs loads this file by path too, docs/ is no package
_spec = importlib.util.spec_from_file_location("registry_table", ROOT / "docs" / "registry_table.py")
registry_table = sys.modules.setdefault("registry_table", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(registry_table)
METHODS_TABLE = "<!-- the registry's methods: docs/hooks.py writes the table here -->"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<path>[^)\s]+\.png)\)")
# RESULTS.md names repository files in prose (`benchmarks/README.md`); links to them are none, but a
# relative link to a file outside benchmarks/results would not resolve in the site: say so early.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<path>(?!https?://|#)[^)\s]+)\)")


def results_page() -> str:
    """RESULTS.md, its relative links checked (a figure must exist, other relative links are refused),
    with a blank line before each list that follows a paragraph: GitHub starts a list there, Python
    Markdown only after a blank line."""
    text = RESULTS.read_text(encoding="utf-8")
    for match in LINK.finditer(text):
        raise ValueError(f"{RESULTS}: a relative link the site cannot resolve: {match['path']}")
    lines, fenced = [], False
    for line in text.split("\n"):
        fenced ^= line.startswith("```")
        previous = lines[-1] if lines else ""
        after_paragraph = previous.strip() and not previous.startswith(("- ", "  "))
        if not fenced and line.startswith("- ") and after_paragraph:
            lines.append("")
        lines.append(line)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    """The line :data:`METHODS_TABLE` becomes the registry's table of methods."""
    if METHODS_TABLE in markdown:
        return markdown.replace(METHODS_TABLE, registry_table.methods_table())
    return markdown


def on_page_content(html: str, page, **kwargs) -> str:
    """The Results page in a ``results-page`` block: its wide tables scroll instead of wrapping every
    cell (``docs/css/extra.css``)."""
    if page.file.src_uri == "results.md":
        return f'<div class="results-page">{html}</div>'
    return html


def on_files(files: Files, config: MkDocsConfig) -> Files:
    text = results_page()
    files.append(File.generated(config, "results.md", content=text))
    for match in IMAGE.finditer(text):
        figure = RESULTS.parent / match["path"]
        if not figure.is_file():
            raise FileNotFoundError(f"{RESULTS} shows {match['path']}, which is not in benchmarks/")
        files.append(File.generated(config, match["path"], abs_src_path=str(figure)))
    return files
