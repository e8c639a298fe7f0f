"""The options of ``layerfusion mlm`` (standard library only, so that ``--help`` answers at once)."""

from __future__ import annotations

import argparse

from ..core.grids import DEFAULT_MLM_LR_GRIDS, describe_lr_grids
from ..core.names import METHOD_NAMES, REGIME_NAMES
from ..core.options import check_names, default_output, learning_rate, positive_int
from ..core.task_options import check_paths

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
        default=DEFAULTS["method"],
        help=f"Fusion method (default {DEFAULTS['method']}; `none` = plain last layer; "
        "`layerfusion methods` lists them).",
    )
    parser.add_argument(
        "--regime",
        default=DEFAULTS["regime"],
        help=f"Training regime: fe, ft, lora or bitfit (default {DEFAULTS['regime']}; fe: frozen encoder, "
        "fusion + LM head train).",
    )
    parser.add_argument(
        "--epochs",
        type=positive_int,
        default=DEFAULTS["epochs"],
        help=f"Epochs; LR linear from max to zero (default {DEFAULTS['epochs']}).",
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
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULTS["batch_size"],
        help=f"Blocks per step (default {DEFAULTS['batch_size']}, the paper's).",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULTS["block_size"],
        help=f"Tokens per block incl. [CLS]/[SEP] (default {DEFAULTS['block_size']}).",
    )
    parser.add_argument(
        "--mlm-probability",
        type=float,
        default=DEFAULTS["mlm_probability"],
        help=f"Share of tokens predicted, in (0, 1] (default {DEFAULTS['mlm_probability']}).",
    )
    parser.add_argument(
        "--holdout",
        type=float,
        default=DEFAULTS["holdout"],
        help="Without a train split: share of valid.txt held out as dev, in (0, 1), which selects the "
        f"checkpoint and the LR (default {DEFAULTS['holdout']}).",
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
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULTS["seed"],
        help=f"Seed of init, order and masks (default {DEFAULTS['seed']}).",
    )
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
