"""Analysis steps: what `ablate_heads` runs after the sweep, each adding one table (a `Section`) to the result.

A step reads the model, its sites, the batches, the config and the assembled result (every head's effect,
role and verdict) and returns one `diagnose.schema.Section`. The result carries it in `sections`, its JSON
writes it under `sections`, `diagnose heads` prints it through its one table printer (cli/_table.py) and
the report validates it (`Section.from_json`) and draws it through its one table macro
(reports/templates/_section.html.j2): a new analysis needs nothing in the CLI's, the JSON's or the
report's code. The files it costs are listed in docs/development.md:

    its compute file    the step, and `register_analysis(Analysis(name, run, option=...))` at its end
    BUILTINS below      the compute file's module, so that the engine imports (registers) it
    ablation/config.py  its option, a field of AblationConfig (`option` names it; None: every sweep)
    cli/heads.py        the option's flag, when the CLI should set it
    its test, and docs/heads.md

A step runs on every rank under torch.distributed (the batches are the whole data; `distributed` says
whether a group is active), in eval mode; it must leave the model as it found it (hooks removed in
`finally`, weights untouched). A step that cannot measure raises (a DiagnoseError naming what and the fix)
or returns its Section with no rows and a `note` saying why: never an empty table without a reason.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import Any, Callable

from ..errors import ConfigError
from ..registry import Registry
from ..schema import Section

BUILTINS: tuple[str, ...] = ()  # modules whose import registers the shipped analysis steps


@dataclass(frozen=True)
class AnalysisInput:
    """What a step may read: the sweep's model, sites and batches, its config and its assembled result."""

    model: Any  # torch.nn.Module, in eval mode
    sites: list  # the AttentionSites swept
    batches: Any  # the Batches of (inputs, labels), the whole data set
    config: Any  # the AblationConfig of the sweep
    result: Any  # the HeadsResult so far (heads, baseline, flags, ...), without sections
    distributed: bool = False  # a torch.distributed group is active: the step runs on every rank


@dataclass(frozen=True)
class Analysis:
    """One analysis step: `run(AnalysisInput) -> Section` (named `name`), when its option is on."""

    name: str  # the section's name
    run: Callable[[AnalysisInput], Section]
    option: str | None = None  # the AblationConfig field that turns it on; None: it runs in every sweep


def _check(step: Analysis) -> None:
    """A step's name must be a section's name, and its option a field of AblationConfig."""
    from .config import AblationConfig

    Section(step.name, step.name, ())
    options = {f.name for f in fields(AblationConfig)}
    if step.option is not None and step.option not in options:
        raise ConfigError(f"analysis step {step.name!r}: option {step.option!r} is not a field of AblationConfig; "
                          f"add it there (ablation/config.py), or use one of {', '.join(sorted(options))}")


def _builtins() -> list[Analysis]:
    """The shipped steps: importing each module of BUILTINS registers its step (at its end)."""
    for module in BUILTINS:
        importlib.import_module(module)
    return []


# name -> step, run in the order registered (the one registry pattern, diagnose/registry.py)
REGISTRY: Registry[Analysis] = Registry("analysis step", check=_check, builtins=_builtins)
ANALYSES = REGISTRY.mapping()  # the same, read as a dict


def register_analysis(step: Analysis) -> Analysis:
    """Add a step (a ConfigError for a taken name, or an option that is no AblationConfig field)."""
    return REGISTRY.register(step)


def unregister_analysis(name: str) -> Analysis:
    """Remove a step (a test's toy entry); ConfigError for a name that is not registered."""
    return REGISTRY.unregister(name)


def run_analyses(given: AnalysisInput) -> list[Section]:
    """Every registered step whose option is on, in order, each checked to return its own Section."""
    out = []
    for step in list(REGISTRY):
        if step.option is not None and not getattr(given.config, step.option):
            continue
        section = step.run(given)
        if not isinstance(section, Section) or section.name != step.name:
            raise ConfigError(f"analysis step {step.name!r} returned {type(section).__name__} "
                              f"{getattr(section, 'name', '')!r}; it must return a Section named {step.name!r}")
        out.append(section)
    return out
