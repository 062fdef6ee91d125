"""Search results on disk: one SQLite row per (point, stage), committed as each result arrives.

SQLite commits are atomic (a killed search leaves every committed row whole and nothing half-written), so
``--resume`` reads which (point, stage) pairs are done and evaluates only the others: nothing is lost,
nothing is evaluated twice. ``meta`` holds the fingerprint of the space, so a resume refuses a different
space.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from topotrain.util.errors import ConfigError

#: Longest wait for a store another process holds locked, in seconds (then: one error line, not a hang).
LOCK_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
  key TEXT NOT NULL, stage TEXT NOT NULL, seq INTEGER NOT NULL, status TEXT NOT NULL, field TEXT NOT NULL,
  reason TEXT NOT NULL, choices TEXT NOT NULL, point TEXT NOT NULL, metrics TEXT NOT NULL,
  PRIMARY KEY (key, stage));
"""


def _store_error(path: Path, e: sqlite3.Error) -> ConfigError:
    text = str(e)
    if "locked" in text or "busy" in text:
        return ConfigError("--out", f"{path} is locked by another process (waited {LOCK_TIMEOUT_S:g} s)",
                           "wait for the other search to end, or choose another --out")
    if isinstance(e, sqlite3.OperationalError) and ("disk" in text or "full" in text or "readonly" in text
                                                    or "I/O" in text):
        return ConfigError("--out", f"cannot write {path}: {text}", "free space, or choose another --out")
    return ConfigError("--resume", f"{path} is not a topotrain results store ({text})",
                       "choose another --out, or remove the file")


def _check_existing(path: Path, fingerprint: str) -> None:
    """An existing store must be topotrain's (a ``meta`` table with a fingerprint and a ``results`` table)
    and of the same search: checked by reading only, so a refused file is never changed."""
    try:
        db = sqlite3.connect(path, timeout=LOCK_TIMEOUT_S)  # read only: a refused file is left as it is
        try:
            tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            row = db.execute("SELECT v FROM meta WHERE k='fingerprint'").fetchone() if "meta" in tables else None
        finally:
            db.close()
    except sqlite3.Error as e:
        raise _store_error(path, e) from None
    if row is None or "results" not in tables:
        raise ConfigError("--resume", f"{path} is not a topotrain results store",
                          "choose another --out, or remove the file")
    if row[0] != fingerprint:
        raise ConfigError("--resume", f"{path} holds a search of another space or other settings",
                          "resume with the same space file, or choose another --out")


def _dumps(x: Any) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"))


class ResultStore:
    """The results of one search (``results.sqlite`` in its output folder)."""

    def __init__(self, path: str | Path, fingerprint: str, resume: bool) -> None:
        self.path = Path(path)
        existed = self.path.exists()
        if existed and not resume:
            raise ConfigError("--out", f"{self.path} holds a search already",
                              "pass --resume to continue it, or choose another --out")
        #: whether this store made its file (a run that fails before storing anything removes it again)
        self.created = not existed
        if existed:
            _check_existing(self.path, fingerprint)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT_S, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL: a committed row survives a killed process
            self.db.executescript(_SCHEMA)
            row = self.db.execute("SELECT v FROM meta WHERE k='fingerprint'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('fingerprint', ?)", (fingerprint,))
        except sqlite3.Error as e:
            if self.created:
                self.remove()
            raise _store_error(self.path, e) from None

    @classmethod
    def existing(cls, path: str | Path) -> ResultStore:
        """An existing store, to read (no fingerprint check)."""
        st = cls.__new__(cls)
        st.path = Path(path)
        try:
            st.db = sqlite3.connect(st.path, timeout=LOCK_TIMEOUT_S, isolation_level=None)
            st.db.execute("SELECT 1 FROM results LIMIT 1").fetchall()
        except sqlite3.Error as e:
            raise _store_error(st.path, e) from None
        return st

    def done(self, stage: str) -> set[str]:
        """Keys of the points already evaluated at ``stage``."""
        try:
            return {k for (k,) in self.db.execute("SELECT key FROM results WHERE stage=?", (stage,))}
        except sqlite3.Error as e:
            raise _store_error(self.path, e) from None

    def add(self, rec: dict[str, Any]) -> bool:
        """Commit one record (False, and nothing written, if that point and stage are stored already)."""
        try:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO results VALUES (?,?,?,?,?,?,?,?,?)",
                (rec["key"], rec["stage"], rec["seq"], rec["status"], rec["field"], rec["reason"],
                 _dumps(rec["choices"]), _dumps(rec["point"]), _dumps(rec["metrics"])))
        except sqlite3.Error as e:  # a full disk, a store locked past the timeout: one line, rows so far kept
            raise _store_error(self.path, e) from None
        return cur.rowcount == 1

    def get(self, key: str, stage: str) -> dict[str, Any] | None:
        rows = self._select("WHERE key=? AND stage=?", (key, stage))
        return rows[0] if rows else None

    def records(self, stage: str | None = None) -> list[dict[str, Any]]:
        """Every record (of one stage), in search order."""
        if stage is None:
            return self._select("ORDER BY seq, stage", ())
        return self._select("WHERE stage=? ORDER BY seq", (stage,))

    def _select(self, where: str, args: Iterable[Any]) -> list[dict[str, Any]]:
        q = f"SELECT key, stage, seq, status, field, reason, choices, point, metrics FROM results {where}"
        try:
            return [{"key": k, "stage": st, "seq": seq, "status": s, "field": f, "reason": r,
                     "choices": json.loads(c), "point": json.loads(p), "metrics": json.loads(m)}
                    for k, st, seq, s, f, r, c, p, m in self.db.execute(q, tuple(args))]
        except sqlite3.Error as e:
            raise _store_error(self.path, e) from None
        except (ValueError, TypeError) as e:  # a row that is not topotrain's JSON: a damaged store
            raise ConfigError("--out", f"{self.path} holds a damaged row ({type(e).__name__})",
                              "choose another --out, or remove the file") from None

    def close(self) -> None:
        self.db.close()

    def remove(self) -> None:
        """Close and delete the store's files (a refused or failed run that stored nothing)."""
        db = getattr(self, "db", None)
        if db is not None:
            db.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
