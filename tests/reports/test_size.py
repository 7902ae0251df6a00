"""Report size, a property of the output: a 12-layer x 12-head model and a 20,000-step run weigh
under 15 MB (the same inputs as bench/bench_report.py), and 48 x 48 heads under 7.5 MB.

Time and memory depend on the machine, so they are no test's business: bench/bench_report.py
measures them against their goals (20 s; 60 s and 2 GB for 80 x 64 heads) and bench/README.md
holds the figures."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_report  # noqa: E402


@pytest.mark.slow
def test_big_report_within_its_size(tmp_path):
    sources = bench_report.make_inputs(tmp_path)
    r = bench_report.measure(sources, tmp_path / "report.html")
    assert r["size_mb"] < bench_report.LIMIT_MB, r
    html = (tmp_path / "report.html").read_text()
    assert html.count("<img class=\"plot") == 7 and "L7.H1" in html


@pytest.mark.slow
def test_a_48_by_48_model_renders_as_images_within_its_size(tmp_path):
    """Issue 14: seaborn's cell-by-cell grids took 4.4 GB for 32 x 32 heads and more for bigger ones;
    drawn as images (three pictures, not a grid of cells), 48 x 48 with kept maps stays under half
    of 15 MB and lists every layer's heads. Its memory is bench/bench_report.py's to measure."""
    import json

    src = tmp_path / "heads.json"
    src.write_text(json.dumps(bench_report.rf.make_heads(48, 48, seq_len=16, n_kept=2, vital=((5, 7),),
                                                         inert=((1, 1), (40, 3)))))
    r = bench_report.run_report(src, tmp_path / "report.html")
    assert r["size_mb"] < 15 / 2, r
    html = (tmp_path / "report.html").read_text()
    assert html.count('<details class="layer"') == 48 and "<tr><td>L47.H47</td>" in html
    assert html.count('<img class="plot') == 3
