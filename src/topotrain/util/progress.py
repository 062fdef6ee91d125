"""Progress of long runs: one helper for every layer, shown by the CLI, silent everywhere else.

Code that may run long reports what it does with :func:`task` (a phase, optionally counted: ``with
task("simulating", total=n) as t: ... t.advance()``). Nothing is shown unless a *display* is open: the
CLI opens one (:func:`display`) around every command, and it draws a rich progress bar on stderr only when
stderr is a terminal, so piped or captured output, notebooks and the Python API stay quiet. The bar starts
with the first task and is cleared when the last one ends (``transient``), so a table printed afterwards
stands alone. Tasks nest (a validation case's ``simulating`` under ``validate``): each is a line of the
bar. Updates are throttled (:data:`MIN_INTERVAL_S`), so a hot loop may report every step. Progress never
changes a result: it reads counters, it writes only to the terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

#: the least time between two redraws of one task (the final state is always drawn)
MIN_INTERVAL_S = 0.1


@dataclass
class _Display:
    """An open display: the rich bar (started with the first task), and a log of what it was told."""

    console: Console | None
    bar: Progress | None = None
    open_tasks: int = 0
    #: every update that reached the display: (description, done, total) (tests read it)
    log: list[tuple[str, int, int | None]] = field(default_factory=list)

    def start_task(self, description: str, total: int | None) -> TaskID | None:
        self.open_tasks += 1
        self.log.append((description, 0, total))
        if self.console is None:
            return None
        if self.bar is None:
            from rich.progress import (  # deferred: rich only where a display draws
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
                                TimeRemainingColumn(), console=self.console, transient=True)
            self.bar.start()
        return self.bar.add_task(description, total=total)

    def end_task(self, tid: TaskID | None) -> None:
        self.open_tasks -= 1
        if self.bar is not None and tid is not None:
            self.bar.remove_task(tid)
            if self.open_tasks == 0:
                self.bar.stop()
                self.bar = None


_current: ContextVar[_Display | None] = ContextVar("topotrain_progress_display", default=None)


class Task:
    """One line of progress: ``advance()``, or ``update(done, total=..., description=...)``."""

    def __init__(self, display: _Display | None, description: str, total: int | None) -> None:
        self._display = display
        self.description = description
        self.total = total
        self.done = 0
        self._last = 0.0
        self._tid = display.start_task(description, total) if display is not None else None

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def update(self, done: int | None = None, *, total: int | None = None, description: str | None = None,
               force: bool = False) -> None:
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        if description is not None:
            self.description = description
        d = self._display
        if d is None:
            return
        now = time.monotonic()
        final = self.total is not None and self.done >= self.total
        if not (force or final or description is not None or now - self._last >= MIN_INTERVAL_S):
            return
        self._last = now
        d.log.append((self.description, self.done, self.total))
        if d.bar is not None and self._tid is not None:
            d.bar.update(self._tid, completed=self.done, total=self.total, description=self.description)

    def close(self) -> None:
        if self._display is not None:
            self._display.end_task(self._tid)
            self._display = None


@contextmanager
def task(description: str, total: int | None = None) -> Iterator[Task]:
    """A phase of work (``total`` steps, or an open-ended spinner), shown while the block runs."""
    t = Task(_current.get(), description, total)
    try:
        yield t
    finally:
        t.close()


def active() -> bool:
    """Whether a display is open (a caller may skip counting work nobody sees)."""
    return _current.get() is not None


@contextmanager
def display(enabled: bool | None = None, console: Console | None = None,
            record: bool = False) -> Iterator[list[tuple[str, int, int | None]]]:
    """Show the tasks run inside the block: a rich bar on ``console`` (default stderr) when ``enabled``
    (default: when stderr is a terminal); ``record``: keep the log even when nothing is drawn. Yields the
    log of updates. An inner display inside an open one adds nothing (the outer one shows)."""
    outer = _current.get()
    if outer is not None:
        yield outer.log
        return
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show and not record:
        yield []
        return
    con: Any = None
    if show:
        if console is None:
            from rich.console import Console  # deferred: rich only where a display draws

            console = Console(stderr=True)
        con = console
    d = _Display(con)
    token = _current.set(d)
    try:
        yield d.log
    finally:
        _current.reset(token)
        if d.bar is not None:
            d.bar.stop()
