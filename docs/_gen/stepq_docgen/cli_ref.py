"""The CLI reference from the argument parsers themselves: `stepq.producer.cli.build_parser()` and the parsers
of `stepq batch` (which main() hands its arguments to before parsing)."""

from __future__ import annotations

import argparse
import functools

from stepq.producer import batch as batch_cli
from stepq.producer.cli import build_parser
from stepq_docgen import escape_text

WIDTH = 100  # usage lines as a terminal this wide shows them (argparse otherwise reads $COLUMNS)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order `--help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=WIDTH)
    return parser.format_usage().strip()


def _cell(text: str) -> str:
    return escape_text(" ".join(text.split()).replace("|", "\\|"))


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            value = f" {action.metavar or action.dest.upper()}" if action.nargs != 0 else ""
            name = ", ".join(f"`{option}{value}`" for option in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest.upper()}`" + (" (optional)" if action.nargs == "?" else "")
        notes = []
        if action.choices and not isinstance(action.choices, dict):
            notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        if action.required and action.option_strings:
            notes.append("required")
        shown_default = action.default not in (None, False, [], argparse.SUPPRESS, "") and action.nargs != 0
        if shown_default and "default" not in (action.help or ""):
            notes.append(f"default `{action.default}`")
        if isinstance(action, argparse._AppendAction) and "repeat" not in (action.help or ""):
            notes.append("repeatable")
        text = (action.help or "") + (f" ({'; '.join(notes)})" if notes else "")
        rows.append(f"| {name} | {_cell(text) or ' '} |")
    if not rows:
        return ["No arguments.", ""]
    return ["| Argument | Meaning |", "|---|---|", *rows, ""]


def _command(title: str, summary: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} `{title}`", ""]
    if summary:
        out += [summary[:1].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    if parser.description and parser.description != summary:
        out += [parser.description, ""]
    out += ["```text", _usage(parser), "```", "", *_arguments(parser)]
    for name, help_text, sub in _subcommands(parser):
        out += _command(f"{title} {name}", help_text, sub, level + 1)
    return out


def render() -> str:
    root = build_parser()
    out = ["## `stepq`", "", root.description or "", "", "```text", _usage(root), "```", ""]
    out += _arguments(root)
    for name, help_text, parser in _subcommands(root):
        if name == "batch":  # a placeholder in build_parser(): the real parsers are stepq.producer.batch's
            parser = batch_cli.batch_parser()
            out += _command("stepq batch", help_text, parser, 2)
            for command in batch_cli.FOLLOW_COMMANDS:
                out += _command(f"stepq batch {command}", "", batch_cli.follow_parser(command), 3)
            continue
        out += _command(f"stepq {name}", help_text, parser, 2)
    return "\n".join(out)
