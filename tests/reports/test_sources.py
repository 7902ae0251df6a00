"""Source detection and the one-line errors for bad sources."""

import json

import pytest

import report_fixtures as rf
from diagnose.errors import DiagnoseError, InputFileError
from diagnose.reports._sources import load_sources


def test_detects_each_kind(inputs):
    heads, run, checks = inputs
    s = load_sources([str(run), heads, checks])
    assert [h.data["schema"] for h in s.heads] == ["diagnose.heads/1"]
    assert len(s.runs) == 1 and len(s.runs[0].run.steps) == 300
    assert s.checks[0].data["findings"][0]["check"] == "causal_leak"
    assert s.heads[0].name.endswith("/heads") and s.runs[0].name.endswith("/exp1")


def test_single_source_and_objects(inputs):
    heads, run, _ = inputs

    class Result:  # what ablate_heads returns: anything with .to_json()
        def to_json(self):
            return json.loads(heads.read_text())

    s = load_sources(Result())
    assert len(s.heads) == 1 and s.heads[0].name == "reference heads (source 1)"
    assert len(load_sources(heads).heads) == 1
    from diagnose.reports._sources import _read_run

    assert len(load_sources([_read_run(run)]).runs) == 1


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"schema": "diagnose.heads/9", "heads": []}), "not a report source"),
    (json.dumps([1, 2]), "not a report source"),
    (json.dumps({"schema": "diagnose.heads/1", "model": {"n_layers": 2, "n_heads": 2}, "heads": []}),
     "non-empty"),
    (json.dumps({"schema": "diagnose.heads/1", "model": {"n_layers": 2, "n_heads": 2},
                 "heads": [{"layer": 5, "head": 0}]}), "heads[0]"),
    (json.dumps({"schema": "diagnose.checks/1", "findings": "none"}), "findings"),
])
def test_bad_file_names_the_file(tmp_path, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(InputFileError) as e:
        load_sources([bad])
    msg = str(e.value)
    assert str(bad) in msg and needle in msg and "\n" not in msg


def test_missing_path_and_non_run_folder(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        load_sources([tmp_path / "nope.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DiagnoseError) as e:  # the monitor's RunFolderError or our InputFileError
        load_sources([tmp_path / "empty"])
    assert str(tmp_path / "empty") in str(e.value)


def test_torn_last_line_is_tolerated(tmp_path):
    run = rf.write_run(tmp_path / "torn", steps=20, torn=True)
    s = load_sources([run])
    assert s.runs[0].run.steps["step"].max() == 19


def test_nothing_given():
    with pytest.raises(InputFileError, match="no sources"):
        load_sources([])
