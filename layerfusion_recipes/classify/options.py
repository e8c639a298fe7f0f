"""The options of ``layerfusion classify`` (standard library only, so that ``--help`` answers at once):
the model, data, columns, pooling and metric, then the few-shot options every task shares
(:mod:`layerfusion_recipes.core.options.task_options`) in classification's words."""

from __future__ import annotations

import argparse

from peft_layerfusion.names import REGIME_NAMES

from ..core.errors import UserError
from ..core.options.grids import DEFAULT_EVAL_EVERY
from ..core.options.options import shots_value
from ..core.options.task_options import (
    REGIMES_HELP,
    TaskWords,
    add_few_shot_arguments,
    add_fixed_sample,
    add_length_and_limits,
    add_model_and_data,
    check_grid_names,
    check_paths,
)

HELP = "Few-shot sentence (pair) classification: every choice from the training sample (or a large dev)."
DESCRIPTION = """\
Few-shot sentence and sentence-pair classification, then a table. --data and --model are required
(the offline demo is `layerfusion ner`).

By default (--selection cv) every choice is made from each trial's N-shot sample alone by k-fold
cross-validation (--folds): the last-layer head, the block that selection picks, each fusion fitted
in closed form and the recommended recipe, scored on test; a verdict line, then one table, the
per-trial records in OUTPUT/results.jsonl, OUTPUT/summary.json and each trial's adapter. No dev
split is read. With --selection cv, trained fusions named by --methods (e.g. layer_mix dwatt) run
beside them, each with its LR and epoch (up to --epochs) chosen by cross-validation on the sample.

--selection dev (the default where --methods, --regimes, --lr, --epochs or --select-trials is given)
runs the large-dev protocol, an easier setting than a few-shot user has: N examples of each class
sampled from train (`--shots all`: the whole train split), the same sample for every method of a
trial; AdamW with the LR linear to zero over max epochs; dev accuracy (--metric macro_f1: macro-F1)
every k epochs. Every cell trains each LR of its grid; the LR is selected on dev and the table
reports the test accuracy and macro-F1 of each run's best dev epoch (mean and 95% t-CI over trials),
paired differences between methods. Without a dev split, dev is cut from train (said on stderr).
Results go to OUTPUT/results.jsonl (resumable), a line per invocation to OUTPUT/sweeps.jsonl,
OUTPUT/table.md and PNG figures. FE cells train on the feature cache. `accelerate launch -m
layerfusion_recipes.cli classify ...` divides the runs among processes.
"""


CLASSIFY_WORDS = TaskWords(
    examples="example",
    score="dev score of --metric (accuracy or macro-F1)",
    test="test accuracy and macro-F1",
    eval_every="Evaluate on dev every k epochs (and after the last); each run keeps its best dev epoch. "
    f"Default: {DEFAULT_EVAL_EVERY} (scoring dev is most of a cached run's time).",
    batch="Examples per step. Default: 8.",
    head="Head modules trained with the fusion (peft modules_to_save); default: the modules the "
    "checkpoint lacks (the new head: BERT's classifier, a decoder's score).",
    methods="Fusion methods: `none` (the model's own head on the last layer) or any encoder method "
    "registered in peft_layerfusion (`layerfusion methods` lists them; `extra_layers` is R+n). "
    "Default: every trained one (not the presets fitted in closed form).",
    regimes=f"{REGIMES_HELP}. Default: fe.",
    shots="N examples of each class sampled from train per trial (stratified; every method of a trial "
    "trains on the same sample; a class with fewer than N is taken whole, said on stderr once), or `all`: "
    "the whole train split. Default: 8 32.",
    shots_type=shots_value,
    epochs="Max epochs. Default: 30.",
    trials="Trials per cell, each with a new seed and sample. Default: 3.",
    task="classify",
)


DATA_HELP = (
    "Required. A datasets save_to_disk folder; a folder of train/dev (val, valid, validation)/test "
    "files; or one file (cut 60/20/20 with seed 0). Files: .csv, .tsv/.txt (TAB, header line, no "
    "quoting: GLUE's layout), .jsonl/.json, .parquet, .arrow. Or a Hub name (online only). Without a "
    "dev split, dev is cut from train (20%%, seed 0) and said on stderr."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion classify``: model, data, columns, pooling, metric, then the shared few-shot options."""
    data = add_model_and_data(parser, "Required.", DATA_HELP)
    data.add_argument(
        "--text-column",
        help="Text column (default: a pair by convention, e.g. premise/hypothesis, sentence1/sentence2, "
        "question/sentence, title/body; else text, sentence, content, review, ...).",
    )
    data.add_argument("--text-pair-column", help="Second text of a sentence pair (default: by convention).")
    data.add_argument(
        "--label-column",
        help="Label column, ids or names (default: label, labels, class, category or target, else the one "
        "column ending in `label`). The label set is taken from train, in a stable order.",
    )
    add_length_and_limits(
        data,
        dev="Evaluate on N dev examples drawn with seed 0 (default: all).",
        test="Score N test examples drawn with seed 0 (default: all).",
    )
    data.add_argument(
        "--pooling",
        choices=("model", "mean"),
        help="model: the model's own sequence-classification head (first token / pooler for BERT-like "
        "encoders, last real token for decoders); mean: the mean over the real tokens, then a linear "
        "head. Default: model.",
    )
    data.add_argument(
        "--metric",
        choices=("accuracy", "macro_f1"),
        help="The dev metric that picks each run's best epoch and each cell's LR (both are reported on "
        "test). Default: accuracy.",
    )
    add_fixed_sample(parser)
    add_few_shot_arguments(parser, CLASSIFY_WORDS)


def check(args: argparse.Namespace) -> None:
    """``classify``: the method and regime names, ``--data`` given (or in ``--config``), an existing
    path or a Hub name; ``--config`` a file."""
    check_grid_names(args, REGIME_NAMES)
    if not args.data and not getattr(args, "config", None):
        raise UserError("--data is required (a data folder, a file or a Hub name)")
    check_paths(args)
