"""The topotrain command: time collectives and training iterations on a described cluster.

With no sub-command it runs the main job on the built-in default scenario.
"""

# The package, one module per verb group: common (the typer app, console, the error wrapper `friendly`, the
# default example names), collective (collective, topo show), simulate (simulate, report, scale, schema),
# profile, testbed (testbed compare/ddp/clean), search (search, explain), place, validate, operations
# (run-long). Each verb module imports what it needs at its top and registers its commands on `common.app`
# when imported; `main` imports only the module the command line names (VERB_MODULES).

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

import typer

from topotrain.cli import common
from topotrain.util import progress

#: First word of a command line → the module of this package that defines it.
VERB_MODULES = {name: module for name, module, _ in common.VERBS}
#: Every verb module, in the order `topotrain --help` lists their commands.
ALL_MODULES = tuple(dict.fromkeys(module for _, module, _ in common.VERBS))


def verb_module(name: str) -> ModuleType:
    """The verb module ``name`` of this package, imported on first use (it registers its commands on the app).

    The CLI's one deferred import: a verb module imports what its commands need at its top (the scenario
    schema, the simulator, the search, ...), most of which another verb does not need, so importing every
    verb module up front would make ``topotrain --version`` and ``topotrain collective`` start slower.
    """
    return importlib.import_module(f"{__name__}.{name}")


def load(modules: tuple[str, ...] = ALL_MODULES) -> typer.Typer:
    """The app with the commands of the verb ``modules`` registered."""
    for name in modules:
        verb_module(name)
    return common.app


def modules_for(argv: list[str]) -> tuple[str, ...]:
    """The verb modules the command line ``argv`` (without the program name) needs: none for ``--version`` and
    for ``--help`` before any verb (the root group lists the verbs from their summaries,
    :class:`~topotrain.cli.common.VerbGroup`); all for an unknown verb or shell completion; ``simulate`` when
    no verb is given (the default job); else the verb's own module."""
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return ALL_MODULES
    for arg in argv:
        if arg == "--version":  # eager: prints the version and exits before any command is looked up
            return ()
        if arg in common.HELP_OPTIONS:
            return ()
        if not arg.startswith("-"):
            return (VERB_MODULES[arg],) if arg in VERB_MODULES else ALL_MODULES
    return ("simulate",)


def __getattr__(name: str) -> Any:
    """``topotrain.cli.app``: the app with every verb loaded (what the tests drive through typer's runner)."""
    if name == "app":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("topotrain")
        except PackageNotFoundError:
            v = "unknown (not installed)"
        print(f"topotrain {v}")
        raise typer.Exit()


@common.app.callback(invoke_without_command=True, help=__doc__)
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


def _stdout_failed(e: OSError) -> int:
    """stdout cannot be written (``> /dev/full``): one line on stderr, exit 2; stdout is pointed at /dev/null so
    Python's flush at exit does not fail again."""
    print(f"error: cannot write the standard output: {e.strerror or e}", file=sys.stderr)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 2


def main() -> None:
    """The console entry point. A reader that closes stdout early (``... --json | head -c1``) ends the run
    quietly; a stdout that cannot be written (a full device) is one error line and exit 2; usage errors
    (a missing value, an unknown option) are one ``error:`` line, exit 2, like every bad input; numpy's
    floating-point warnings never reach stderr (non-finite results are handled)."""
    import warnings

    import numpy as np

    np.seterr(all="ignore")
    warnings.filterwarnings("ignore", module=r"numpy(\.|$)")  # e.g. "Mean of empty slice": results say it
    app = load(modules_for(sys.argv[1:]))
    code: Any = 0
    try:
        try:
            with progress.display():  # a progress bar on stderr when it is a terminal (util/progress.py)
                code = app(standalone_mode=False)
        except UsageError as e:
            print(usage_error_line(e), file=sys.stderr)
            code = 2
        except typer.Abort:
            print("error: interrupted", file=sys.stderr)
            code = 130
        except ClickException as e:
            print("error: " + common.one_line(e.format_message()), file=sys.stderr)  # type: ignore[attr-defined]
            code = getattr(e, "exit_code", 1)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # Python would flush stdout again at exit and fail
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)  # 128 + SIGPIPE, as a shell tool killed by the pipe
    except OSError as e:
        sys.exit(_stdout_failed(e))
    sys.exit(code if isinstance(code, int) else 0)
