"""What the ``topotrain`` command needs before it knows whether typer is needed: the table of verbs, the error
lines, the guard that turns bad input into one ``error:`` line and an exit code (:func:`guarded`), the default
example names. No typer, click or rich here: ``topotrain collective`` with plain arguments runs without them
(:mod:`topotrain.cli.collective_run`); :mod:`topotrain.cli.common` re-exports these for the verb modules and wraps
:func:`guarded` as typer's :func:`~topotrain.cli.common.friendly`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from topotrain.util.atomic import check_output_path, protect_inputs
from topotrain.util.errors import ConfigError, problems_of

#: The root command's help: the package's docstring (:mod:`topotrain.cli`; tests/test_cli_plain.py checks).
ROOT_HELP = """The topotrain command: time collectives and training iterations on a described cluster.

With no sub-command it runs the main job on the built-in default scenario.
"""
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


#: ``-h`` as well as ``--help``, for every command (sub-commands inherit the root's context settings)
HELP_OPTIONS = ["-h", "--help"]

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


class Stop(Exception):
    """The command ends with exit code ``code``; its ``error:`` lines are printed already."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def guarded(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
            passthrough: tuple[type[BaseException], ...] = ()) -> Any:
    """``fn(*args, **kwargs)``, its input files protected and its output files checked first; bad input → one
    line on stderr and :class:`Stop` (2), no traceback; a bug → one line and :class:`Stop` (1)
    (``TOPOTRAIN_DEBUG=1``: the traceback). ``passthrough``: exceptions that go through untouched (typer's
    Exit), as BrokenPipeError and KeyboardInterrupt do."""
    try:
        with protect_inputs(v for k, v in kwargs.items() if k in _INPUT_PARAMS and isinstance(v, Path)):
            for k, v in kwargs.items():  # refused outputs are refused before any work is done
                if k in _OUTPUT_PARAMS and isinstance(v, Path):
                    check_output_path(v, field=_OUTPUT_PARAMS[k], make_parents=True)
            return fn(*args, **kwargs)
    except ConfigError as e:
        for problem in problems_of(e):
            print(f"error: {error_line(problem)}", file=sys.stderr)
        raise Stop(2) from None
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        print(f"error: {one_line(str(e.filename))}: {e.strerror}", file=sys.stderr)
        raise Stop(2) from None
    except BrokenPipeError:
        raise
    except UnicodeDecodeError as e:  # a reader that did not name its file: still bad input, one line
        print(f"error: an input is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}) "
              "(save it as UTF-8)", file=sys.stderr)
        raise Stop(2) from None
    except OSError as e:  # the machine refused (a full disk, stdout on /dev/full, ...): say so, exit 2
        if e.errno is None:
            raise
        where = one_line(str(e.filename)) if e.filename is not None else "the standard output"
        print(f"error: cannot write {where}: {e.strerror or e}", file=sys.stderr)
        raise Stop(2) from None
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a bug, not bad input: still one line (TOPOTRAIN_DEBUG=1 for the traceback)
        if isinstance(e, passthrough) or os.environ.get("TOPOTRAIN_DEBUG"):
            raise
        import yaml  # only on this error path: the verbs that read YAML have loaded it already

        if isinstance(e, yaml.YAMLError):  # a loader that let the parser's error through: still bad input
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            what = getattr(e, "problem", None) or str(e).splitlines()[0]
            print(f"error: malformed YAML{where}: {one_line(str(what))} (fix the YAML syntax)", file=sys.stderr)
            raise Stop(2) from None
        print(f"error: internal error {type(e).__name__}: {one_line(str(e))} (please report it; "
              "TOPOTRAIN_DEBUG=1 shows the traceback)", file=sys.stderr)
        raise Stop(1) from None
