"""What every verb module of the ``topotrain`` command shares: the typer app, the console, the error wrapper
:func:`friendly` (bad input → one ``error:`` line, exit code 2) and the built-in default example names.

Kept light: ``topotrain --version`` imports this module and no verb module (see :mod:`topotrain.cli`).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from topotrain.util.atomic import check_output_path, protect_inputs
from topotrain.util.errors import ConfigError, problems_of

#: Every verb of the command, in the order ``topotrain --help`` lists them: (name, the module of this package that
#: defines it, the first paragraph of its help). ``topotrain --help`` prints the summaries without importing
#: the verb modules (tests/test_cli.py checks they equal the commands' own help, word for word).
VERBS: tuple[tuple[str, str, str], ...] = (
    ("collective", "collective", "Time one collective (or a sweep of sizes) with NCCL's algbw/busbw."),
    ("simulate", "simulate", "Predict one training iteration: time, throughput, MFU, breakdown, memory."),
    ("report", "simulate", "Simulate one iteration and write one self-contained HTML report (charts work offline)."),
    ("schema", "simulate",
     "Print the JSON Schema of a scenario file (point your editor's YAML language server at it)."),
    ("scale", "simulate", "Weak scaling: throughput and efficiency against ideal linear scaling over GPU counts."),
    ("profile", "profile", "Profile the model's torch module per layer (torch.profiler; GPU, else the CPU, labeled)."),
    ("search", "search", "Search a design space: ranked table, Pareto front of time vs cost, CSV and PNG."),
    ("explain", "search", "Why one scenario beats another: breakdown beside breakdown, busiest links."),
    ("place", "place", "Place jobs on a shared cluster or mixed fleet: JCT, queueing, utilization per policy "
                       "and GPU type."),
    ("validate", "validate", "Validate the network models (analytical, flow, flow-async) against ns-3 (TCP, packet "
                             "level) and SimGrid (pure max-min and LV08 TCP factors): each case's times, our error "
                             "against each reference, each model's wall time; writes CSV + PNG."),
    ("run-long", "operations", "Expected time to train N tokens under failures: checkpoints (Young/Daly), restart, "
                               "hot spares and elastic shrink, Monte-Carlo over the failure model."),
    ("failure-predict", "operations",
     'Train and judge a "fails within H hours" classifier on GPU telemetry, split by time.'),
    ("topo", "collective", "Inspect a cluster topology."),
    ("testbed", "testbed", "Emulated cluster from network namespaces (root only)."),
    ("trace", "traces", "Recorded PyTorch steps: import, replay, what-if."),
    ("list", "names", "List the built-in names a scenario may use: models, GPUs, servers, links, topologies, "
                      "algorithms."),
)


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


#: ``-h`` as well as ``--help``, for every command (sub-commands inherit the root's context settings)
HELP_OPTIONS = ["-h", "--help"]
app = typer.Typer(no_args_is_help=False, pretty_exceptions_enable=False, rich_markup_mode=None, cls=VerbGroup,
                  context_settings={"help_option_names": HELP_OPTIONS})

console = Console(width=None if sys.stdout.isatty() else 150)
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CLUSTER = "eflops-bigraph"
#: Help of every ``--set`` option (the rules: :func:`topotrain.scenario.load.apply_overrides`).
SET_HELP = ("override a field: plan.tp=8; a mapping replaces the whole field: cluster.network='{topology: "
            "fat-tree, link: ib-hdr-200g}'; ~plan.dp or plan.dp= deletes it; a new cluster.network.topology drops "
            "the old builder's parameters")
DEFAULT_SCENARIO = "resnet50-eflops"


#: Parameters of the commands that name files the command reads: no output of the run may replace them.
_INPUT_PARAMS = frozenset({"cluster", "scenario", "space", "best", "vs", "jobs"})
#: Parameters that name a file the command writes (checked before the work starts), and their options.
_OUTPUT_PARAMS = {"png": "--out", "plot": "--png", "trace": "--trace", "html_out": "--html"}
#: Longest error line the CLI prints (a 100 KB value typed by mistake must not give a 100 KB line).
ERROR_LINE_MAX_CHARS = 300


def one_line(text: str, limit: int = ERROR_LINE_MAX_CHARS) -> str:
    """``text`` with control characters made visible, cut to ``limit`` characters (the cut marked)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else f"{text[:limit - 25]}… [{len(text) - limit + 25} more characters]"


#: Longest fix the CLI prints: room for a whole list of known names (``known: a, b, ...``) after the message.
ERROR_FIX_MAX_CHARS = 2000


def error_line(problem: ConfigError) -> str:
    """``field: message (fix)`` on one line: the field and the message cut at :data:`ERROR_LINE_MAX_CHARS` (a
    typed value can be huge), the fix — the names to choose from — at :data:`ERROR_FIX_MAX_CHARS`, so a list
    of valid names is never cut off by a long message before it."""
    head = one_line(f"{problem.field}: {problem.message}" if problem.field else problem.message)
    return f"{head} ({one_line(problem.fix, ERROR_FIX_MAX_CHARS)})" if problem.fix else head


def friendly(fn: F) -> F:
    """Bad input → one line on stderr, exit code 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with protect_inputs(v for k, v in kwargs.items() if k in _INPUT_PARAMS and isinstance(v, Path)):
                for k, v in kwargs.items():  # refused outputs are refused before any work is done
                    if k in _OUTPUT_PARAMS and isinstance(v, Path):
                        check_output_path(v, field=_OUTPUT_PARAMS[k], make_parents=True)
                return fn(*args, **kwargs)
        except ConfigError as e:
            for problem in problems_of(e):
                print(f"error: {error_line(problem)}", file=sys.stderr)
            raise typer.Exit(2) from None
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
            print(f"error: {one_line(str(e.filename))}: {e.strerror}", file=sys.stderr)
            raise typer.Exit(2) from None
        except BrokenPipeError:
            raise
        except UnicodeDecodeError as e:  # a reader that did not name its file: still bad input, one line
            print(f"error: an input is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}) "
                  "(save it as UTF-8)", file=sys.stderr)
            raise typer.Exit(2) from None
        except OSError as e:  # the machine refused (a full disk, stdout on /dev/full, ...): say so, exit 2
            if e.errno is None:
                raise
            where = one_line(str(e.filename)) if e.filename is not None else "the standard output"
            print(f"error: cannot write {where}: {e.strerror or e}", file=sys.stderr)
            raise typer.Exit(2) from None
        except (typer.Exit, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug, not bad input: still one line (TOPOTRAIN_DEBUG=1 for the traceback)
            if os.environ.get("TOPOTRAIN_DEBUG"):
                raise
            import yaml  # only on this error path: the verbs that read YAML have loaded it already

            if isinstance(e, yaml.YAMLError):  # a loader that let the parser's error through: still bad input
                mark = getattr(e, "problem_mark", None)
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                what = getattr(e, "problem", None) or str(e).splitlines()[0]
                print(f"error: malformed YAML{where}: {one_line(str(what))} (fix the YAML syntax)",
                      file=sys.stderr)
                raise typer.Exit(2) from None
            print(f"error: internal error {type(e).__name__}: {one_line(str(e))} (please report it; "
                  "TOPOTRAIN_DEBUG=1 shows the traceback)", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]
