"""Tag schemes: every span-tagged corpus becomes IOB2 (``B-`` opens each entity, ``I-`` continues it).

* IOB1 (``I-`` opens an entity, ``B-`` only between two adjacent entities of one type): an
  ``I-X`` that does not continue an ``X`` entity becomes ``B-X``.
* BIOES / IOBES (``S-`` single, ``E-`` end) and BILOU (``U-`` unit, ``L-`` last):
  ``S-``/``U-`` become ``B-``, ``E-``/``L-`` become ``I-``.

Entities are unchanged by the conversion (the same spans and types); only the label set is.

A tag set is spans (every tag ``O`` or a scheme's prefix and a type: NER, chunks, scored by span F1) or
plain (any other tag is its own class: part-of-speech tags ``NN``, ``VBZ``, scored by token accuracy,
never converted): :func:`tag_set_kind`. One set never mixes both (:func:`foreign_tags`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

TAG_SCHEMES = ("auto", "iob1", "iob2", "bioes", "bilou")
TAG_PATTERN = re.compile(r"O|[BIESLU]-\S+")
TAG_RULE = "O or B-/I-<type> (E-/S- of BIOES and L-/U- of BILOU are converted)"
SPANS, PLAIN = "spans", "plain"  # the two kinds of tag set (tag_set_kind)
_TO_IOB2 = {"S": "B", "U": "B", "E": "I", "L": "I"}
_FOREIGN = {"iob1": "ESLU", "iob2": "ESLU", "bioes": "LU", "bilou": "ES"}


def is_valid_tag(tag: str) -> bool:
    """``O`` or ``P-type`` with a prefix of IOB/BIOES/BILOU.

    Example:
        >>> is_valid_tag("B-PER"), is_valid_tag("PERSON")
        (True, False)
    """
    return TAG_PATTERN.fullmatch(tag) is not None


def is_span_tag(tag: str) -> bool:
    """A tag that marks a span: a scheme's prefix and a type (``B-PER``), not ``O``.

    Example:
        >>> is_span_tag("B-PER"), is_span_tag("O"), is_span_tag("NN")
        (True, False, False)
    """
    return tag != "O" and is_valid_tag(tag)


def tag_set_kind(tags: Iterable[str]) -> str:
    """:data:`SPANS` where every tag is ``O`` or prefixed (``B-``/``I-``/``E-``/``S-``/``L-``/``U-`` and a
    type: scored by span F1), else :data:`PLAIN` (part-of-speech tags: scored by token accuracy).

    Example:
        >>> tag_set_kind(["O", "B-NP", "I-NP"]), tag_set_kind(["NN", "VBZ", "."])
        ('spans', 'plain')
    """
    return SPANS if all(is_valid_tag(tag) for tag in tags) else PLAIN


def foreign_tags(tags: Iterable[str]) -> tuple[set[str], str]:
    """Where ``tags`` (every occurrence) mix span tags (``B-PER``) and plain tags (``NN``): the tags of the
    rarer kind and one tag of the other, for the message; ``(set(), "")`` where they do not mix.

    Example:
        >>> foreign_tags(["B-PER", "I-PER", "O", "PERSON"])
        ({'PERSON'}, 'B-PER')
    """
    counts = Counter(tag for tag in tags if tag != "O")
    spans = {tag: n for tag, n in counts.items() if is_valid_tag(tag)}
    plain = {tag: n for tag, n in counts.items() if tag not in spans}
    if not spans or not plain:
        return set(), ""
    rare, common = (spans, plain) if sum(spans.values()) < sum(plain.values()) else (plain, spans)
    return set(rare), max(common, key=common.__getitem__)


def mixed_tag_problem(tag: str, other: str) -> str:
    """Why ``tag`` cannot join a tag set whose other tags are of ``other``'s kind.

    Example:
        >>> mixed_tag_problem("PERSON", "B-PER")
        "tag 'PERSON' is not O or B-/I-<type> (...) like the other tags (e.g. 'B-PER')"
    """
    if is_valid_tag(tag):
        return (
            f"tag {tag!r} is a span tag among plain tags (e.g. {other!r}): a tag set is either spans "
            "(O, B-/I-<type>: span F1) or plain tags (e.g. part of speech: token accuracy)"
        )
    return f"tag {tag!r} is not {TAG_RULE} like the other tags (e.g. {other!r})"


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
