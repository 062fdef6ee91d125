"""Every file topotrain writes goes through :func:`atomic_write`: checked, then written all at once.

* **Checked first** (:func:`check_output_path`): a path that is a directory, a device, a FIFO or a socket is
  refused (replacing ``/dev/null`` by a regular file, as root, would break the machine); so is a path under
  something that is not a directory, an empty path, and a file that is an *input* of the same run (a
  ``--trace`` onto the scenario it reads). Inputs are declared with :func:`protect_inputs` (the CLI does it
  for the files named on its command line; the scenario loader for the files a scenario names).
* **Symlinks are written through**: the link stays, its target is replaced (the temporary file lives
  beside the target, so the final rename stays on one file system).
* **Atomic**: a temporary file ``.NAME.tmp-XXXXXXXX`` (hidden, never mistaken for output) in the same
  directory is filled, flushed, fsync-ed and :func:`os.replace`-d over the path; readers never see half a
  file. The file gets the mode :func:`open` would give (0644 under umask 022). The temporary file is removed
  on any exception, on Ctrl-C, and on SIGTERM (while a write is in progress in the main thread, a default
  SIGTERM is turned into an exit that cleans up; a handler the program installed, or an ignored signal,
  is left alone).
* Any OS refusal (read-only file system, no space, permission) is one ConfigError naming the path.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO

from topotrain.util.errors import ConfigError

#: Files the current run reads (its inputs): never overwritten by one of its outputs. None outside a
#: :func:`protect_inputs` block (a library caller's inputs are not tracked across calls).
_INPUTS: contextvars.ContextVar[tuple[tuple[int, int] | str, ...] | None] = contextvars.ContextVar(
    "topotrain_inputs", default=None)
#: Longest part of the output's name kept in its temporary file's name (file names are at most 255 bytes).
_TMP_NAME_MAX = 96


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _identity(path: str | os.PathLike[str]) -> tuple[int, int] | str:
    """(device, inode) of an existing file (hard links and symlinks compare equal), else its real path."""
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except (OSError, ValueError):  # missing, or a name no file system takes (NUL byte)
        return os.path.realpath(path) if "\x00" not in os.fspath(path) else os.fspath(path)


def note_input(path: str | os.PathLike[str]) -> None:
    """Declare ``path`` an input of the current run (inside a :func:`protect_inputs` block, e.g. one CLI
    command; a no-op outside one)."""
    inputs = _INPUTS.get()
    if inputs is not None:
        _INPUTS.set((*inputs, _identity(path)))


@contextlib.contextmanager
def protect_inputs(paths: Iterable[str | os.PathLike[str] | None] = ()) -> Iterator[None]:
    """Within the block, ``paths`` (and any :func:`note_input` made inside it) are inputs no write may
    replace."""
    token = _INPUTS.set(_INPUTS.get() or ())
    try:
        for p in paths:
            if p is not None:
                note_input(p)
        yield
    finally:
        _INPUTS.reset(token)


def _kind(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    return None


def check_output_path(path: str | os.PathLike[str], *, field: str = "output", make_parents: bool = False) -> Path:
    """The file an output at ``path`` will replace (``path`` itself, or a symlink's target), or a ConfigError:
    an empty path, a directory/device/FIFO/socket, a path under a non-directory, a missing directory
    (unless ``make_parents``), or an input of the current run."""
    text = os.fspath(path)
    if text in ("", ".", "..") or "\x00" in text:
        raise ConfigError(field, f"{text[:60]!r} is not a file name", "give a file name, e.g. out.json")
    target = Path(os.path.realpath(text))  # a symlink is written through: its target is replaced
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise ConfigError(field, f"{text}: a part of the path is a file, not a directory",
                          "choose a path inside a directory") from None
    except OSError as e:
        raise ConfigError(field, f"{text}: {e.strerror}", "choose another path") from None
    if st is not None:
        kind = _kind(st.st_mode)
        if kind is not None:
            raise ConfigError(field, f"{text} is {kind}; topotrain writes only regular files",
                              "give the path of a file")
        if (st.st_dev, st.st_ino) in (_INPUTS.get() or ()):
            raise ConfigError(field, f"{text} is an input of this run; writing it would destroy it",
                              "choose another output path")
    elif str(target) in (_INPUTS.get() or ()):
        raise ConfigError(field, f"{text} is an input of this run", "choose another output path")
    parent = target.parent
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(field, f"{text}: {probe} is a file, not a directory", "choose a path inside a directory")
    if probe != parent and not make_parents:
        raise ConfigError(field, f"directory {parent} does not exist", "create it first or choose another path")
    if not os.access(probe, os.W_OK | os.X_OK):  # before the work, not after it (a read-only or immutable folder)
        raise ConfigError(field, f"{text}: cannot write in {probe} (the folder is read-only)",
                          "choose a path in a folder you can write")
    return target


class _Terminated(BaseException):
    """SIGTERM arrived during a write (raised so the temporary file is removed; the CLI exits 143)."""


@contextlib.contextmanager
def _term_cleans_up() -> Iterator[None]:
    """Within the block a default SIGTERM raises :class:`_Terminated` (main thread only; other handlers and
    an ignored SIGTERM are kept)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        yield
        return
    if previous is not signal.SIG_DFL:
        yield
        return

    def _on_term(signum: int, frame: FrameType | None) -> None:
        raise _Terminated()

    signal.signal(signal.SIGTERM, _on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object], *,
                 make_parents: bool = False, field: str = "output") -> Path:
    """Write a file all at once (see the module docstring): ``write`` fills a temporary file in the same
    directory, which is flushed to disk and then :func:`os.replace`-d over ``path``. Returns ``path``.
    A missing directory is created when ``make_parents``, else it is a ConfigError; so is every refusal of
    :func:`check_output_path` and any OS error while writing."""
    p = Path(path)
    target = check_output_path(p, field=field, make_parents=make_parents)
    parent = target.parent
    tmp: str | None = None
    made: list[Path] = []  # the folders this write creates: removed again if it fails (a failure writes nothing)
    try:
        with _term_cleans_up():
            if make_parents:
                probe = parent
                while not probe.exists() and probe != probe.parent:
                    made.append(probe)
                    probe = probe.parent
                parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{target.name[:_TMP_NAME_MAX]}.tmp-", suffix="")
            os.chmod(tmp, 0o666 & ~_umask())  # the mode open() would give (mkstemp makes it 0600)
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
            tmp = None
            made = []
    except _Terminated:
        raise SystemExit(128 + signal.SIGTERM) from None
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            raise
        raise ConfigError(field, f"cannot write {p}: {e.strerror or e}", "choose another path") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        for folder in made:  # innermost first; a folder someone else has filled meanwhile stays
            with contextlib.suppress(OSError):
                folder.rmdir()
    return p


def atomic_write_text(path: str | os.PathLike[str], text: str, *, make_parents: bool = False,
                      field: str = "output") -> Path:
    """:func:`atomic_write` of UTF-8 text."""
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")), make_parents=make_parents, field=field)
