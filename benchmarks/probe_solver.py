"""Time and memory of a cross-validated ridge probe, this code against a checkout of the code before.

The probe of :mod:`peft_layerfusion.probing` on rows fewer than its features (the joint probe of a token
task on a decoder: every block's states side by side) decomposes each fold's problem from the rows'
inner products. Per shape ``ROWSxFEATURES`` it runs ``cross_validated_probe`` (4 folds, the default
grid) on one planted problem (``--classes`` classes, every 50th row labelled -100, rows far from the
origin, as a stream's are) in a child process per code, one after another, each child on
``--threads`` torch threads, and prints each code's seconds (the call alone) and peak RSS (the child's),
the ratios after / before, and whether the two agree: the same penalty and the out-of-fold scores within
``--tolerance``.

Usage::

    git worktree add /tmp/probe-before <commit before the change>
    python benchmarks/probe_solver.py --before-code /tmp/probe-before [--shapes 2000x11520 5000x11520] \\
        [--classes 9] [--threads 1] [--output benchmarks/results/perf/probe_solver.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CODES = ("before", "after")


def planted(rows: int, features: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (rows, features), labels)``: class means 0.3 apart in every coordinate's unit noise, an
    offset of 3 per coordinate (rows far from the origin), every 50th row labelled -100."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, classes, (rows,), generator=generator)
    offset = 3 * torch.randn(features, generator=generator)
    means = 0.3 * torch.randn(classes, features, generator=generator)
    states = torch.randn(rows, features, generator=generator) + offset + means[labels]
    labels[::50] = -100
    return states, labels


def child(shape: str, classes: int, threads: int, scores: Path) -> dict[str, float]:
    """One measurement in this process (the code on ``sys.path``): seconds, peak RSS, the penalty."""
    from peft_layerfusion.probing import cross_validated_probe

    torch.set_num_threads(threads)
    rows, features = (int(part) for part in shape.split("x"))
    states, labels = planted(rows, features, classes)
    start = time.perf_counter()
    found = cross_validated_probe(states, labels, folds=4, classes=classes)
    seconds = time.perf_counter() - start
    torch.save(found.out_of_fold_scores, scores)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux reports KiB)
    return {"seconds": seconds, "peak_rss_gb": peak / 1e9, "penalty": found.penalty}


def measure(code: Path, shape: str, args: argparse.Namespace, scores: Path) -> dict[str, float]:
    """A child process running :func:`child` with ``code``'s packages first on ``PYTHONPATH``."""
    command = [sys.executable, __file__, "--child", shape, "--classes", str(args.classes)]
    command += ["--threads", str(args.threads), "--scores", str(scores)]
    paths = [str(code), *filter(None, [os.environ.get("PYTHONPATH")])]  # no empty entry (the cwd)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> dict[str, object]:
    """Every shape under both codes; the rows of the report."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for shape in args.shapes:
            found, oof = {}, {}
            for code, folder in zip(CODES, (args.before_code, ROOT), strict=True):
                path = Path(scratch) / f"{code}.pt"
                found[code] = measure(folder, shape, args, path)
                oof[code] = torch.load(path)
            known = ~oof["after"].isnan()
            gap = (oof["after"][known] - oof["before"][known]).abs().max().item()
            rows.append(
                {
                    "shape": shape,
                    **{f"{code}_{key}": value for code in CODES for key, value in found[code].items()},
                    "time_ratio": found["after"]["seconds"] / found["before"]["seconds"],
                    "rss_ratio": found["after"]["peak_rss_gb"] / found["before"]["peak_rss_gb"],
                    "largest_score_gap": gap,
                    "agree": found["after"]["penalty"] == found["before"]["penalty"]
                    and gap <= args.tolerance,
                }
            )
            print(table([rows[-1]], header=len(rows) == 1), flush=True)
    return {"threads": args.threads, "classes": args.classes, "torch": torch.__version__, "rows": rows}


def table(rows: list[dict[str, object]], header: bool = True) -> str:
    """Markdown rows: seconds and peak RSS per code, the ratios, the agreement."""
    lines = (
        [
            "| rows x features | before s | after s | after / before | before GB | after GB "
            "| RSS after / before | largest out-of-fold gap | agree |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        if header
        else []
    )
    for row in rows:
        lines.append(
            f"| {row['shape']} | {row['before_seconds']:.1f} | {row['after_seconds']:.1f} | "
            f"{row['time_ratio']:.2f}x | {row['before_peak_rss_gb']:.2f} | {row['after_peak_rss_gb']:.2f} | "
            f"{row['rss_ratio']:.2f}x | {row['largest_score_gap']:.1e} | {'yes' if row['agree'] else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before-code", type=Path, help="Checkout of the code before (its peft_layerfusion/)."
    )
    parser.add_argument("--shapes", nargs="+", default=["2000x11520", "5000x11520"], help="ROWSxFEATURES.")
    parser.add_argument("--classes", type=int, default=9, help="Classes of the planted problem.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each child.")
    parser.add_argument("--tolerance", type=float, default=1e-9, help="Largest out-of-fold gap that agrees.")
    parser.add_argument("--output", type=Path, help="Write the report here (JSON).")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--scores", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.classes, args.threads, args.scores)))
        return
    if args.before_code is None or not (args.before_code / "peft_layerfusion").is_dir():
        parser.error(f"--before-code={args.before_code}: expected a checkout holding peft_layerfusion/")
    report = compare(args)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        temporary = args.output.with_suffix(".tmp")
        temporary.write_text(json.dumps(report, indent=1))
        temporary.replace(args.output)  # atomic: a reader never sees half a report


if __name__ == "__main__":
    main()
