"""Report build time and size for a 12-layer x 12-head model and a 20,000-step run.

Inputs are synthetic but schema-valid (tests/reports/report_fixtures.py): a heads JSON with
three kept 64-token examples, and a run folder with per-layer statistics every step, attention
entropy every 50 steps and a few hundred alerts. Goal (issue 6): under 20 s and under 15 MB.
Prints the time of each phase: reading the sources, building views and pictures, rendering.

    .venv/bin/python bench/bench_report.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "reports"))

import report_fixtures as rf  # noqa: E402

from diagnose.reports._render import render  # noqa: E402
from diagnose.reports._sources import load_sources  # noqa: E402
from diagnose.reports._view import build_report  # noqa: E402

LIMIT_S, LIMIT_MB = 20.0, 15.0


def make_inputs(folder: Path) -> list[Path]:
    """The 12x12 heads JSON and the 20,000-step run folder of the size goal."""
    heads = rf.write_heads(folder / "heads.json", n_layers=12, n_heads=12, seq_len=64, n_kept=3,
                           vital=((3, 4), (7, 1), (10, 10)), inert=((0, 2), (1, 5)))
    alerts = [rf.alert(s) for s in range(1000, 20_000, 97)]
    alerts += [rf.alert(15_000, kind="nonfinite", severity="error", message="loss is NaN", hint="lower the lr")]
    run = rf.write_run(folder / "run", steps=20_000, n_layers=12, n_heads=12, attention_every=50,
                       alerts=alerts, nan_from=19_500)
    return [heads, run]


def measure(sources: list[Path], out: Path) -> dict[str, float]:
    """Wall and CPU seconds per phase (CPU time is what this process used: on a shared machine
    wall time also counts other processes' turns), and the file size."""
    c0, t0 = time.process_time(), time.perf_counter()
    loaded = load_sources(sources)
    t1 = time.perf_counter()
    report = build_report(loaded)
    t2 = time.perf_counter()
    html = render(report)
    out.write_text(html, encoding="utf-8")
    t3 = time.perf_counter()
    return {"read_s": t1 - t0, "build_s": t2 - t1, "render_s": t3 - t2, "total_s": t3 - t0,
            "cpu_s": time.process_time() - c0, "size_mb": out.stat().st_size / 1e6}


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        sources = make_inputs(folder)
        made = time.perf_counter() - t
        r = measure(sources, folder / "report.html")
    print(f"inputs: 12x12 heads, 3 kept examples x 64 tokens; 20,000-step run, 12 layers (made in {made:.1f} s)")
    print(f"read {r['read_s']:.2f} s  build {r['build_s']:.2f} s  render {r['render_s']:.2f} s")
    print(f"total {r['total_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU "
          f"(limit {LIMIT_S:.0f} s, ratio {r['total_s'] / LIMIT_S:.2f})  "
          f"size {r['size_mb']:.2f} MB (limit {LIMIT_MB:.0f} MB, ratio {r['size_mb'] / LIMIT_MB:.2f})")
    ok = r["total_s"] < LIMIT_S and r["size_mb"] < LIMIT_MB
    print("OK" if ok else "OVER LIMIT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
