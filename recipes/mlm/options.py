"""The options of ``layerfusion mlm`` (standard library only, so that ``--help`` answers at once)."""

from __future__ import annotations

import argparse

from ..core.grids import DEFAULT_MLM_LR_GRIDS, describe_lr_grids
from ..core.names import METHOD_NAMES, REGIME_NAMES
from ..core.options import check_names, default_output, learning_rate, positive_int
from ..core.task_options import check_paths

HELP = "Masked-LM perplexity (WikiText-2) with a fusion method, LR selected on dev."
DESCRIPTION = """\
Masked-LM perplexity with a fusion method and a regime: the fused state replaces z_L as the
LM head's input. Each LR of the grid (--lr, else the regime's default) is one run with the
same seed, data and masks, appended as one record to OUTPUT/results.jsonl (keyed by its
settings, as the sweeps key theirs); re-running skips a run finished with the same settings
and runs it otherwise. The LR with the lowest dev (held-out) perplexity is selected, ties to
the smaller; test perplexity never chooses. The command prints the selected LR, the test
perplexity of its best dev checkpoint and every LR's, with a warning when the selected LR is
the smallest or largest of the grid; `layerfusion report` tabulates a folder's records.
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
    parser.add_argument(
        "--method",
        default="dwatt",
        help="Fusion method (default dwatt; `none` = plain last layer; `layerfusion methods` lists them).",
    )
    parser.add_argument(
        "--regime",
        default="fe",
        help="Training regime: fe, ft, lora or bitfit (default fe: frozen encoder, fusion + LM head train).",
    )
    parser.add_argument(
        "--epochs", type=positive_int, default=3, help="Epochs; LR linear from max to zero (default 3)."
    )
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
    parser.add_argument("--batch-size", type=positive_int, default=8, help="Blocks per step (paper: 8).")
    parser.add_argument(
        "--block-size", type=int, default=128, help="Tokens per block incl. [CLS]/[SEP] (128)."
    )
    parser.add_argument(
        "--mlm-probability",
        type=float,
        default=0.15,
        help="Share of tokens predicted, in (0, 1] (0.15).",
    )
    parser.add_argument(
        "--holdout",
        type=float,
        default=0.1,
        help="Without a train split: share of valid.txt held out as dev, in (0, 1), which selects the "
        "checkpoint and the LR (0.1).",
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
    parser.add_argument("--seed", type=int, default=0, help="Seed of init, order and masks (default 0).")
    parser.add_argument(
        "--output",
        default=default_output("mlm"),
        help=f"Folder of results.jsonl, one record per run (default: {default_output('mlm')}). Re-running "
        "skips a run finished with the same settings (also one of an older folder's "
        "mlm-METHOD-REGIME-lrLR.json files) and runs it otherwise.",
    )


def check(args: argparse.Namespace) -> None:
    """``mlm``: ``--method`` and ``--regime`` known, ``--data`` an existing path or a Hub name."""
    check_names("method", [args.method], METHOD_NAMES)
    check_names("regime", [args.regime], REGIME_NAMES)
    check_paths(args)
