"""Each method against the best single layer chosen on dev, paired by trial (issue 38's comparator).

Reads a sweep's results file and its layer probes (``RESULTS.probes.jsonl``, written by
``--probe-layers`` or ``--probe-start``) and prints, per (shots, max epochs), the Markdown table of
:func:`layerfusion_recipes.reporting.best_layer.best_layer_markdown`: each method at the LR selected
on dev against the per-trial best layer on dev, paired by trial, and guarded by it (kept only where
its dev score beats the layer's by more than one standard error). The sweeps print the same tables
when they have probes.

``--also FILE ...`` adds the methods of other results files of the same grid (same data, model, seed,
shots and trials, hence the same samples: e.g. a later sweep of one more method into its own folder);
their runs pair with the main file's by trial (its trials only), and their probes join the main file's
(a probe sweep at more LRs widens the best layer's grid: the main file's records win where both have a
(trial, LR)). A file whose runs were made again under a new setup (new data, model files or settings)
gets one table per setup, each setup's runs against its own probes.

Usage:
    python benchmarks/best_layer.py benchmarks/results/trec_fe_mean_probe_start/results.jsonl [--json OUT]
        [--also benchmarks/results/trec_fe_mean_probe_start_new/results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from layerfusion_recipes.core.probes.probes import probes_path
from layerfusion_recipes.core.sweeps.tasks import read_task_probes, read_task_records
from layerfusion_recipes.reporting.best_layer import best_layer_markdown, union_probes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="A sweep's results.jsonl (its probes file beside it).")
    parser.add_argument("--json", help="Also write the numbers here.")
    parser.add_argument("--also", nargs="+", default=[], help="Results files of more methods, same trials.")
    args = parser.parse_args(argv)
    paths = (args.results, *args.also)
    runs = {path: read_task_records(path) for path in paths}  # a probe-guided run from its newest start only
    probes = union_probes([read_task_probes(path, runs[path]) for path in paths])  # no other setup's
    trials = {(p["shots"], p["epochs"], p["trial"]) for p in probes}  # the main file's
    records = [r for path in paths for r in runs[path] if (r["shots"], r["epochs"], r["trial"]) in trials]
    if not probes:
        print(
            f"{probes_path(args.results)}: no layer probes (run the sweep with --probe-layers)",
            file=sys.stderr,
        )
        return 1
    text, numbers = best_layer_markdown(records, probes)
    print(text + "\n")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(numbers, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
