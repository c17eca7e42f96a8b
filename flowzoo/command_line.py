"""What every command of the ``flowzoo`` command line shares: the help format, the upper bounds of its counts, the
argparse types and actions, and :func:`run_alias`, the older ``python -m MODULE`` spelling of a subcommand.

A command module (the table in ``benchmark/cli.py`` names each) exports ``add_arguments(parser)``, which adds its
arguments, and ``run(args) -> int``, which does the work and returns the exit status; an optional ``DESCRIPTION``
is shown under the command's one-line summary on its ``--help``. ``args.command_parser`` is the command's own parser
(``args.command_parser.error(...)``: its usage and exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Sequence

from flowzoo.errors import one_line_errors

#: upper bounds of the command lines' counts: a value past them would not fit in memory or time on any machine this
#: project targets (a sample count of 10^20 was killed by the kernel, not refused), so argparse refuses it with the
#: usage
MAX_BATCH = 65_536  # samples, images or prompts in one go
MAX_SAMPLING_STEPS = 10_000
MAX_REPEATS = 10_000
MAX_LORA_RANK = 4_096
MAX_THREADS = 1_024


def at_most(high: int):
    """An argparse type: an integer <= ``high`` (lower bounds are checked by each command with its own message)."""
    def parse(text: str) -> int:
        value = int(text)  # ValueError: argparse's "invalid parse value" line
        if value > high:
            raise argparse.ArgumentTypeError(f"{value} is above the maximum {high}")
        return value
    parse.__name__ = "int"
    return parse


class HelpFormat(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions keep their line breaks; an option's help ends with ``(default: X)`` unless the default is None,
    False or empty (its help then says what happens without it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


class RegistryNames:
    """A registry's names in a help text (``%(name)s``), read from ``module.names()`` only when the help is shown, so
    building the parser imports nothing heavy."""

    def __init__(self, module: str):
        self.module = module

    def __str__(self) -> str:
        return ", ".join(importlib.import_module(self.module).names())


class DeprecatedAlias(argparse.Action):
    """A hidden old spelling of an option: it stores into the new option's ``dest`` and says so on stderr."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **{**kwargs, "help": argparse.SUPPRESS})

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"flowzoo: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def run_alias(module: str, description: str, add_arguments: Callable[[argparse.ArgumentParser], None],
              run: Callable[[argparse.Namespace], int], argv: Sequence[str] | None = None) -> int:
    """``python -m MODULE ARGS``, the older spelling of a ``flowzoo`` subcommand kept as an alias: the same arguments
    (``add_arguments``) and the same work (``run``), errors one line as ``flowzoo``'s."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description, formatter_class=HelpFormat)
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.command_parser = parser
    return one_line_errors(lambda: run(args))
