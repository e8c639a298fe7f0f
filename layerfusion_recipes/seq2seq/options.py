"""The options of ``layerfusion seq2seq`` (standard library only, so that ``--help`` answers at once):
one flag per setting of :class:`~layerfusion_recipes.seq2seq.settings.Seq2SeqSettings`."""

from __future__ import annotations

import argparse
import pathlib
from dataclasses import asdict

from ..core.errors import DataSourceError, UserError
from ..core.options.options import learning_rate, positive_int
from .settings import DEFAULT_LEARNING_RATES, DEFAULT_SEEDS, Seq2SeqSettings

HELP = "Sentence denoising: the plain model (none) vs EncoderFusion vs SurfaceFusion (hard, soft)."
DESCRIPTION = (
    "Sentence denoising on WikiText-2 with a small encoder-decoder trained from scratch: "
    "the plain model (none) vs EncoderFusion vs SurfaceFusion (hard, soft), exact match / chrF / BLEU."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion seq2seq``: data, methods, seeds, learning rates and one flag per setting."""
    parser.add_argument(
        "--data",
        help="Folder with valid.txt (training) and test.txt, "
        "e.g. path/to/wikitext-2 (a folder of valid.txt and test.txt)",
    )
    parser.add_argument("--train-file", help="Training text (overrides --data)")
    parser.add_argument("--test-file", help="Test text (overrides --data)")
    parser.add_argument(
        "--output",
        default="runs/seq2seq",
        help="Folder for results.jsonl (one record per run; re-running skips the runs finished with the "
        "same settings and files) and results.json (the completed comparison)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        help="Compared models: none (the model alone) and the variants of the registry's seq2seq "
        "methods (encoder_fusion, surface_hard, surface_soft); default: all of them",
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=list(DEFAULT_SEEDS),
        help="Trials (one model per method and seed)",
    )
    parser.add_argument(
        "--lr", nargs="+", type=learning_rate, default=list(DEFAULT_LEARNING_RATES),
        help="AdamW max learning rates of every method; with several, each method's is selected on dev "
        "with the first seed",
    )  # fmt: skip
    for name, value in asdict(Seq2SeqSettings()).items():
        if name in ("seed", "learning_rate"):  # each run's: given by --seeds and --lr
            continue
        option = f"--{name.replace('_', '-')}"
        parser.add_argument(option, type=type(value), default=value, dest=name, help=f"(default: {value})")


def check(args: argparse.Namespace) -> None:
    """``seq2seq``: a data folder or both text files, each existing."""
    if not args.data and not (args.train_file and args.test_file):
        raise UserError("give --data DIR (valid.txt, test.txt) or --train-file and --test-file")
    paths = {"--data": args.data, "--train-file": args.train_file, "--test-file": args.test_file}
    for option, path in paths.items():
        if path and not pathlib.Path(path).exists():
            raise DataSourceError(f"{option} {path!r}: no such file or directory")
