"""`diagnose report` from the command line: detection, one-line errors, nothing half-written."""

import json
import sys
from pathlib import Path

from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))
import report_fixtures as rf  # noqa: E402

from diagnose.cli.main import cli  # noqa: E402


def _stub_plots(monkeypatch):
    # the CLI's job is parsing and errors; drawing is tested in tests/reports
    from diagnose.reports import _plots_heads as plots_heads, _plots_training as plots_training

    for mod, names in ((plots_heads, ("head_grids", "attention_grids", "scatter")),
                       (plots_training, ("loss_lr", "grad_norms", "depth_over_time", "entropy"))):
        for name in names:
            monkeypatch.setattr(mod, name, lambda v: "data:image/svg+xml;base64,")


def test_writes_report_from_files_and_folders(tmp_path, monkeypatch):
    _stub_plots(monkeypatch)
    heads = rf.write_heads(tmp_path / "heads.json")
    run = rf.write_run(tmp_path / "exp1", steps=30, alerts=[rf.alert(5)])
    out = tmp_path / "out" / "report.html"
    res = CliRunner().invoke(cli, ["report", str(heads), str(run), "-o", str(out), "--title", "My <run>"])
    assert res.exit_code == 0, res.output
    assert str(out.resolve()) in res.output
    text = out.read_text()
    assert "<title>My &lt;run&gt;</title>" in text and '<section id="training">' in text


def test_bad_source_one_line_exit_2_nothing_written(tmp_path):
    heads = rf.write_heads(tmp_path / "heads.json")
    bad = tmp_path / "notes.json"
    bad.write_text(json.dumps({"hello": 1}))
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(heads), str(bad), "-o", str(out)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(bad) in lines[0]
    assert "Traceback" not in res.output
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["heads.json", "notes.json"]


def test_missing_and_non_run_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    for src in (tmp_path / "missing.json", tmp_path / "empty"):
        res = CliRunner().invoke(cli, ["report", str(src), "-o", str(tmp_path / "r.html")])
        assert res.exit_code == 2 and str(src) in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_help_has_an_example():
    res = CliRunner().invoke(cli, ["report", "--help"])
    assert res.exit_code == 0
    assert "Example: diagnose report heads.json runs/exp1 -o report.html" in res.output
    res = CliRunner().invoke(cli, ["report"])
    assert res.exit_code == 2  # SOURCES is required


def test_unwritable_output_is_one_line(tmp_path, monkeypatch):
    _stub_plots(monkeypatch)
    heads = rf.write_heads(tmp_path / "heads.json")
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = CliRunner().invoke(cli, ["report", str(heads), "-o", str(blocker / "r.html")])
    assert res.exit_code == 2 and "cannot write the -o" in res.output and "Traceback" not in res.output
    assert "not a folder" in res.output  # the fix names the cause: a parent is a file
