"""Results written to disk are written atomically: a temporary file in the same folder, then a rename."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from topotrain.errors import ConfigError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object], *,
                 make_parents: bool = False) -> Path:
    """Write a file all at once: ``write`` fills a temporary file in the same directory, which is flushed to
    disk and then :func:`os.replace`-d over ``path`` (readers never see half a file). A missing directory
    is created when ``make_parents``, else it is a ConfigError."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if make_parents:
        parent.mkdir(parents=True, exist_ok=True)
    elif not parent.is_dir():
        raise ConfigError("path", f"directory {parent} does not exist", "create it first or choose another path")
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # the mode open() would give (mkstemp makes it 0600)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def atomic_write_text(path: str | os.PathLike[str], text: str, *, make_parents: bool = False) -> Path:
    """:func:`atomic_write` of UTF-8 text."""
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")), make_parents=make_parents)
