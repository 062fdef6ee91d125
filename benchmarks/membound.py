"""Memory-bound kernels against NeuSight's measurements held out of the fit (docs/validation.md §8, "Memory-bound
kernels from measurements").

Run: ``.venv/bin/python benchmarks/membound.py`` (a few seconds). Per measured GPU and kernel class
(:mod:`topotrain.compute.membound`): the latency floor, the streaming intercept, the bandwidth fraction (the
median; norm and softmax also at row lengths 1,024 / 2,048 / 4,096 / 12,288), then ``|predicted/measured − 1|``
on rows held out of the fit: 4-fold over rows (all rows, and those of at least 4x L2), and for norm and softmax
each row length of the test grid left out in turn. Last, the fractions the catalog GPUs take.
"""

from __future__ import annotations

from topotrain.compute import membound
from topotrain.hardware.gpus import GPUS

WIDTHS = (1024, 2048, 4096, 12288)


def main() -> None:
    print(f"{'device':16s} {'class':11s} {'rows':>5s} {'latency':>8s} {'intercept':>9s} {'fraction':>8s}  "
          f"{'by row length ' + '/'.join(map(str, WIDTHS)):32s} held out: median / p90 / worst")
    for rows in membound.load_rows():
        f = membound.device_fit(rows.device.name, rows.cls)
        assert f is not None
        widths = "" if rows.cls == "elementwise" else " / ".join(f"{f.fraction(w):.2f}" for w in WIDTHS)
        checks = "; ".join(f"{h.check} ({h.rows}) {100 * h.median:.1f}/{100 * h.p90:.1f}/{100 * h.worst:.1f}%"
                           for h in membound.cross_validated_errors(rows))
        print(f"{rows.device.name:16s} {rows.cls:11s} {len(rows):5d} {1e6 * f.latency_s:6.1f}us "
              f"{1e6 * f.intercept_s:7.1f}us {f.fraction():8.3f}  {widths:32s} {checks}")
    print("\ncatalog GPU: bandwidth fraction used by memory_model: measured (elementwise; norm at hidden 2048/12288;"
          " softmax at row 512/2048)")
    for name in sorted(GPUS):
        fr = membound.bandwidth_fraction
        print(f"  {name:10s} elementwise {fr(name, 'elementwise'):.3f}  norm {fr(name, 'norm', 2048):.3f}/"
              f"{fr(name, 'norm', 12288):.3f}  softmax {fr(name, 'softmax', 512):.3f}/{fr(name, 'softmax', 2048):.3f}"
              f"  ({membound.fraction_source(name)})")


if __name__ == "__main__":
    main()
