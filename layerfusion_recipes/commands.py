"""The command table of ``layerfusion``: every sub-command's help, options and handler
(:data:`COMMANDS`), standard library only.

:mod:`layerfusion_recipes.cli` (the entry point) builds its parser from it. A handler is a
``"module:function"`` string, imported only when its command runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from . import arguments
from .classify import options as classify_options
from .mlm import options as mlm_options
from .ner import options as ner_options
from .seq2seq import options as seq2seq_options


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
    """

    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: str
    check: Callable[[argparse.Namespace], None] | None = None

    def run(self, args: argparse.Namespace) -> int | None:
        if self.check is not None:
            self.check(args)
        module, _, function = self.handler.partition(":")
        return getattr(importlib.import_module(module), function)(args)


def task_command(options: ModuleType, handler: str) -> Command:
    """A task's command from its folder's ``options`` module (standard library only): its ``HELP``,
    ``DESCRIPTION``, ``add_arguments`` and ``check``; ``handler`` as :class:`Command`'s,
    ``"module:function"`` relative to the task's folder.

    Example:
        >>> task_command(classify_options, "command:classify_main").handler
        'layerfusion_recipes.classify.command:classify_main'
    """
    folder = options.__name__.rpartition(".")[0]  # layerfusion_recipes.<task>
    return Command(
        options.HELP, options.DESCRIPTION, options.add_arguments, f"{folder}.{handler}", options.check
    )


def _methods_arguments(parser: argparse.ArgumentParser) -> None:
    """``layerfusion methods`` takes no option."""


COMMANDS: dict[str, Command] = {
    "ner": task_command(ner_options, "command:ner_main"),
    "sweep": Command(
        "Grid of few-shot NER runs (methods x regimes x shots x epochs x trials x LRs), resumable.",
        "A grid of NER cells from a YAML file (--config) or flags, each at every LR of its grid; "
        "resumable, one record per run, --workers processes, --select-trials for uncached regimes.",
        ner_options.add_arguments,
        "layerfusion_recipes.ner.command:sweep_main",
        ner_options.check,
    ),
    "classify": task_command(classify_options, "command:classify_main"),
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
        "markers) from the summaries of the published experiments (benchmarks/summaries/NAME.json); "
        "the prose around them is kept. --check prints a diff and exits 1 instead of writing.",
        arguments.add_report_arguments,
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
    "mlm": task_command(mlm_options, "command:mlm_main"),
    "seq2seq": task_command(seq2seq_options, "command:seq2seq_main"),
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
