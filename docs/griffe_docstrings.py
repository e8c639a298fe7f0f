"""A griffe extension: the docstrings as the site's Markdown reads them, the source files untouched.

- The method modules write their formulas as reStructuredText ``.. math::`` blocks (as Sphinx and
  ``help()`` read them). The site's Markdown knows ``$$ ... $$`` (``pymdownx.arithmatex``), so each
  block is rewritten when mkdocstrings loads the docstrings. Lines with ``&`` are aligned (the
  ``aligned`` environment), as the ``.. math::`` directive aligns them.
- Sphinx roles (``:class:`~peft_layerfusion.config.DepthMixConfig```, ``:func:`...```) would show as
  written; each becomes the code name a reader of ``help()`` reads (``~``: the last part only).
- The docstrings head their examples ``Example:``; griffe's Google parser knows ``Examples:`` (an
  ``Example:`` would become a note whose ``>>>`` lines read as Markdown quotes), so it is renamed.
"""

from __future__ import annotations

import re
import textwrap

import griffe

EXAMPLE_HEADING = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")
DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*\n", re.MULTILINE)
TEXT = re.compile(r"\\text\{(?P<body>[^{}]*)\}")
LITERAL = re.compile(r"``(?P<code>[^`]+)``")


def math_text(math: str) -> str:
    r"""Each ``\text{...}`` of a formula as KaTeX reads it: a reST literal in it (````use_ffn````) in
    ``\texttt``, an underscore escaped (MathJax let a bare ``_`` in text mode pass, KaTeX refuses it).

    Example:
        >>> print(math_text(r"h \qquad \text{one FFN (``use_ffn``), a_b}"))
        h \qquad \text{one FFN (\texttt{use\_ffn}), a\_b}
    """

    def text(match: re.Match) -> str:
        body = re.sub(r"(?<!\\)_", r"\\_", match["body"])
        return "\\text{" + LITERAL.sub(lambda m: "\\texttt{" + m["code"] + "}", body) + "}"

    return TEXT.sub(text, math)


def rst_math_to_dollars(text: str) -> str:
    """Every ``.. math::`` block of ``text`` (the indented lines after it) as a ``$$`` block.

    Example:
        >>> print(rst_math_to_dollars("Per token:\\n\\n.. math::\\n\\n    h &= z_L\\n\\nSize."))
        Per token:
        <BLANKLINE>
        $$
        \\begin{aligned}
        h &= z_L
        \\end{aligned}
        $$
        <BLANKLINE>
        Size.
    """
    out, position = [], 0
    for match in DIRECTIVE.finditer(text):
        if match.start() < position:
            continue
        indent = match["indent"]
        lines = text[match.end() :].split("\n")
        body = []
        for line in lines:
            if line.strip() and not line.startswith(indent + " ") and not line.startswith(indent + "\t"):
                break
            body.append(line)
        while body and not body[-1].strip():
            body.pop()
        consumed = sum(len(line) + 1 for line in body)
        math = math_text(textwrap.dedent("\n".join(body)).strip("\n"))
        if "&" in math:
            math = "\\begin{aligned}\n" + math + "\n\\end{aligned}"
        block = "\n".join(indent + line if line else line for line in ["$$", *math.split("\n"), "$$"])
        out += [text[position : match.start()], block, "\n"]
        position = match.end() + consumed
    out.append(text[position:])
    return "".join(out)


def plain_roles(text: str) -> str:
    """Every Sphinx role of ``text`` as inline code: its target, or its last part after a ``~``.

    Example:
        >>> plain_roles("see :class:`~peft_layerfusion.config.DepthMixConfig` and :mod:`.dwatt`")
        'see `DepthMixConfig` and `.dwatt`'
    """

    def name(match: re.Match) -> str:
        target = match["target"]
        return f"`{target.rsplit('.', 1)[-1] if match['tilde'] else target}`"

    return ROLE.sub(name, text)


def site_docstring(text: str) -> str:
    """``text`` with its math blocks as ``$$`` blocks and its ``Example:`` headings as ``Examples:``.

    Example:
        >>> site_docstring("Sum.\\n\\nExample:\\n    >>> 1 + 1\\n    2")
        'Sum.\\n\\nExamples:\\n    >>> 1 + 1\\n    2'
    """
    return EXAMPLE_HEADING.sub(r"\g<indent>Examples:", plain_roles(rst_math_to_dollars(text)))


class SiteDocstrings(griffe.Extension):
    """Rewrites every docstring of a loaded package with :func:`site_docstring`."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:  # griffe 2 (on_package_loaded in 1.x)
        self._rewrite(pkg, set())

    on_package_loaded = on_package

    def _rewrite(self, obj, seen: set) -> None:
        if id(obj) in seen or getattr(obj, "is_alias", False):
            return
        seen.add(id(obj))
        if obj.docstring is not None:
            obj.docstring.value = site_docstring(obj.docstring.value)
        for member in obj.members.values():
            self._rewrite(member, seen)
