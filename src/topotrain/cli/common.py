"""What every verb module of the ``topotrain`` command shares: the typer app, the console, the error wrapper
:func:`friendly` (bad input → one ``error:`` line, exit code 2) and the built-in default example names (those
and the verbs' table from :mod:`topotrain.cli.plain`, which needs no typer).

Kept light: ``topotrain --version`` imports this module and no verb module (see :mod:`topotrain.cli`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from topotrain.cli.plain import (  # re-exported: the verb modules import them from here
    DEFAULT_CLUSTER,
    DEFAULT_SCENARIO,
    ERROR_FIX_MAX_CHARS,
    ERROR_LINE_MAX_CHARS,
    HELP_OPTIONS,
    SET_HELP,
    VERBS,
    Stop,
    error_line,
    guarded,
    one_line,
)

__all__ = ["DEFAULT_CLUSTER", "DEFAULT_SCENARIO", "ERROR_FIX_MAX_CHARS", "ERROR_LINE_MAX_CHARS", "HELP_OPTIONS",
           "SET_HELP", "VERBS", "VerbGroup", "app", "choices", "console", "error_line", "friendly", "one_line"]


def _metavar(param: Any) -> str | None:
    """How help shows the value of ``param``: ``[a|b|c]`` for choices, ``PATH``, ``INTEGER``, ``NUMBER`` or
    ``TEXT`` (typer's own placeholders are Python type names: ``<list[str]>``, ``<str>``); None for a flag."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    desc = getattr(param, "type_descriptor", None)
    if desc is None:
        return None
    if getattr(desc, "is_choice", False):
        return "[" + "|".join(str(getattr(c, "value", c)) for c in (desc.choices or ())) + "]"
    if getattr(desc, "is_path", False):
        return "PATH"
    ann = getattr(desc, "annotation", None)
    args = getattr(ann, "__args__", None)
    if getattr(desc, "is_list", False) and args:
        ann = args[0]
    words: dict[Any, str] = {int: "INTEGER", float: "NUMBER", str: "TEXT", bool: "BOOLEAN"}
    return words.get(ann, "VALUE")


def _plain_help(command: Any) -> None:
    """Value placeholders of ``command`` and its sub-commands in words (:func:`_metavar`), where the command
    sets none itself (an option's ``metavar=`` wins)."""
    for param in getattr(command, "params", ()):
        label = _metavar(param)
        if label is None:
            continue
        if getattr(param, "param_type_name", "") == "argument":
            # an argument's help row is its name then its type: the type is the placeholder to replace
            param.display_type_rich = lambda ctx=None, _label=label: _label
        elif param.metavar is None:
            param.metavar = label
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


def choices(names: Sequence[str]) -> dict[str, Any]:
    """Keyword arguments of ``typer.Option`` for a value that is one of ``names``: help shows ``[a|b|c]`` and
    shell completion offers them (the value itself is still checked by the API, with "did you mean")."""
    options = list(names)

    def complete(incomplete: str) -> list[str]:
        return [n for n in options if n.startswith(incomplete)]

    return {"metavar": "[" + "|".join(options) + "]", "autocompletion": complete}


class VerbGroup(TyperGroup):
    """The root command group: its ``--help`` lists every verb of :data:`VERBS`, the loaded ones as they are
    and the others from their summaries, so listing the verbs imports none of their modules; every help shows
    its value placeholders in words (:func:`_plain_help`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_help(self)

    def format_commands(self, ctx: Any, formatter: Any) -> None:  # typer's vendored click types are private
        loaded = self.commands
        self.commands = {name: loaded.get(name) or TyperCommand(name, help=summary) for name, _, summary in VERBS}
        self.commands.update(loaded)  # a command not in VERBS still shows (and fails the table's test)
        try:
            super().format_commands(ctx, formatter)
        finally:
            self.commands = loaded


app = typer.Typer(no_args_is_help=False, pretty_exceptions_enable=False, rich_markup_mode=None, cls=VerbGroup,
                  context_settings={"help_option_names": HELP_OPTIONS})

console = Console(width=None if sys.stdout.isatty() else 150)
F = TypeVar("F", bound=Callable[..., Any])


def friendly(fn: F) -> F:
    """Bad input → one line on stderr, exit code 2, no traceback (:func:`~topotrain.cli.plain.guarded`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return guarded(fn, args, kwargs, passthrough=(typer.Exit,))
        except Stop as e:
            raise typer.Exit(e.code) from None

    return wrapper  # type: ignore[return-value]
