"""Tables as files: the rows a benchmark prints, also written as CSV and JSON (atomically), so that docs
and plots come from the same numbers as the printed text."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from topotrain.util import jsonsafe
from topotrain.util.atomic import atomic_write_text


def write_table(rows: Sequence[Mapping[str, Any]], path_stem: str | Path, meta: Mapping[str, Any] | None = None
                ) -> tuple[Path, Path]:
    """Write ``rows`` (one mapping per row, the same keys in each) to ``STEM.csv`` and ``STEM.json``
    (``{"meta": ..., "rows": [...]}``); parent folders are created. Returns both paths."""
    stem = Path(path_stem)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(dict(r))
    csv_path = atomic_write_text(stem.with_suffix(".csv"), buf.getvalue(), make_parents=True)
    doc = {"meta": dict(meta or {}), "rows": [dict(r) for r in rows]}
    json_path = atomic_write_text(stem.with_suffix(".json"), jsonsafe.dumps(doc, indent=1) + "\n", make_parents=True)
    return csv_path, json_path
