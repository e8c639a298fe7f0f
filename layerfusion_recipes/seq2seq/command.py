"""``layerfusion seq2seq``: the comparison of its options (:func:`comparison_header`) run by
:func:`~layerfusion_recipes.seq2seq.experiment.run_comparison` (resuming its finished runs), then
``results.json`` and the summary table."""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from peft_layerfusion.utils import atomic_write_json

from ..core.options.grids import lrs_by_method
from ..core.options.options import check_names
from ..core.results.records import finished_records
from ..data.readers import read_text
from .experiment import METHOD_NAMES, RUN_TABLE_HEADER, DenoisingData, run_comparison, summary_table
from .records import RESULTS_FILE, SUMMARY_FILE, comparison_setup
from .settings import Seq2SeqSettings


def comparison_header(args: argparse.Namespace) -> dict[str, Any]:
    """What a ``layerfusion seq2seq`` comparison is, as ``results.json`` stores it: its ``settings`` (every
    option but the seed and the learning rate), ``train_file`` and ``test_file`` (``--data DIR``'s
    ``valid.txt`` and ``test.txt`` unless given), ``methods``, ``seeds`` and ``lr`` (each method's
    learning rates, :func:`~layerfusion_recipes.core.options.grids.lrs_by_method`).

    Raises:
        SystemExit: Neither ``--data`` nor both files.
        ValueError: An unknown method or a setting out of range, naming its option.

    Example:
        >>> from layerfusion_recipes.cli import build_parser
        >>> comparison_header(build_parser().parse_args(["seq2seq", "--data", "wt2"]))["train_file"]
        'wt2/valid.txt'
    """
    data_dir = Path(args.data) if args.data else None
    train_file = Path(args.train_file) if args.train_file else (data_dir / "valid.txt" if data_dir else None)
    test_file = Path(args.test_file) if args.test_file else (data_dir / "test.txt" if data_dir else None)
    if train_file is None or test_file is None:
        raise SystemExit(
            "layerfusion seq2seq: give --data DIR (valid.txt, test.txt) or --train-file and --test-file"
        )
    methods = list(args.methods or METHOD_NAMES)
    check_names("methods", methods, METHOD_NAMES)
    settings = Seq2SeqSettings.from_args(args)
    return {
        "settings": {k: v for k, v in asdict(settings).items() if k not in ("seed", "learning_rate")},
        "train_file": str(train_file), "test_file": str(test_file),
        "methods": methods, "seeds": list(args.seeds),
        "lr": {method: list(lrs) for method, lrs in lrs_by_method(args.lr, methods).items()},
    }  # fmt: skip


def seq2seq_main(args: argparse.Namespace) -> int:
    """``layerfusion seq2seq``: run the comparison (resuming its finished runs), write ``results.json``,
    print every new run, then the summary table; returns the exit code, 0."""
    header = comparison_header(args)
    settings, methods = Seq2SeqSettings.from_args(args), header["methods"]
    train_file, test_file = Path(header["train_file"]), Path(header["test_file"])
    torch.set_num_threads(args.threads)
    output = Path(args.output)
    setup = comparison_setup(header)
    results_path = output / RESULTS_FILE
    finished = finished_records(output / RESULTS_FILE)
    previous = sum(key.endswith(f"|{setup}") for key in finished)
    if previous:
        print(f"resuming: {previous} runs found in {results_path}")
    data = DenoisingData.build(read_text(train_file), read_text(test_file), settings)
    (output / SUMMARY_FILE).unlink(missing_ok=True)  # it describes another comparison; back at the end
    started = time.perf_counter()
    print(RUN_TABLE_HEADER, flush=True)
    lr = lrs_by_method(header["lr"], methods)
    results = run_comparison(data, methods, args.seeds, lr, results_path, setup, finished)
    # ru_maxrss is in KiB on Linux
    resources = {
        "seconds_this_invocation": time.perf_counter() - started,
        "seconds_all_runs": sum(r["seconds"] for r in results["runs"]),
        "cpu_seconds_all_runs": sum(r["cpu_seconds"] for r in results["runs"]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    atomic_write_json(output / SUMMARY_FILE, {**header, "complete": True, **results, "resources": resources})
    print(summary_table(results))
    print(f"results: {output / SUMMARY_FILE} (runs: {results_path})")
    return 0
