"""Every Python block of README.md, and of each page of the documentation (``docs/**/*.md``), runs as
written, in order, in one namespace per page (as a reader pastes them).

A block that needs what is unavailable offline (the Hub, a GPU, a data set not in the repository) is
marked by a word after the language, `` ```python not-run-offline ``; it is compiled (its syntax is
checked) but not run. There should be almost none.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_PAGES = sorted((ROOT / "docs").rglob("*.md"))
# the packages of optional extras (pyproject's `integrations`): a page importing one runs only with it
OPTIONAL_PACKAGES = ("trl", "sentence_transformers", "bitsandbytes")
NOT_RUN = "not-run-offline"  # the README's marker of a block the test only compiles
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """``(first line of the code, code, runs)`` of every fenced block whose language is ``python``."""
    blocks = []
    for match in FENCE.finditer(text):
        words = match["info"].split()
        if words and words[0] == "python":
            line = text.count("\n", 0, match.start("code")) + 1
            blocks.append((line, match["code"], NOT_RUN not in words[1:]))
    return blocks


def test_fences_are_read_as_a_markdown_reader_reads_them():
    text = "```python\na = 1\n```\nprose\n```bash\nls\n```\n```python not-run-offline\nb = 2\n```\n"
    assert python_blocks(text) == [(2, "a = 1\n", True), (9, "b = 2\n", False)]


def run_blocks(page: Path, tmp_path: Path, monkeypatch) -> list[tuple[int, str, bool]]:
    """Run the page's Python blocks in order in one namespace (a traceback names the page's line)."""
    blocks = python_blocks(page.read_text())
    monkeypatch.chdir(tmp_path)  # a block that writes a relative path writes here
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # and tempfile.mkdtemp() too
    namespace: dict = {"__name__": "__readme__"}
    for line, code, runs in blocks:
        compiled = compile(code, f"{page.relative_to(ROOT)}:{line}", "exec")
        if runs:
            exec(compiled, namespace)
    return blocks


def test_every_python_block_of_the_readme_runs_in_order(tmp_path, monkeypatch):
    blocks = run_blocks(README, tmp_path, monkeypatch)
    assert blocks, "README.md has no ```python block"
    not_run = [line for line, _, runs in blocks if not runs]
    assert 4 * len(not_run) <= len(blocks), f"almost every block must run offline; not run: {not_run}"


@pytest.mark.parametrize("page", DOC_PAGES, ids=[str(page.relative_to(ROOT / "docs")) for page in DOC_PAGES])
def test_every_python_block_of_a_documentation_page_runs_in_order(page, tmp_path, monkeypatch):
    for package in OPTIONAL_PACKAGES:  # a page on an optional extra runs where the extra is installed
        if re.search(rf"^\s*(from|import) {package}\b", page.read_text(), re.MULTILINE):
            pytest.importorskip(package, reason=f"{page.name} needs the `integrations` extra ({package})")
    blocks = run_blocks(page, tmp_path, monkeypatch)
    not_run = [line for line, _, runs in blocks if not runs]
    assert 4 * len(not_run) <= len(blocks), f"almost every block must run offline; not run: {not_run}"


def test_the_documentation_has_pages_with_code():
    assert len(DOC_PAGES) >= 20
    assert sum(bool(python_blocks(page.read_text())) for page in DOC_PAGES) >= 8


def test_no_block_writes_to_a_fixed_tmp_path():
    for page in [README, *DOC_PAGES]:
        for line, code, _ in python_blocks(page.read_text()):
            fixed = re.search(r"[\"']/tmp/", code)
            assert not fixed, f"{page.name}:{line}: use tempfile, not a fixed /tmp path"


if __name__ == "__main__":
    pytest.main([__file__])
