"""The topotrain command: time collectives and training iterations on a described cluster.

With no sub-command it runs the main job on the built-in default scenario.
"""

# The package, one module per verb group: common (the typer app, console, the error wrapper `friendly`, the
# default example names), collective (collective, topo show), simulate (simulate, report, scale, schema),
# profile, testbed (testbed compare/ddp/clean), search (search, explain), place, validate, operations
# (run-long). Each verb module imports what it needs at its top and registers its commands on `common.app`
# when imported; `main` imports only the module the command line names (VERB_MODULES), through typer
# (cli/root.py) — except a plain `collective` command line (cli/collective_args.py), which runs without typer
# (cli/collective_run.py).

from __future__ import annotations

import os
import sys
from typing import Any

from topotrain.cli.collective_args import simple_call
from topotrain.cli.plain import HELP_OPTIONS, VERBS

#: First word of a command line → the module of this package that defines it.
VERB_MODULES = {name: module for name, module, _ in VERBS}
#: Every verb module, in the order `topotrain --help` lists their commands.
ALL_MODULES = tuple(dict.fromkeys(module for _, module, _ in VERBS))


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
        if arg in HELP_OPTIONS:
            return ()
        if not arg.startswith("-"):
            return (VERB_MODULES[arg],) if arg in VERB_MODULES else ALL_MODULES
    return ("simulate",)


def __getattr__(name: str) -> Any:
    """``topotrain.cli.app``: the app with every verb loaded (what the tests drive through typer's runner);
    ``topotrain.cli.load``: :func:`topotrain.cli.root.load`."""
    if name in ("app", "load"):
        from topotrain.cli import root  # deferred: typer, click and rich only where the typer app is asked for

        return root.load() if name == "app" else root.load
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    floating-point warnings never reach stderr (non-finite results are handled). A plain ``collective``
    command line runs without typer (:mod:`topotrain.cli.collective_run`), any other through it."""
    import warnings

    import numpy as np

    np.seterr(all="ignore")
    warnings.filterwarnings("ignore", module=r"numpy(\.|$)")  # e.g. "Mean of empty slice": results say it
    argv = sys.argv[1:]
    plain = simple_call(argv)
    code: Any = 0
    try:
        if plain is not None:
            from topotrain.cli import collective_run  # deferred: the collective's work, for its command line only

            code = collective_run.run(plain)
        else:
            from topotrain.cli import root  # deferred: typer, click and rich only for what the plain path leaves

            code = root.run(modules_for(argv))
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # Python would flush stdout again at exit and fail
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)  # 128 + SIGPIPE, as a shell tool killed by the pipe
    except OSError as e:
        sys.exit(_stdout_failed(e))
    sys.exit(code if isinstance(code, int) else 0)
