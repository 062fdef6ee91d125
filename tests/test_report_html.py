"""The HTML report: self-contained (no network), every section present and read off the Result, and in a
real headless Chromium (Debian's ``chromium``) it renders every chart with no console message."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from topotrain.report.html import (
    collective_rows,
    links_figure,
    report_html,
    timeline_figure,
    utilization_colour,
    write_report,
)
from topotrain.scenario.load import dumps_resolved, load_resolved, load_scenario
from topotrain.training.simulate import simulate

SCENARIO = """
cluster:
  server: nvswitch-8
  servers: 2
  network: {topology: rail-optimized, link: ib-hdr-200g, latency: 1us}
model: {name: gpt3-1.3b, layers: 4}
batch: {global: 16, micro: 2}
plan: {tp: 4, pp: 2}
network: flow
"""
CHARTS = ("breakdown", "timeline", "memory", "links")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    d = tmp_path_factory.mktemp("html")
    (d / "s.yaml").write_text(SCENARIO)
    sc = load_scenario(d / "s.yaml")
    r = simulate(sc)
    write_report(d / "report.html", sc, r, dumps_resolved(load_resolved(d / "s.yaml")))
    return d / "report.html", sc, r


def test_self_contained_and_complete(report: tuple[Path, Any, Any]) -> None:
    path, sc, r = report
    text = path.read_text()
    page = _Page()
    page.feed(text)
    for tag, attrs in page.tags:  # nothing is fetched: no external script, style, image or frame
        for key in ("src", "href"):
            assert not attrs.get(key), (tag, attrs)
    ids = {a.get("id") for _, a in page.tags}
    assert set(CHARTS) <= ids
    assert text.count("Plotly.newPlot(") >= len(CHARTS)  # plotly.js inline, one call per chart
    body = "".join(page.text)
    for section in ("Summary", "Breakdown", "Timeline", "Memory per stage", "Busiest links", "Collectives",
                    "Scenario (resolved)"):
        assert section in body
    assert "rail-optimized" in body and "tp: 4" in body  # the resolved scenario
    data = json.loads(text.split("id=result-data>")[1].split("</script>")[0])
    assert data["iteration_time_s"] == r.iteration_time_s
    assert path.stat().st_mode & 0o044  # readable by others, as open() makes it (not mkstemp's 0600)


def _rgb(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def test_utilization_colour_is_on_the_0_to_100_percent_scale() -> None:
    """Issue 41 item 13: a link 4.7 % busy is pale, not red; only a saturated link is dark red."""
    low, mid, full = (_rgb(utilization_colour(u)) for u in (0.047, 0.5, 1.0))
    assert low[1] > 200 and low[0] == 255  # pale yellow: green channel high
    assert full == _rgb("#bd0026") and utilization_colour(3.0) == utilization_colour(1.0)
    assert utilization_colour(-1.0) == utilization_colour(0.0) == "#ffffb2"
    greens = [_rgb(utilization_colour(u / 20))[1] for u in range(21)]
    assert greens == sorted(greens, reverse=True) and greens[0] > greens[-1]  # darker as it gets busier
    assert mid[1] < low[1] and mid != full


def test_links_figure_labels_nodes_and_shows_the_scale(report: tuple[Path, Any, Any]) -> None:
    _, sc, r = report
    fig = links_figure(sc, r)
    texts = [t for tr in fig.data if tr.mode and "text" in tr.mode for t in (tr.text or ()) if t]
    assert texts, "nodes carry labels"
    busiest = [tr for tr in fig.data if tr.name and tr.name.startswith("#")]
    assert len(busiest) == len(r.link_utilization_top)
    for tr, (_, _, u) in zip(busiest, r.link_utilization_top, strict=True):
        assert tr.line.color == utilization_colour(u)
    assert any(tr.marker is not None and tr.marker.showscale for tr in fig.data)


def test_timeline_has_every_task_and_blocking_collective(report: tuple[Path, Any, Any]) -> None:
    _, _, r = report
    fig, dropped = timeline_figure(r)
    bars = sum(len(t.x) for t in fig.data)
    assert dropped == 0
    assert bars == sum(1 + len(t.blocking_slices()) for t in r.tasks if t.end_s >= t.start_s)
    assert any(t.name == "tp-comm" for t in fig.data)


def test_collective_table_sums_the_engines_times(report: tuple[Path, Any, Any]) -> None:
    _, _, r = report
    rows = collective_rows(r.tasks)
    comm = sum(t.end_s - t.start_s for t in r.tasks if t.comm is not None and t.comm.schedules)
    blocking = sum(b - a for t in r.tasks for _, a, b in t.blocking_slices())
    assert sum(x.total_s for x in rows) == pytest.approx(comm + blocking)
    assert {x.kind for x in rows} >= {"tp-comm", "dp-comm", "pp-comm"}
    assert sum(x.calls for x in rows if x.kind == "tp-comm") == sum(len(t.blocking_slices()) for t in r.tasks)


def test_timeline_cap_is_said(report: tuple[Path, Any, Any]) -> None:
    path, sc, r = report
    _, dropped = timeline_figure(r, max_bars=10)
    assert dropped > 0
    import topotrain.report.html as h

    old = h.TIMELINE_MAX_BARS
    try:
        h.TIMELINE_MAX_BARS = 10
        assert "bars past the first 10 are left out" in report_html(sc, r, "")
    finally:
        h.TIMELINE_MAX_BARS = old


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_renders_in_headless_chromium(report: tuple[Path, Any, Any], tmp_path: Path) -> None:
    path, _, _ = report
    shot = tmp_path / "shot.png"
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--window-size=1280,2400", "--virtual-time-budget=8000", "--enable-logging=stderr", "--v=0",
         f"--screenshot={shot}", "--dump-dom", path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, console  # the page logs nothing: no error, no warning
    dom = _Page()
    dom.feed(proc.stdout)
    rendered = {a.get("id") for _, a in dom.tags if "js-plotly-plot" in (a.get("class") or "")}
    assert set(CHARTS) <= rendered, rendered  # plotly drew every chart
    errors = proc.stdout.split('id="js-errors">', 1)[1].split("</div>", 1)[0]
    assert errors == "", errors  # the page's own error handler caught nothing
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(shot)[..., :3]
    assert img.shape[0] >= 2000 and img.shape[1] >= 1200
    # the breakdown bar's compute green (#76b900) and the timeline's forward blue (#1f77b4) are on screen
    for rgb in ((0x76, 0xB9, 0x00), (0x1F, 0x77, 0xB4)):
        hit = np.all(np.abs(img * 255 - np.array(rgb)) < 6, axis=-1).sum()
        assert hit > 500, rgb
