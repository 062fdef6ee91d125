"""Start-up stays light (issue 40: a small case costs what it computes): ``topotrain collective`` imports neither
networkx, scipy nor numba before it has work for them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
HEAVY = ("networkx", "scipy", "numba", "torch", "matplotlib", "pandas")


def imported_after(code: str) -> list[str]:
    """Which of :data:`HEAVY` a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=env)
    return out.stdout.split()


def test_the_collective_verb_imports_no_heavy_library() -> None:
    assert imported_after("import topotrain.cli.collective") == []
