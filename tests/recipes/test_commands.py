"""The command table: a task's entry is built from its folder's options module, and a new task needs
nothing else of the table or the plots (docs/contributing/adding-a-task.md)."""

from __future__ import annotations

import dataclasses
import types

from layerfusion_recipes.cli import build_parser
from layerfusion_recipes.commands import COMMANDS, task_command
from layerfusion_recipes.core.options.task_options import add_few_shot_arguments
from layerfusion_recipes.core.sweeps.tasks import is_sweep_task
from layerfusion_recipes.ner import options as ner_options

TASKS = ("ner", "classify", "mlm", "seq2seq")


def test_each_task_s_command_comes_from_its_own_folder():
    for task in TASKS:
        command, folder = COMMANDS[task], f"layerfusion_recipes.{task}"
        assert command.add_arguments.__module__ == command.check.__module__ == f"{folder}.options"
        assert command.handler.startswith(f"{folder}.")


def _tagging_options() -> types.ModuleType:
    """What a new task's ``options.py`` holds, as a module built here."""
    options = types.ModuleType("layerfusion_recipes.tagging.options")
    words = dataclasses.replace(ner_options.NER_WORDS, task="tagging")

    def add_arguments(parser):
        parser.add_argument("--model")
        parser.add_argument("--data")
        add_few_shot_arguments(parser, words)

    options.HELP, options.DESCRIPTION = "Few-shot tagging.", "Few-shot tagging, a new task."
    options.add_arguments, options.check = add_arguments, lambda args: None
    return options


def test_a_new_task_is_its_folder_and_one_entry_of_the_table(monkeypatch):
    command = task_command(_tagging_options(), "command:tagging_main")
    assert command.handler == "layerfusion_recipes.tagging.command:tagging_main"
    assert "tagging" not in COMMANDS and is_sweep_task("tagging")
    monkeypatch.setitem(COMMANDS, "tagging", command)  # its one entry
    args = build_parser().parse_args(["tagging", "--data", "d/", "--shots", "4", "--methods", "dwatt"])
    assert (args.command, args.data, args.shots, args.methods) == ("tagging", "d/", [4], ["dwatt"])
    parser = build_parser()._subparsers._group_actions[0].choices["tagging"]
    help_text = " ".join(parser.format_help().split())
    assert "Default: ./layerfusion-results/tagging" in help_text  # its own output folder
