"""Run tags and their ownership: how concurrent testbed runs tell their namespaces, veths and files apart.

Namespaces are named ``<tag>-h<i>`` / ``<tag>-s<j>`` and veth ends ``<tag>e<k>a|b``, where the run's
``<tag>`` starts with ``tt-`` and is unique per run (by default pid and a counter; :func:`fresh_tag` or
the caller's own). The fixed ``tt-`` prefix lets :func:`~topotrain.testbed.netns.clean` find every leftover;
given a tag, :func:`~topotrain.testbed.netns.leftovers` and :func:`~topotrain.testbed.netns.clean` see only that
run's names (:func:`of_run`), so concurrent runs on one machine (two test suites, a benchmark) never count or
remove each other's.

Ownership: a run holds an exclusive ``flock(2)`` on ``<run dir>/<tag>.lock`` (:func:`run_dir`, :class:`RunLock`)
from before it creates anything until it has removed everything; the file names its pid and its temporary
directories (:meth:`~topotrain.testbed.netns.Emulation.tempdir`). The kernel drops the lock when the process dies,
even by SIGKILL, so :func:`~topotrain.testbed.netns.clean` tells a live run (lock held: left alone unless
``force``) from an orphan (lock free, or no lock file: its namespaces, veths, processes and temporary directories
are removed). A second run asking for a tag that is held gets a ConfigError naming the holder and the cleanup.

This is the bookkeeping half of the testbed, apart from :mod:`~topotrain.testbed.netns` (which builds and tears
down the emulated network): names and lock files only, no namespace and no ``ip`` command.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from topotrain.util.errors import ConfigError

__all__ = ["PREFIX", "fresh_tag", "run_dir"]

#: Every namespace and veth the testbed creates starts with this.
PREFIX = "tt-"
#: Most physical links one emulation may have (its veth ends are numbered from ``e0`` up, by link).
MAX_LINKS = 9999
#: Longest tag: a veth end ``<tag>e<k>a`` must fit Linux's 15-character interface names.
MAX_TAG_LEN = 15 - 2 - len(str(MAX_LINKS - 1))
_TAG_CHARS = re.compile(r"[a-z0-9]+")
#: Environment variable naming the directory of the runs' lock files (default: /run/topotrain-testbed).
RUN_DIR_ENV = "TOPOTRAIN_TESTBED_RUN_DIR"
_TAG_OF = re.compile(rf"^({PREFIX}[a-z0-9]+)(?:-[hs]\d+|e\d+[ab])$")


def run_dir() -> Path:
    """Where runs keep their lock files: ``$TOPOTRAIN_TESTBED_RUN_DIR``, else ``/run/topotrain-testbed``
    (root's runtime directory, emptied at boot), else one under the temporary directory."""
    d = os.environ.get(RUN_DIR_ENV)
    if not d:
        d = "/run/topotrain-testbed" if os.access("/run", os.W_OK) else os.path.join(tempfile.gettempdir(),
                                                                                     "topotrain-testbed")
    path = Path(d)
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    return path


def tag_of(name: str) -> str | None:
    """The run tag of a namespace or veth name (``tt-1a2b3-h0`` → ``tt-1a2b3``), None if not a testbed name."""
    m = _TAG_OF.match(name)
    return m.group(1) if m else None


class RunLock:
    """The lock file of one run tag (module docstring): held for the run's life, pid and temp dirs inside."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.path = run_dir() / f"{tag}.lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        """Hold the tag, or a ConfigError naming the live run that holds it."""
        deadline = time.monotonic() + 1.0  # `clean` probing liveness holds a shared lock for an instant
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                owner = owner_pid(self.path)
                raise ConfigError("tag", f"run tag {self.tag} is held by another testbed run"
                                  f"{f' (pid {owner})' if owner else ''}",
                                  "wait for it, use another tag (fresh_tag()), or, if that run is stuck, "
                                  "`topotrain testbed clean --force`") from None
            try:  # the file may have been unlinked by its last holder between our open and our lock
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self.fd = fd

    def note_tempdir(self, path: str) -> None:
        if self.fd is not None:
            os.write(self.fd, f"tmp {path}\n".encode())

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None


def _lock_lines(path: Path) -> list[tuple[str, str]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    return [(k, v) for k, _, v in (ln.partition(" ") for ln in text.splitlines()) if v]


def owner_pid(path: Path) -> int | None:
    for k, v in _lock_lines(path):
        if k == "pid" and v.isdigit():
            return int(v)
    return None


def run_alive(tag: str) -> bool:
    """Whether a live process holds the run ``tag`` (its lock file is locked)."""
    try:
        fd = os.open(run_dir() / f"{tag}.lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def remove_run_files(tag: str) -> list[str]:
    """Remove an orphaned run's temporary directories and lock file, holding its lock meanwhile (nothing is
    removed if a live process holds it)."""
    path = run_dir() / f"{tag}.lock"
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return []
    removed = []
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []
        for k, v in _lock_lines(path):
            if k == "tmp" and os.path.isdir(v) and os.path.basename(v).startswith(f"{tag}-"):
                shutil.rmtree(v, ignore_errors=True)
                removed.append(v)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    finally:
        os.close(fd)
    return removed


def fresh_tag() -> str:
    """A new random run tag (``tt-`` and six hex digits): what a caller passes as ``Emulation(tag=...)`` to
    find exactly its own namespaces and links afterwards (:func:`~topotrain.testbed.netns.leftovers`)."""
    return f"{PREFIX}{secrets.token_hex(3)}"


def check_tag(tag: str) -> str:
    rest = tag[len(PREFIX):]
    if not tag.startswith(PREFIX) or not _TAG_CHARS.fullmatch(rest) or len(tag) > MAX_TAG_LEN:
        raise ConfigError("tag", f"bad run tag {tag!r}", f"give {PREFIX!r} and 1 to {MAX_TAG_LEN - len(PREFIX)} "
                          "lowercase letters or digits, e.g. fresh_tag()")
    return tag


def of_run(name: str, tag: str) -> bool:
    """Whether ``name`` is a namespace (``<tag>-h3``, ``<tag>-s0``) or veth end (``<tag>e12a``) of the run
    ``tag`` exactly (not of a run whose tag merely starts the same)."""
    return name.startswith(tag) and re.fullmatch(r"-[hs]\d+|e\d+[ab]", name[len(tag):]) is not None


def made_by_topotrain(name: str, tag: str | None) -> bool:
    """Whether ``name`` is a namespace or link of the run ``tag`` (of any topotrain run when ``tag`` is None)."""
    return name.startswith(PREFIX) if tag is None else of_run(name, tag)
