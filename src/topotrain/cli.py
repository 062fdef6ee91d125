"""The ``topotrain`` command."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=False, help=__doc__)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        typer.echo("topotrain: see --help")


def main() -> None:
    app()
