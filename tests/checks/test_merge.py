"""Findings.merge: what `diagnose check --run` and the encoder-decoder checks combine."""

from diagnose.checks import Finding, Findings


def _run(check):
    return Findings([Finding(check, "warning", "bad", {"x": 1.0}, "fix it")], model={"family": "other"},
                    passed=["ok"], skipped=[{"check": "gone", "why": "cannot"}])


def test_merge_keeps_the_model_and_adds_everything_else():
    merged = Findings(model={"family": "mine"}, passed=["p"]).merge(_run("warmup"))
    assert merged.model == {"family": "mine"}
    assert [f.check for f in merged] == ["warmup"] and merged[0].title == "bad"
    assert merged.passed == ["p", "ok"] and merged.skipped == [{"check": "gone", "why": "cannot"}]
    assert merged.to_json()["schema"] == "diagnose.checks/1"


def test_merge_of_a_part_names_it_everywhere():
    merged = Findings().merge(_run("causal"), part="encoder").merge(_run("padding"), part="decoder")
    assert [(f.check, f.title, f.evidence["part"]) for f in merged] == [
        ("causal", "encoder: bad", "encoder"), ("padding", "decoder: bad", "decoder")]
    assert merged.passed == ["encoder.ok", "decoder.ok"]
    assert [s["check"] for s in merged.skipped] == ["encoder.gone", "decoder.gone"]
