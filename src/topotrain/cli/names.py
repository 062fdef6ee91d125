"""``topotrain list``: the built-in names a scenario may use (models, GPUs, servers, links, topologies,
collective algorithms, network models), optionally filtered."""

from __future__ import annotations

import typer

from topotrain.api import names
from topotrain.cli.common import app, choices, friendly
from topotrain.util import jsonsafe

#: The kinds ``topotrain list`` knows, in the order it prints them.
KINDS = ("models", "gpus", "servers", "links", "topologies", "algorithms", "networks")


@app.command("list")
@friendly
def list_cmd(kind: str | None = typer.Argument(None, help="which names: " + ", ".join(KINDS) + " (default: all)",
                                               metavar="KIND", autocompletion=choices(KINDS)["autocompletion"]),
             filter_: str | None = typer.Argument(None, metavar="FILTER",
                                                  help="only the names that contain this text"),
             as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the built-in names a scenario may use: models, GPUs, servers, links, topologies, algorithms."""
    table = names()
    assert isinstance(table, dict)
    if kind is not None:
        one = names(kind.strip().lower())
        table = {kind.strip().lower(): one if isinstance(one, list) else []}
    needle = (filter_ or "").lower()
    shown = {k: [n for n in v if needle in n.lower()] for k, v in table.items()}
    if as_json:
        print(jsonsafe.dumps(shown if kind is None else next(iter(shown.values()))))
        return
    for k, v in shown.items():
        if kind is None:
            print(f"{k}: {', '.join(v) if v else '(none)'}")
        else:
            print("\n".join(v))
