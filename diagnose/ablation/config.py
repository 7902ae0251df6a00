"""AblationConfig: every setting of `ablate_heads`, in one frozen dataclass, checked once when built.

The one place that lists the options: `ablate_heads(model, data, **keywords)` maps its keywords onto
these fields, `ablate_heads(model, data, config=AblationConfig(...))` passes one whole, and the CLI
builds one from its flags. `ablate_together` and `prune_heads` take the same config (each reads the
fields it uses, TOGETHER and PRUNE below) and map their keywords onto it through `AblationConfig.of`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

from ..errors import ConfigError, UsageError
from ..objectives import TASKS
from . import significance
from .methods import _whole, check_draws, check_seed, get_method

DEFAULT_TOP = 5
FAST_RANK = "second_order_delta_loss"  # the cheap estimate closest to exact ablation (bench/bench_estimators.py)
RANKINGS = ("second_order_delta_loss", "estimated_delta_loss", "grad_importance_raw")
MIN_EFFECT = 0.05  # negligible: |delta loss| under 5 % of the baseline loss (contrast.default_band)
# the fields ablate_together and prune_heads read, which they also take as keywords
TOGETHER = ("task", "method", "batch_size", "draws", "seed", "distributed")
PRUNE = ("task", "method", "batch_size")
MAX_BATCH = 2 ** 31 - 1  # examples per batch at most (torch's sizes); min(data, batch) is what runs
MAX_BOOT = 100_000  # bootstrap resamples at most: the intervals keep [n_boot, heads] floats
MAX_KEEP = 100  # examples whose attention maps are kept for the report at most ([layers, heads, T, T] each)
SWITCHES = ("fast", "attention", "reuse", "direct")  # true or false


@dataclass(frozen=True)
class AblationConfig:
    """How `ablate_heads` sweeps and tests (ConfigError at construction for a bad value).

    task: "classification" or "lm". method: a registered ablation method (methods.py: "zero", "mean",
    "resample"). draws: donors per example for a random fill (resample; None: the method's default, 2).
    batch_size: examples per batch when `data` is not already batched (default 32).
    fast: rank every head by the `rank_by` estimate and ablate only the `top` first exactly (default 5).
    alpha, n_boot, seed: the tests' level, the bootstrap's resamples and its seed (also resample's donors).
    attention: also summarise each head's attention, keeping `keep` examples' maps for the report.
    reuse: replay the unchanged blocks below each ablated layer (off only to measure its worth).
    correction: "holm" or "bh" across the heads tested. min_effect: the negligible band for
    `striking_but_inert`, as a fraction of the baseline loss.
    together: groups of (layer, head) to also close at once (`result.together`); closed first, so a
    head that does not exist fails before the sweep.
    distributed: None shards the batches over the ranks of an initialised torch.distributed group
    (torchrun), True requires one, False runs alone.
    max_memory: a cap on one step's estimated memory (bytes, or a size such as "2GB"); the sweep's
    micro-batch and heads per forward are chosen to fit it and the free memory (plan.py).
    direct: also measure each exactly ablated head's direct effect (direct.py: removed on its direct
    path to the output only), `self_repair` and `compensated`; skipped, with the reason in
    `result.direct`, for families without a pre-norm residual stream.
    """

    task: str = "classification"
    method: str = "zero"
    draws: int | None = None
    batch_size: int | None = None
    fast: bool = False
    top: int | None = None
    alpha: float = 0.05
    n_boot: int = 2000
    seed: int = 0
    attention: bool = True
    keep: int = 3
    reuse: bool = True
    correction: str = "holm"
    min_effect: float = MIN_EFFECT
    rank_by: str = FAST_RANK
    together: Sequence[Sequence[tuple[int, int]]] = ()
    distributed: bool | None = None
    max_memory: int | str | None = None
    direct: bool = True

    def __post_init__(self) -> None:
        from .plan import parse_size  # torch's import waits until a config is made

        checks = (("task", self.task, TASKS), ("method", self.method, None),
                  ("correction", self.correction, significance.CORRECTIONS), ("rank_by", self.rank_by, RANKINGS))
        for name, value, allowed in checks:
            if not isinstance(value, str):
                raise ConfigError(f"{name} must be a name (a string), got {type(value).__name__} {value!r:.40}")
            if allowed is None:
                get_method(value)  # the registry names its own choices
            elif value not in allowed:
                raise ConfigError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        draws = check_draws(get_method(self.method), self.draws)
        checked = {"draws": None if self.draws is None else draws,  # numpy's integers stored as ints
                   "seed": check_seed(self.seed),
                   "batch_size": whole_in("batch_size", self.batch_size, 1, MAX_BATCH, optional=True),
                   "top": whole_in("top", self.top, 0, None, optional=True),
                   "n_boot": whole_in("n_boot", self.n_boot, 1, MAX_BOOT),
                   "keep": whole_in("keep", self.keep, 0, MAX_KEEP), "max_memory": parse_size(self.max_memory),
                   "alpha": _real_in("alpha", self.alpha, 0, 1, "a level strictly between 0 and 1, e.g. 0.05"),
                   "min_effect": _real_in("min_effect", self.min_effect, 0, None,
                                          "a finite fraction of the baseline loss, 0 or more"),
                   "together": _groups(self.together)}
        for name in SWITCHES:
            checked[name] = _switch(name, getattr(self, name))
        checked["distributed"] = None if self.distributed is None else _switch("distributed", self.distributed)
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, config: "AblationConfig | None", keywords: dict[str, Any], *, caller: str = "ablate_heads",
           options: Sequence[str] | None = None, **defaults: Any) -> "AblationConfig":
        """`config` (default: the defaults, then `defaults`) with `keywords` laid over it; UsageError for a
        keyword that is not one of `options` (default: every field), as Python raises for an unknown argument."""
        names = set(options) if options is not None else {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise UsageError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}; the options are "
                             f"{', '.join(sorted(names))}")
        if config is None:
            config = cls(**defaults) if defaults else None
        if config is not None and not isinstance(config, cls):
            raise UsageError(f"config must be an AblationConfig, got a {type(config).__name__}")
        return replace(config, **keywords) if config is not None else cls(**keywords)

    def n_top(self, n_total: int) -> int:
        """How many heads are ablated exactly: all, or with fast the `top` (default DEFAULT_TOP)."""
        return n_total if not self.fast else min(n_total, DEFAULT_TOP if self.top is None else int(self.top))


def whole_in(name: str, value: Any, low: int, high: int | None, *, optional: bool = False) -> int | None:
    """value as an int from low to high (None: no upper bound), numpy's integers included; ConfigError for
    anything else (a bool, a float, a string). optional: None stays None."""
    if value is None and optional:
        return None
    n = _whole(value)
    if n is None or n < low or (high is not None and n > high):
        upto = f"from {low} to {high:,}" if high is not None else f"{low} or more"
        raise ConfigError(f"{name} must be a whole number {upto}, got {type(value).__name__} {value!r:.40}")
    return n


def _real_in(name: str, value: Any, low: float, high: float | None, what: str) -> float:
    """value as a finite float, above low (strictly when high bounds it too) and below high; ConfigError otherwise."""
    x = None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):  # numpy's numbers too
        try:
            x = float(value)
        except OverflowError:  # an integer of 400 digits
            x = None
    inside = x is not None and math.isfinite(x) and (low < x < high if high is not None else x >= low)
    if not inside:
        raise ConfigError(f"{name} must be {what}, got {type(value).__name__} {value!r:.40}")
    return x


def _switch(name: str, value: Any) -> bool:
    """True or False (numpy's bools too); ConfigError for a string such as 'no', which Python would call true."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return bool(value)
    raise ConfigError(f"{name} must be True or False, got {type(value).__name__} {value!r:.40}")


def _groups(together: Any) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Groups of (layer, head) pairs of whole numbers, as tuples; ConfigError for anything else (a string)."""
    fix = "give groups of (layer, head) pairs, e.g. [[(0, 3), (0, 0)]]"
    if isinstance(together, (str, bytes)) or not isinstance(together, Sequence):
        raise ConfigError(f"together must be a list of groups of heads; {fix}, got {together!r:.40}")
    out = []
    for group in together:
        if isinstance(group, (str, bytes)) or not isinstance(group, Sequence):
            raise ConfigError(f"together: {group!r:.40} is not a group of heads; {fix}")
        pairs = []
        for pair in group:
            ok = not isinstance(pair, (str, bytes)) and isinstance(pair, Sequence) and len(pair) == 2
            layer, head = (_whole(pair[0]), _whole(pair[1])) if ok else (None, None)
            if layer is None or head is None or layer < 0 or head < 0:
                raise ConfigError(f"together: {pair!r:.40} is not a (layer, head) pair of whole numbers; {fix}")
            pairs.append((layer, head))
        out.append(tuple(pairs))
    return tuple(out)
