"""Where the points are evaluated: in this process, on a local process pool, or on a Dask cluster.

Every executor maps :func:`topotrain.search.evaluate.evaluate` over tasks and yields the records as they
finish (in any order); the search stores and ranks them by point, so results do not depend on the executor
or on the order of completion.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol

from topotrain.search.evaluate import Task, evaluate
from topotrain.util.errors import ConfigError

#: Most points in one Dask task. A point screened with the analytical model takes tens of milliseconds,
#: the scheduler's round trip about one: chunks keep the scheduler (on the same cores) out of the way.
MAX_CHUNK = 16
#: Most local worker processes ``--workers`` / ``--dask-local`` may ask for (more is a typo, not a machine).
MAX_WORKERS = 1024
#: ``prctl`` option: the signal the kernel sends a process when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def available_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS says, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _die_with_parent(parent: int) -> None:
    """Pool worker initializer: the kernel kills this worker when the search process dies, even by
    ``kill -9`` (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``); elsewhere the worker's own check at start
    only. A worker whose parent is gone already exits."""
    if sys.platform.startswith("linux"):
        import ctypes  # deferred: only Linux pool workers need it

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


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
        self.pool = ProcessPoolExecutor(max_workers=workers, initializer=_die_with_parent,
                                        initargs=(os.getpid(),))
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
        self._scratch: str | None = None
        if scheduler is not None:
            try:
                self.client = Client(scheduler, timeout="10s")
            except (OSError, TimeoutError, ValueError, TypeError) as e:
                raise ConfigError("--dask-scheduler", f"cannot reach {scheduler}: {e}",
                                  "start one with `dask scheduler`, or use --dask-local N") from None
        else:
            n = local_workers or 1
            # the workers' scratch space (and its lock files) in a folder of this run, removed at close
            self._scratch = tempfile.mkdtemp(prefix="topotrain-dask-")
            import dask  # deferred with dask.distributed above

            with dask.config.set({"temporary-directory": self._scratch}):
                self._cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                             dashboard_address=None, local_directory=self._scratch)
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
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


def worker_count(field: str, n: int, cap: int | None = None) -> int:
    """``n`` local workers as asked on the command line, checked (1 to :data:`MAX_WORKERS`) and capped at
    the CPUs of this machine and at ``cap`` (the points that can run at once)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WORKERS:
        raise ConfigError(field, f"must be a whole number from 1 to {MAX_WORKERS} (got {n!r})",
                          f"e.g. {field} 2 (this machine has {available_cpus()} CPUs)")
    return max(1, min(n, available_cpus(), cap if cap is not None else n))


def make_executor(workers: int | None = None, dask_scheduler: str | None = None,
                  dask_local: int | None = None, *, points: int | None = None) -> Executor:
    """The executor the command line asks for (a process pool of one worker per CPU by default). Local
    workers are capped at the CPUs and at ``points`` (the most points evaluated at once), so a pool never
    forks more processes than can work."""
    if dask_scheduler is not None and dask_local is not None:
        raise ConfigError("--dask-scheduler", "give --dask-scheduler or --dask-local, not both", "remove one")
    if dask_scheduler is not None:
        check_scheduler_address(dask_scheduler)
    if dask_local is not None:
        dask_local = worker_count("--dask-local", dask_local, points)
    if dask_scheduler is not None or dask_local is not None:
        return DaskExecutor(dask_scheduler, dask_local)
    n = worker_count("--workers", workers if workers is not None else available_cpus(), points)
    return InlineExecutor() if n == 1 else PoolExecutor(n)


def check_scheduler_address(address: str) -> None:
    """A Dask scheduler address: ``tcp://HOST:PORT`` (or ``tls://``, ``ucx://``, ``inproc://``), the port
    a number from 1 to 65535; anything else is a ConfigError before any connection is tried."""
    fix = "write e.g. --dask-scheduler tcp://127.0.0.1:8786"
    if not isinstance(address, str) or not address.isprintable() or len(address) > 512:
        raise ConfigError("--dask-scheduler", "is not an address", fix)
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme not in ("tcp", "tls", "ucx", "inproc"):
        raise ConfigError("--dask-scheduler", f"unknown protocol {scheme!r} in {address!r}", fix)
    if scheme == "inproc":
        return
    host, colon, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ok_host = bool(host) and all(c.isalnum() or c in ".-_:" for c in host)
    if not colon or not ok_host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ConfigError("--dask-scheduler", f"{address!r} is not PROTOCOL://HOST:PORT with a port 1-65535", fix)
