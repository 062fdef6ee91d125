"""Where the points are evaluated: in this process, on a local process pool, or on a Dask cluster.

Every executor maps :func:`topotrain.search.evaluate.evaluate` over tasks and yields the records as they
finish (in any order); the search stores and ranks them by point, so results do not depend on the executor
or on the order of completion.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol

from topotrain.search.evaluate import Task, evaluate
from topotrain.util.errors import ConfigError

#: Most points in one Dask task. A point screened with the analytical model takes tens of milliseconds,
#: the scheduler's round trip about one: chunks keep the scheduler (on the same cores) out of the way.
MAX_CHUNK = 16


def chunk_size(n_tasks: int, workers: int) -> int:
    """Points per Dask task: about 8 tasks per worker, at most :data:`MAX_CHUNK` points each (so results
    still stream and the last tasks balance across workers)."""
    return max(1, min(MAX_CHUNK, n_tasks // (8 * max(1, workers))))


def evaluate_many(tasks: Sequence[Task]) -> list[dict[str, Any]]:
    """:func:`evaluate` of each task, in order (one Dask task for several points)."""
    return [evaluate(t) for t in tasks]


class Executor(Protocol):
    """Evaluates tasks, yielding each record as it is done."""

    workers: int

    def run(self, tasks: Sequence[Task]) -> Iterator[dict[str, Any]]:
        ...

    def close(self) -> None:
        ...


class InlineExecutor:
    """Evaluate in this process, one after another (``--workers 1``)."""

    workers = 1

    def run(self, tasks: Sequence[Task]) -> Iterator[dict[str, Any]]:
        for t in tasks:
            yield evaluate(t)

    def close(self) -> None:
        pass


class PoolExecutor:
    """A local process pool (the default: one worker per core). At most ``4 × workers`` tasks are in flight,
    so results stream to disk while the rest wait."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool = ProcessPoolExecutor(max_workers=workers)
        # with the fork start method every worker is forked at the first submission: do it now, before a
        # progress bar's thread exists
        self.pool.submit(os.getpid).result()

    def run(self, tasks: Sequence[Task]) -> Iterator[dict[str, Any]]:
        pending: set[Future[dict[str, Any]]] = set()
        it = iter(tasks)
        limit = 4 * self.workers
        for t in it:
            pending.add(self.pool.submit(evaluate, t))
            if len(pending) >= limit:
                break
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                yield f.result()
            for t in it:
                pending.add(self.pool.submit(evaluate, t))
                if len(pending) >= limit:
                    break

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


class DaskExecutor:
    """A dask.distributed cluster: an existing scheduler (``tcp://HOST:PORT``) or a local one of N worker
    processes (one thread each). Tasks are submitted all at once, in chunks of :func:`chunk_size` points;
    records come back as chunks finish."""

    def __init__(self, scheduler: str | None = None, local_workers: int | None = None) -> None:
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError("--dask-scheduler", "dask.distributed is not installed",
                              "pip install 'dask[distributed]'") from None
        self._cluster: Any = None
        if scheduler is not None:
            try:
                self.client = Client(scheduler, timeout="10s")
            except (OSError, TimeoutError) as e:
                raise ConfigError("--dask-scheduler", f"cannot reach {scheduler}: {e}",
                                  "start one with `dask scheduler`, or use --dask-local N") from None
        else:
            n = local_workers or 1
            self._cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                         dashboard_address=None)
            self.client = Client(self._cluster)
        self.workers = max(1, len(self.client.scheduler_info().get("workers", {})))

    def run(self, tasks: Sequence[Task]) -> Iterator[dict[str, Any]]:
        from dask.distributed import as_completed

        if not tasks:
            return
        size = chunk_size(len(tasks), self.workers)
        chunks = [list(tasks[i:i + size]) for i in range(0, len(tasks), size)]
        futures = [self.client.submit(evaluate_many, c, key=f"topotrain-{c[0].stage}-{c[0].key}-{len(c)}",
                                      pure=False) for c in chunks]
        for f in as_completed(futures):
            yield from f.result()
            f.release()

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def make_executor(workers: int | None = None, dask_scheduler: str | None = None,
                  dask_local: int | None = None) -> Executor:
    """The executor the command line asks for (a process pool of one worker per core by default)."""
    if dask_scheduler is not None and dask_local is not None:
        raise ConfigError("--dask-scheduler", "give --dask-scheduler or --dask-local, not both", "remove one")
    if dask_scheduler is not None or dask_local is not None:
        if dask_local is not None and dask_local < 1:
            raise ConfigError("--dask-local", f"must be ≥ 1 (got {dask_local})", "e.g. --dask-local 2")
        return DaskExecutor(dask_scheduler, dask_local)
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n < 1:
        raise ConfigError("--workers", f"must be ≥ 1 (got {n})", "e.g. --workers 2")
    return InlineExecutor() if n == 1 else PoolExecutor(n)
