"""The reading of a plain ``topotrain collective`` command line (:func:`simple_call`), which lets
:func:`topotrain.cli.main` run it without typer, click, rich or pydantic (:mod:`topotrain.cli.collective_run`).
Light on purpose: every command line passes through here, ``--version`` included.

A command line is read here only when click would read it the same way: ``collective`` first, then the
command's own options, each once, as ``--name VALUE`` or ``--name=VALUE`` (a value neither empty nor starting
with ``-``), ``--json``, and at most one cluster file (not starting with ``-``). Anything else — help, another
verb, an option given twice, an unknown option, ``--``, shell completion — goes to typer as before, which
gives its own usage errors and help. The options and their defaults are the typer command's
(tests/test_cli_plain.py compares them, and the arguments each command line gives, with typer's).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The command's options (as typer declares them in cli/collective.py): option → (parameter, default).
OPTIONS: dict[str, tuple[str, str | None]] = {
    "--op": ("op", "allreduce"),
    "--algo": ("algo", "auto"),
    "--size": ("size", "256MiB"),
    "--network": ("network", "flow"),
    "--sweep-sizes": ("sweep_sizes", None),
    "--library": ("library", None),
}
#: Its flags: flag → parameter (default False).
FLAGS = {"--json": "as_json"}


def simple_call(argv: list[str]) -> dict[str, Any] | None:
    """The keyword arguments of :func:`~topotrain.cli.collective_run.run_collective` for the command line
    ``argv`` (without the program name), when it is a plain ``collective`` command line (module docstring); None
    for any other."""
    if not argv or argv[0] != "collective" or any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None
    kwargs: dict[str, Any] = {name: default for name, default in OPTIONS.values()}
    kwargs.update({name: False for name in FLAGS.values()})
    kwargs["cluster"] = None
    given: set[str] = set()
    rest = argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, eq, value = arg.partition("=")
        if not arg.isprintable() or arg in given or name in given:
            return None
        if arg in FLAGS:
            kwargs[FLAGS[arg]] = True
        elif name in OPTIONS:
            if not eq:
                i += 1
                value = rest[i] if i < len(rest) else ""
            if not value or value.startswith("-") or not value.isprintable():
                return None
            kwargs[OPTIONS[name][0]] = value
        elif not arg.startswith("-") and arg and kwargs["cluster"] is None:
            kwargs["cluster"] = Path(arg)
        else:
            return None
        given.add(name if eq else arg)
        i += 1
    return kwargs
