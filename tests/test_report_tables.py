"""Benchmark tables written as CSV and JSON hold the same rows."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from topotrain.report.tables import write_table


def test_csv_and_json_hold_the_same_rows(tmp_path: Path) -> None:
    rows = [{"size_bytes": 2**20, "algorithm": "ring", "time_s": 1.25e-3},
            {"size_bytes": 2**24, "algorithm": "hdrm", "time_s": 0.5, "note": "x, y"}]
    c, j = write_table(rows, tmp_path / "sub" / "t", {"benchmark": "test"})
    assert (c.name, j.name) == ("t.csv", "t.json")
    got = list(csv.DictReader(c.open()))
    assert [r["algorithm"] for r in got] == ["ring", "hdrm"] and got[1]["note"] == "x, y" and got[0]["note"] == ""
    assert [float(r["time_s"]) for r in got] == [1.25e-3, 0.5]
    doc = json.loads(j.read_text())
    assert doc["meta"] == {"benchmark": "test"} and doc["rows"] == rows
