"""Tag schemes: every NER corpus becomes IOB2 (``B-`` opens each entity, ``I-`` continues it).

* IOB1 (``I-`` opens an entity, ``B-`` only between two adjacent entities of one type): an
  ``I-X`` that does not continue an ``X`` entity becomes ``B-X``.
* BIOES / IOBES (``S-`` single, ``E-`` end) and BILOU (``U-`` unit, ``L-`` last):
  ``S-``/``U-`` become ``B-``, ``E-``/``L-`` become ``I-``.

Entities are unchanged by the conversion (the same spans and types); only the label set is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

TAG_SCHEMES = ("auto", "iob1", "iob2", "bioes", "bilou")
TAG_PATTERN = re.compile(r"O|[BIESLU]-\S+")
TAG_RULE = "O or B-/I-<type> (E-/S- of BIOES and L-/U- of BILOU are converted)"
_TO_IOB2 = {"S": "B", "U": "B", "E": "I", "L": "I"}
_FOREIGN = {"iob1": "ESLU", "iob2": "ESLU", "bioes": "LU", "bilou": "ES"}


def is_valid_tag(tag: str) -> bool:
    """``O`` or ``P-type`` with a prefix of IOB/BIOES/BILOU.

    Example:
        >>> is_valid_tag("B-PER"), is_valid_tag("PERSON")
        (True, False)
    """
    return TAG_PATTERN.fullmatch(tag) is not None


def detect_scheme(tag_sequences: Sequence[Sequence[str]]) -> str:
    """``bioes``, ``bilou`` or ``iob`` (IOB1 or IOB2, told apart by :func:`count_iob1_starts`).

    Raises:
        ValueError: Both BIOES (``E-``/``S-``) and BILOU (``L-``/``U-``) prefixes occur.

    Example:
        >>> detect_scheme([["S-PER", "O", "B-LOC", "E-LOC"]])
        'bioes'
    """
    prefixes = {tag[0] for tags in tag_sequences for tag in tags if tag != "O"}
    if prefixes & set("ES") and prefixes & set("LU"):
        raise ValueError(
            f"tags mix BIOES (E-/S-) and BILOU (L-/U-) prefixes {sorted(prefixes)}; use one scheme"
        )
    return "bioes" if prefixes & set("ES") else "bilou" if prefixes & set("LU") else "iob"


def iob1_to_iob2(tags: Sequence[str]) -> tuple[str, ...]:
    """Each ``I-X`` that does not continue an ``X`` entity opens one: ``B-X``.

    Example:
        >>> iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC"])
        ('B-PER', 'I-PER', 'B-PER', 'O', 'B-LOC')
    """
    out: list[str] = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        previous = tag
    return tuple(out)


def count_iob1_starts(tag_sequences: Sequence[Sequence[str]]) -> int:
    """Entities opened by ``I-`` (0 for IOB2 data).

    Example:
        >>> count_iob1_starts([["I-PER", "O", "B-LOC", "I-LOC"]])
        1
    """
    return sum(a != b for tags in tag_sequences for a, b in zip(tags, iob1_to_iob2(tags), strict=True))


def bioes_to_iob2(tags: Sequence[str]) -> tuple[str, ...]:
    """``S-``/``U-`` to ``B-``, ``E-``/``L-`` to ``I-`` (BIOES and BILOU).

    Example:
        >>> bioes_to_iob2(["S-PER", "O", "B-LOC", "I-LOC", "E-LOC"])
        ('B-PER', 'O', 'B-LOC', 'I-LOC', 'I-LOC')
    """
    return tuple(_TO_IOB2.get(tag[0], tag[0]) + tag[1:] if tag != "O" else tag for tag in tags)


def to_iob2(
    tag_sequences: Sequence[Sequence[str]], scheme: str = "auto"
) -> tuple[list[tuple[str, ...]], str]:
    """Convert every sentence's tags to IOB2; returns ``(converted, note)`` (``note`` empty if unchanged).

    Args:
        tag_sequences: The tags of each sentence.
        scheme: One of :data:`TAG_SCHEMES`. ``auto`` detects BIOES/BILOU by their prefixes and
            converts IOB1 (entities opened by ``I-``); ``iob2`` converts nothing; ``iob1``,
            ``bioes`` and ``bilou`` convert and refuse prefixes of another scheme.

    Raises:
        ValueError: Unknown scheme, or tags that do not belong to it.

    Example:
        >>> to_iob2([["I-PER", "O"]])
        ([('B-PER', 'O')], 'IOB1 tags normalised to IOB2: 1 entity opened by I- now open with B-')
    """
    if scheme not in TAG_SCHEMES:
        raise ValueError(f"--tag-scheme {scheme!r}: expected one of {', '.join(TAG_SCHEMES)}")
    detected = detect_scheme(tag_sequences)
    foreign = _FOREIGN.get(scheme, "")
    stray = sorted({tag for tags in tag_sequences for tag in tags if tag != "O" and tag[0] in foreign})
    if stray:
        raise ValueError(f"--tag-scheme {scheme}: tags {stray[:5]} do not belong to {scheme.upper()}")
    sequences = [tuple(tags) for tags in tag_sequences]
    if scheme == "iob2":
        return sequences, ""
    if detected in ("bioes", "bilou"):
        converted = [bioes_to_iob2(tags) for tags in sequences]
        note = f"{detected.upper()} tags converted to IOB2 (S-/U- to B-, E-/L- to I-)"
        starts = count_iob1_starts(converted)
        if starts:
            note += f"; {starts} entities opened by I- now open with B-"
        return [iob1_to_iob2(tags) for tags in converted], note
    starts = count_iob1_starts(sequences)
    if not starts:
        return sequences, ""
    entity = "entity" if starts == 1 else "entities"
    note = f"IOB1 tags normalised to IOB2: {starts} {entity} opened by I- now open with B-"
    return [iob1_to_iob2(tags) for tags in sequences], note
