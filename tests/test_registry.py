"""One registry pattern (diagnose/registry.py) behind every plug-in point: the same register,
unregister, get and order, the same errors, and the built-ins of each registered the same one way."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from diagnose.ablation import analyses, methods
from diagnose.adapters import _registry as adapters, norms
from diagnose.errors import ConfigError
from diagnose.io import _kinds as kinds
from diagnose.monitor import _detect as detect, _measure as measure
from diagnose import statistics
from diagnose.registry import Registry


@dataclass(frozen=True)
class Entry:
    name: str


def test_entries_keep_their_order_and_errors_name_the_registered_ones():
    loads = []
    reg = Registry("toy", builtins=lambda: loads.append(1) or (Entry("a"), Entry("b")))
    assert loads == []  # built-ins are registered on first use, not at construction
    reg.register(Entry("c"))
    assert reg.names() == ("a", "b", "c") and [e.name for e in reg] == ["a", "b", "c"] and loads == [1]
    with pytest.raises(ConfigError, match=r"toy 'a' is already registered \(registered: a, b, c\)"):
        reg.register(Entry("a"))
    with pytest.raises(ConfigError, match=r"toy 'z' is not one of a, b, c"):
        reg.get("z")
    with pytest.raises(ConfigError, match=r"toy 'z' is not registered \(registered: a, b, c\)"):
        reg.unregister("z")
    assert reg.unregister("z", missing_ok=True) is None
    assert reg.unregister("b") == Entry("b") and reg.names() == ("a", "c") and "b" not in reg
    assert reg.builtin() == (Entry("a"),)
    assert dict(reg.mapping()) == {"a": Entry("a"), "c": Entry("c")}


def test_replace_keeps_the_place_and_newest_first_puts_a_user_entry_before_the_builtins():
    reg = Registry("toy", key=lambda e: e.name[0], builtins=lambda: (Entry("a1"), Entry("b1")))
    reg.register(Entry("a2"), replace=True)
    assert [e.name for e in reg] == ["a2", "b1"] and reg.builtin() == (Entry("b1"),)
    first = Registry("toy", builtins=lambda: (Entry("a"), Entry("b")), newest_first=True)
    first.register(Entry("c"))
    first.register(Entry("d"))
    assert first.names() == ("d", "c", "a", "b")


def test_without_restores_the_same_entries_in_the_same_order_even_after_an_error():
    reg = Registry("toy", builtins=lambda: (Entry("a"), Entry("b"), Entry("c")))
    with pytest.raises(RuntimeError):
        with reg.without(["b"]):
            assert reg.names() == ("a", "c")
            raise RuntimeError("inside")
    assert reg.names() == ("a", "b", "c")
    with pytest.raises(ConfigError, match="'x' is not registered"):
        with reg.without(["x"]):
            pass


def test_a_check_runs_before_the_entry_is_added():
    def check(e: Entry) -> None:
        if e.name.startswith("_"):
            raise ConfigError(f"toy {e.name!r}: a name may not start with _")

    reg = Registry("toy", check=check)
    with pytest.raises(ConfigError, match="may not start"):
        reg.register(Entry("_x"))
    with pytest.raises(ConfigError, match="needs a name"):
        reg.register(Entry(""))
    assert reg.names() == ()


# the plug-in points (the six of issue 30, and the analysis steps): (registry, its first built-in names, a call that registers a taken or bad entry)
SIX = [
    (statistics.REGISTRY, ("entropy", "max_weight", "first_token"), lambda: statistics.register(
        statistics.STATISTICS["entropy"])),
    (methods.REGISTRY, ("zero", "mean", "resample"), lambda: methods.register_method(methods.get_method("zero"))),
    (measure.REGISTRY, ("loss",), lambda: measure.register_measurement(measure.REGISTRY.get("loss"))),
    (detect.REGISTRY, ("nonfinite",), lambda: detect.register_detector(detect.REGISTRY.get("nonfinite"))),
    (adapters.REGISTRY, ("reference", "transformer-lens", "hf-gpt2"),
     lambda: adapters.register_adapter(adapters.REGISTRY.get("reference"))),
    (kinds.REGISTRY, (), lambda: kinds.register_folder_kind(kinds.FolderKind("pruned", print))),  # no built-ins in io
    (norms.REGISTRY, ("torch.nn.modules.normalization.LayerNorm",), lambda: norms.REGISTRY.register(
        norms.NormClass(norms.nn.LayerNorm, norms.RMS_NORM))),
    (analyses.REGISTRY, (), lambda: analyses.register_analysis(analyses.Analysis("toy", print, option="nonesuch"))),
]


@pytest.mark.parametrize("registry, first, bad", SIX, ids=[row[0].what for row in SIX])
def test_every_plug_in_point_is_one_registry_with_its_builtins_declared_once(registry, first, bad):
    before = registry.names()
    assert isinstance(registry, Registry)
    assert registry.names()[:len(first)] == first
    assert [registry.get(name) for name in before] == list(registry)
    with pytest.raises(ConfigError, match="already registered|must start|not a field"):
        bad()
    assert registry.names() == before


def test_the_older_names_read_the_same_registries():
    assert list(measure.MEASUREMENTS) == list(measure.REGISTRY.entries())
    assert list(detect.DETECTORS) == list(detect.REGISTRY.entries()) and detect.kinds() == detect.REGISTRY.names()
    assert list(statistics.STATISTICS) == list(statistics.ATTENTION_STATS) == list(statistics.REGISTRY.names())
    assert tuple(methods.METHODS) == methods.REGISTRY.names()
    assert adapters.adapters() == list(adapters.REGISTRY.entries()) == adapters.builtin_adapters()
