"""Every Python block of README.md runs as written, in order, in one namespace (as a reader pastes them).

A block that needs what is unavailable offline (the Hub, a GPU, a data set not in the repository) is
marked in the README by a word after the language, `` ```python not-run-offline ``; it is compiled
(its syntax is checked) but not run. There should be almost none.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
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


def test_every_python_block_of_the_readme_runs_in_order(tmp_path, monkeypatch):
    blocks = python_blocks(README.read_text())
    assert blocks, "README.md has no ```python block"
    monkeypatch.chdir(tmp_path)  # a block that writes a relative path writes here
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # and tempfile.mkdtemp() too
    namespace: dict = {"__name__": "__readme__"}
    for line, code, runs in blocks:
        compiled = compile(code, f"README.md:{line}", "exec")  # a traceback names the README's line
        if runs:
            exec(compiled, namespace)
    not_run = [line for line, _, runs in blocks if not runs]
    assert 4 * len(not_run) <= len(blocks), f"almost every block must run offline; not run: {not_run}"


def test_no_block_writes_to_a_fixed_tmp_path():
    for line, code, _ in python_blocks(README.read_text()):
        assert not re.search(r"[\"']/tmp/", code), f"README.md:{line}: use tempfile, not a fixed /tmp path"


if __name__ == "__main__":
    pytest.main([__file__])
