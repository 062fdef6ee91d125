"""Output folders (``search --out``, ``validate --out``): checked before any work, and marked as topotrain's.

One rule for every output of topotrain: a missing folder on the way to an output (its parents included) is
created. An output *folder* is more than a file, so before a run writes into one:

* the path must be a folder or nothing: a file (the run's input, say), a device such as ``/dev/null``, a
  FIFO or a dangling symbolic link is refused, and so is a folder this user cannot write into;
* a folder that exists must be empty, or a topotrain result folder (it holds the marker file
  :data:`MARKER`, written by the run that made it), or the user says ``--force``: someone else's
  ``points.csv`` is never replaced silently.

:func:`check_out_dir` does the checks (nothing written); :func:`claim_out_dir` creates the folder and its
marker and returns what it created, so a refused or failed run can remove exactly that
(:func:`release_out_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path

from topotrain.util.atomic import atomic_write_text
from topotrain.util.errors import ConfigError

#: The file that says "topotrain wrote this folder" (its text names the verb that made it).
MARKER = ".topotrain"


def _refuse(field: str, message: str, fix: str = "choose another --out") -> ConfigError:
    return ConfigError(field, message, fix)


def check_out_dir(path: str | os.PathLike[str], *, field: str = "--out", force: bool = False) -> bool:
    """Whether the output folder ``path`` exists already; a ConfigError (and nothing written) where a run
    must not write into it (see the module docstring)."""
    text = os.fspath(path)
    if not text.strip() or "\x00" in text or not text.isprintable():
        raise _refuse(field, f"{text[:60]!r} is not a folder name", "give a folder, e.g. --out results")
    p = Path(text)
    try:
        if p.is_symlink() and not p.exists():
            raise _refuse(field, f"{text} is a symbolic link to nothing")
        if p.exists():
            if not p.is_dir():
                raise _refuse(field, f"{text} is not a folder (a file or a device)", "give a folder")
            if not os.access(p, os.W_OK | os.X_OK):
                raise _refuse(field, f"the folder {text} is not writable")
            entries = os.listdir(p)
            if entries and MARKER not in entries and not force:
                raise _refuse(field, f"{text} holds files topotrain did not write (no {MARKER} marker)",
                              "choose a new or empty folder, or pass --force to write into it")
            return True
        probe = p.absolute().parent
        while not probe.exists():
            if probe == probe.parent:
                break
            probe = probe.parent
        if not probe.is_dir():
            raise _refuse(field, f"{text}: {probe} is a file, not a folder")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise _refuse(field, f"cannot create {text}: {probe} is not writable")
    except OSError as e:
        raise _refuse(field, f"{text}: {e.strerror or e}") from None
    return False


def claim_out_dir(path: str | os.PathLike[str], verb: str, *, field: str = "--out") -> list[Path]:
    """Create the folder ``path`` (and missing parents) and its marker; the paths this call created, the
    deepest last."""
    p = Path(path)
    made: list[Path] = []
    missing = [q for q in (p, *p.absolute().parents) if not q.exists()]
    try:
        for q in reversed(missing):
            q.mkdir()
            made.append(q)
        marker = p / MARKER
        if not marker.exists():
            atomic_write_text(marker, f"topotrain {verb} output folder\n", field=field)
            made.append(marker)
    except FileExistsError:  # another run made it at the same moment: it is a folder now, or refused below
        if not p.is_dir():
            raise _refuse(field, f"{p} is not a folder") from None
    except OSError as e:
        release_out_dir(made)
        raise _refuse(field, f"cannot create {p}: {e.strerror or e}") from None
    return made


def release_out_dir(made: list[Path]) -> None:
    """Remove what :func:`claim_out_dir` created (the marker, then the folders it made, if empty)."""
    for q in reversed(made):
        try:
            if q.is_dir():
                q.rmdir()
            else:
                q.unlink(missing_ok=True)
        except OSError:
            pass
