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

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
  key TEXT NOT NULL, stage TEXT NOT NULL, seq INTEGER NOT NULL, status TEXT NOT NULL, field TEXT NOT NULL,
  reason TEXT NOT NULL, choices TEXT NOT NULL, point TEXT NOT NULL, metrics TEXT NOT NULL,
  PRIMARY KEY (key, stage));
"""


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL: a committed row survives a killed process
        self.db.executescript(_SCHEMA)
        row = self.db.execute("SELECT v FROM meta WHERE k='fingerprint'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('fingerprint', ?)", (fingerprint,))
        elif row[0] != fingerprint:
            raise ConfigError("--resume", f"{self.path} holds a search of another space or other settings",
                              "resume with the same space file, or choose another --out")

    @classmethod
    def existing(cls, path: str | Path) -> ResultStore:
        """An existing store, to read (no fingerprint check)."""
        st = cls.__new__(cls)
        st.path = Path(path)
        st.db = sqlite3.connect(st.path, timeout=30, isolation_level=None)
        return st

    def done(self, stage: str) -> set[str]:
        """Keys of the points already evaluated at ``stage``."""
        return {k for (k,) in self.db.execute("SELECT key FROM results WHERE stage=?", (stage,))}

    def add(self, rec: dict[str, Any]) -> bool:
        """Commit one record (False, and nothing written, if that point and stage are stored already)."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO results VALUES (?,?,?,?,?,?,?,?,?)",
            (rec["key"], rec["stage"], rec["seq"], rec["status"], rec["field"], rec["reason"],
             _dumps(rec["choices"]), _dumps(rec["point"]), _dumps(rec["metrics"])))
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
        return [{"key": k, "stage": st, "seq": seq, "status": s, "field": f, "reason": r,
                 "choices": json.loads(c), "point": json.loads(p), "metrics": json.loads(m)}
                for k, st, seq, s, f, r, c, p, m in self.db.execute(q, tuple(args))]

    def close(self) -> None:
        self.db.close()
