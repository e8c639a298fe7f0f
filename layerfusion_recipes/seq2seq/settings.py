"""The settings of ``layerfusion seq2seq``: one run of the comparison, every field a command-line option.

Standard library only: :mod:`layerfusion_recipes.seq2seq.options` makes one flag per field.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_LEARNING_RATES = (3e-3,)
CORRUPTIONS = ("replace", "delete", "swap", "insert", "repeat")
ARCHITECTURES = ("marian", "bart")
# what each numeric field allows: (lowest, highest, whether the lowest is allowed, whether the highest is)
INF = float("inf")
COUNTS = ("train_sentences", "dev_sentences", "test_sentences", "max_words", "vocab_size", "width", "layers")
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    **dict.fromkeys((*COUNTS, "epochs", "batch_size", "beams"), (1, INF, True, False)),
    "noise": (0.0, 1.0, True, True),  # a probability (0: the copy task)
    "dropout": (0.0, 1.0, True, False),
    "warmup": (0.0, 1.0, True, False),  # a share of the steps
    "init_std": (0.0, INF, False, False),
    "learning_rate": (0.0, INF, False, False),
}


@dataclass(frozen=True)
class Seq2SeqSettings:
    """One run of the comparison (every field is a command-line option)."""

    train_sentences: int = 12000
    dev_sentences: int = 500
    test_sentences: int = 500
    max_words: int = 10
    vocab_size: int = 1000
    noise: float = 0.15
    corruptions: str = "swap,insert,repeat"
    architecture: str = "marian"
    width: int = 64
    layers: int = 2
    init_std: float = 0.1
    dropout: float = 0.0
    epochs: int = 16
    batch_size: int = 128
    learning_rate: float = 3e-3
    warmup: float = 0.05
    beams: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name, (low, high, low_ok, high_ok) in RANGES.items():
            value = getattr(self, name)
            above = value > low or (low_ok and value == low)
            below = value < high or (high_ok and value == high)
            if not (above and below):  # NaN fails both
                option = "--lr" if name == "learning_rate" else f"--{name.replace('_', '-')}"
                if high == INF:
                    allowed = f"{'>=' if low_ok else '>'} {low:g}"
                else:
                    allowed = f"in {'[' if low_ok else '('}{low:g}, {high:g}{']' if high_ok else ')'}"
                raise ValueError(f"{option} {value!r}: must be {allowed}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture={self.architecture!r}: choose one of {', '.join(ARCHITECTURES)}")
        unknown = [kind for kind in self.corruption_kinds if kind not in CORRUPTIONS]
        if unknown or not self.corruption_kinds:
            raise ValueError(
                f"corruptions={self.corruptions!r}: give a comma-separated subset of {', '.join(CORRUPTIONS)}"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Seq2SeqSettings:
        """The settings of the parsed ``layerfusion seq2seq`` options (one flag per field; ``seed`` and
        ``learning_rate``, each run's, come from ``--seeds`` and ``--lr``).

        Example:
            >>> from layerfusion_recipes.cli import build_parser
        >>> Seq2SeqSettings.from_args(build_parser().parse_args(["seq2seq", "--epochs", "3"])).epochs
        3
        """
        names = [field.name for field in fields(cls)]
        return cls(**{name: getattr(args, name) for name in names if hasattr(args, name)})

    @property
    def corruption_kinds(self) -> tuple[str, ...]:
        """The ``corruptions`` field as a tuple, e.g. ``("swap", "insert", "repeat")``."""
        return tuple(kind.strip() for kind in self.corruptions.split(",") if kind.strip())
