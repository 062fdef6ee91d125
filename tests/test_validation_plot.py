"""validation.png (issue 41 item 13): the cases of one size side by side in the right panel, sizes as
labelled categories."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from topotrain.validate.matrix import MatrixRun, Row, spread_positions, write_png


def test_cases_of_one_size_stand_side_by_side() -> None:
    xs, distinct = spread_positions([1024, 1 << 20, 1024, 1024, 1 << 30])
    assert distinct == [1024, 1 << 20, 1 << 30]
    at_1k = [xs[0], xs[2], xs[3]]
    assert len(set(at_1k)) == 3 and min(at_1k) >= -0.35 and max(at_1k) <= 0.35  # spread, inside category 0
    assert xs[1] == 1.0 and xs[4] == 2.0  # one case: on its category
    assert spread_positions([]) == ([], [])


def test_png_with_many_cases_at_one_size(tmp_path: Path) -> None:
    rows: list[Any] = []
    for i in range(12):
        case = SimpleNamespace(size_bytes=1 << 20, topology=f"t{i}", traffic="ring")
        rows.append(Row(case, {"flow": 1.0 + 0.01 * i, "simgrid": 1.0, "ns3": 1.02}))  # type: ignore[arg-type]
    out = write_png(MatrixRun(rows, []), tmp_path / "validation.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
