"""The options of ``layerfusion mlm`` (standard library only, so that ``--help`` answers at once)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from peft_layerfusion.names import METHOD_NAMES, REGIME_NAMES

from ..core.options.grids import DEFAULT_MLM_LR_GRIDS, describe_lr_grids
from ..core.options.options import check_names, default_output, learning_rate, positive_int
from ..core.options.task_options import check_paths

# the defaults of the options, which MlmSettings takes too (written once)
DEFAULTS: dict[str, object] = {
    "method": "dwatt",
    "regime": "fe",
    "epochs": 3,
    "batch_size": 8,
    "block_size": 128,
    "mlm_probability": 0.15,
    "holdout": 0.1,
    "seed": 0,
}

HELP = "Masked-LM perplexity (WikiText-2) with a fusion method, LR selected on dev."
DESCRIPTION = """\
Masked-LM perplexity with a fusion method and a regime: the fused state replaces z_L as the
LM head's input. Each LR of the grid (--lr, else the regime's default) is one run with the
same seed, data and masks, appended as one record to OUTPUT/results.jsonl (keyed by its
settings, as the sweeps key theirs); re-running skips a run finished with the same settings
and runs it otherwise. The LR with the lowest dev (held-out) perplexity is selected, ties to
the smaller; test perplexity never chooses. The command prints the selected LR, the test
perplexity of its best dev checkpoint and every LR's, with a warning when the selected LR is
the smallest or largest of the grid.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion mlm``: data, model, method, regime, optimisation and the LR grid."""
    parser.add_argument(
        "--data",
        required=True,
        help="Folder with valid.txt/test.txt (and train.txt if any), "
        "e.g. path/to/wikitext-2 (a folder of valid.txt and test.txt), "
        "or a Hub config such as wikitext-2-raw-v1 (online).",
    )
    parser.add_argument(
        "--model",
        help="Masked-LM model name or path (default: the demo encoder; its missing MLM head starts random).",
    )
    _with_default(
        parser, "method", str, "Fusion method; `none` = plain last layer, `layerfusion methods` lists them"
    )
    _with_default(
        parser,
        "regime",
        str,
        "Training regime: fe = frozen encoder, fusion and LM head train; ft, lora or bitfit",
    )
    _with_default(parser, "epochs", positive_int, "Epochs; LR linear from max to zero")
    parser.add_argument(
        "--lr",
        nargs="+",
        type=learning_rate,
        help="Max learning rate(s), finite and > 0. Each LR is its own run (same seed, data and masks), "
        "one record in OUTPUT/results.jsonl; the LR with the lowest dev (held-out) perplexity is "
        "selected (ties to the smaller; test perplexity never chooses) and printed, flagged when at "
        "the edge of the grid. Default: per regime "
        f"({describe_lr_grids(DEFAULT_MLM_LR_GRIDS)}). One value: no selection.",
    )
    _add_block_arguments(parser)


def _add_block_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion mlm``: batches, blocks, masking, splits, head, seed and output."""
    _with_default(parser, "batch_size", positive_int, "Blocks per step, as in the paper")
    _with_default(parser, "block_size", int, "Tokens per block incl. [CLS]/[SEP]")
    _with_default(parser, "mlm_probability", float, "Share of tokens predicted, in (0, 1]")
    _with_default(
        parser,
        "holdout",
        float,
        "Without a train split: share of valid.txt held out as dev, in (0, 1), which selects the "
        "checkpoint and the LR",
    )
    parser.add_argument(
        "--max-train-blocks", type=positive_int, help="Use at most this many training blocks (speed)."
    )
    parser.add_argument(
        "--max-eval-blocks", type=positive_int, help="Use at most this many validation/test blocks."
    )
    parser.add_argument(
        "--head-modules",
        nargs="+",
        help="LM head modules trained with the fusion (default: "
        "every top-level module outside the base model, e.g. `cls` for BERT).",
    )
    _with_default(parser, "seed", int, "Seed of init, order and masks")
    parser.add_argument(
        "--output",
        default=default_output("mlm"),
        help=f"Folder of results.jsonl, one record per run (default: {default_output('mlm')}). Re-running "
        "skips a run finished with the same settings and runs it otherwise.",
    )


def _with_default(
    parser: argparse.ArgumentParser, name: str, kind: Callable[[str], object], text: str
) -> None:
    """The option ``--NAME`` (dashes for underscores) of type ``kind``, its default from :data:`DEFAULTS`
    (said at the end of its help ``text``)."""
    default = DEFAULTS[name]
    parser.add_argument(
        f"--{name.replace('_', '-')}", type=kind, default=default, help=f"{text} (default {default})."
    )


def check(args: argparse.Namespace) -> None:
    """``mlm``: ``--method`` and ``--regime`` known, ``--data`` an existing path or a Hub name."""
    check_names("method", [args.method], METHOD_NAMES)
    check_names("regime", [args.regime], REGIME_NAMES)
    check_paths(args)
