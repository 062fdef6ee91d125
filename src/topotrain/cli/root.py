"""The typer side of the ``topotrain`` command: the root callback (``--version``, the default job), the verb
modules loaded on demand, and a command line run through typer with topotrain's usage-error lines
(:func:`run`). Imported by :func:`topotrain.cli.main` only for a command line the plain path does not take
(:mod:`topotrain.cli.collective_run`): typer, click and rich cost more start-up than a small collective.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

import typer

from topotrain.cli import common
from topotrain.cli.plain import ROOT_HELP, VERBS
from topotrain.util import progress

#: Every verb module, in the order `topotrain --help` lists their commands.
ALL_MODULES = tuple(dict.fromkeys(module for _, module, _ in VERBS))


def verb_module(name: str) -> ModuleType:
    """The verb module ``name`` of this package, imported on first use (it registers its commands on the app).

    The CLI's one deferred import: a verb module imports what its commands need at its top (the scenario
    schema, the simulator, the search, ...), most of which another verb does not need, so importing every
    verb module up front would make ``topotrain --version`` and ``topotrain collective`` start slower.
    """
    return importlib.import_module(f"topotrain.cli.{name}")


def load(modules: tuple[str, ...] = ALL_MODULES) -> typer.Typer:
    """The app with the commands of the verb ``modules`` registered."""
    for name in modules:
        verb_module(name)
    return common.app


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("topotrain")
        except PackageNotFoundError:
            v = "unknown (not installed)"
        print(f"topotrain {v}")
        raise typer.Exit()


@common.app.callback(invoke_without_command=True, help=ROOT_HELP)
def _root(ctx: typer.Context,
          _show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                             help="print the version and exit")) -> None:
    """Run the main job on the built-in default scenario when no sub-command is given."""
    if ctx.invoked_subcommand is None:
        common.console.print("topotrain: simulating the built-in default scenario (ResNet-50 data-parallel on 16 "
                             "EFLOPS servers, BiGraph). See `topotrain --help` for more.")
        verb_module("simulate").simulate_cmd(None, [], None, False, None, None, False)


def _base(name: str) -> type[Exception]:
    """The class ``name`` among typer.BadParameter's bases: click's UsageError and ClickException, wherever this
    typer keeps its click (its own vendored copy, or the click package)."""
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == name:
            return cls
    raise ImportError(name)  # pragma: no cover - a typer without click's exception classes


UsageError = _base("UsageError")
ClickException = _base("ClickException")


def usage_error_line(e: Any) -> str:
    """A click usage error (missing value, unknown option, extra argument) as topotrain's one ``error:`` line."""
    ctx = getattr(e, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return "error: " + common.one_line(f"{where}{e.format_message()}") + hint


def run(modules: tuple[str, ...]) -> Any:
    """The command line run through typer with the verb ``modules`` loaded: its exit code (or the command's
    return value); usage errors (a missing value, an unknown option) are one ``error:`` line, exit 2."""
    app = load(modules)
    try:
        with progress.display():  # a progress bar on stderr when it is a terminal (util/progress.py)
            return app(standalone_mode=False)
    except UsageError as e:
        print(usage_error_line(e), file=sys.stderr)
        return 2
    except typer.Abort:
        print("error: interrupted", file=sys.stderr)
        return 130
    except ClickException as e:
        print("error: " + common.one_line(e.format_message()), file=sys.stderr)  # type: ignore[attr-defined]
        return getattr(e, "exit_code", 1)
