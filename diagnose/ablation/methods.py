"""Ablation methods: what a closed head's output becomes. One registry, read by the sweep, `ablate_together`,
prune and the CLI's `--method` choices.

A method is one `AblationMethod` entry:
- `prepare(data_pass) -> state`: the pass over the data it needs before the sweep (None: none). "mean"
  averages every head's output over the data's real tokens; "zero" needs nothing.
- `fill(state, site, head_out, rows, draw) -> tensor or None`: what the closed heads' outputs become for
  each row of the batch the gate sees (None: 0); `rows` are the rows' indices in the data set (through
  micro-batches, replicas and rank shards), `draw` which of the method's `draws` this forward is. The
  gate blends it in as
  `scale * head_out + (1 - scale) * fill`, so the same fill serves exact ablation (scale 0), the
  --fast gradients (d loss / d scale = head_out - fill) and prune's closed heads.
- `draws`: forwards per closed head whose per-example outcomes are averaged (a random fill; 1 otherwise).
- `foldable`: the fill is one constant [H, D] per site (the state itself, or None for 0), so a closed head
  can be folded into the output projection's bias; prune cuts only with such methods.

Adding a method is one `register_method(AblationMethod(...))` (a `Registry`, diagnose/registry.py) plus its test; the CLI, the JSON's `method`
and prune pick it up from here. Torch is imported inside the entries' functions only: the CLI reads the
names without it (`diagnose --help` stays instant).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from ..errors import ConfigError, UsageError
from ..registry import Registry
from .resample import DRAWS, MAX_DRAWS, MAX_SEED, resample_fill, resample_outputs

if TYPE_CHECKING:
    import torch

    from .sweep import Sweep


@dataclass(frozen=True)
class DataPass:
    """What a method's `prepare` gets: the sweep (model, sites, gates, forward counter), this rank's
    batches, `reduce(tensors, numbers)` that adds up the other ranks' shares (None when alone; a sum of
    zero-filled buffers each rank writes its own rows into is a gather), a `tick()` per batch for
    progress (or None), `first`, the data set's index of the first example of `batches`, and for a random
    fill the `draws` asked for (None: the method's own) and the `seed` of its generator."""

    sweep: "Sweep"
    batches: Sequence[tuple[Any, Any]]
    reduce: Callable[[list, list], tuple[list, list]] | None = None
    tick: Callable[[], None] | None = None
    first: int = 0
    draws: int | None = None
    seed: int = 0


# fill(state, site index, head_out [B, T, H, D], rows [B] the data set's index of each row, draw) -> a tensor
# broadcastable to [B, T, H, D], or None for 0
Fill = Callable[[Any, int, "torch.Tensor", "torch.Tensor | None", int], "torch.Tensor | None"]


@dataclass(frozen=True)
class AblationMethod:
    """One way of closing a head (see the module docstring)."""

    name: str
    help: str  # one line for `--help`
    fill: Fill
    prepare: Callable[[DataPass], Any] | None = None
    foldable: bool = False
    draws: int = 1

    def __post_init__(self) -> None:
        if int(self.draws) < 1 or (self.foldable and self.draws != 1):
            raise ConfigError(f"method {self.name!r}: draws must be at least 1, and 1 for a foldable (constant) fill")


# every method, in registration order; the built-ins are _BUILTINS at the end of this file
REGISTRY: Registry[AblationMethod] = Registry("ablation method", builtins=lambda: _BUILTINS)


def register_method(method: AblationMethod, *, replace: bool = False) -> AblationMethod:
    """Add `method` to the registry (replace=True overwrites an entry of the same name)."""
    return REGISTRY.register(method, replace=replace)


def unregister_method(name: str) -> None:
    """Remove a registered method (a test's toy entry, say)."""
    REGISTRY.unregister(name, missing_ok=True)


def get_method(name: str) -> AblationMethod:
    """The entry called `name`; ConfigError naming the choices when there is none."""
    return REGISTRY.get(name)


class _Names(Sequence[str]):
    """The registered method names, read live (a method registered later shows up)."""

    def __init__(self, keep: Callable[[AblationMethod], bool] = lambda m: True):
        self._keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(m.name for m in REGISTRY if self._keep(m))

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


METHODS: Sequence[str] = _Names()  # every method, in registration order
FOLDABLE: Sequence[str] = _Names(lambda m: m.foldable)  # the methods prune can cut with


def prepare(method: AblationMethod, data_pass: DataPass) -> Any:
    """Run `method`'s data pass (if any) and set its fill on every gate of the sweep; returns the state
    (for a foldable method: one [H, D] per site, or None for 0)."""
    draws = check_draws(method, data_pass.draws)
    state = method.prepare(replace(data_pass, draws=draws)) if method.prepare is not None else None
    install(method, state, data_pass.sweep.gates)
    data_pass.sweep.draws = draws
    return state


@dataclass(frozen=True)
class Prepared:
    """A method with the state its `prepare` returned and its draws: `use(sweep)` sets its fill on the
    sweep's gates again, so one sweep can switch between methods prepared before it (ablate_methods)."""

    method: AblationMethod
    state: Any
    draws: int

    def use(self, sweep: "Sweep") -> None:
        install(self.method, self.state, sweep.gates)
        sweep.draws = self.draws


def check_draws(method: AblationMethod, draws: int | None, name: str = "draws") -> int:
    """The draws `method` runs with: `draws` (None: the method's own); ConfigError for a fill that is
    not random (a foldable method has one draw), or a draws that is not a whole number from 1 to MAX_DRAWS.
    name: how the caller's user spelled the setting (`--draws`), for the message."""
    if draws is None:
        return method.draws
    value = _whole(draws)
    if value is None or value < 1:
        raise ConfigError(f"{name} must be a whole number from 1 to {MAX_DRAWS}, got {type(draws).__name__} "
                          f"{draws!r:.40}")
    if method.foldable and value != 1:
        raise ConfigError(f"{name} applies to a random fill such as resample; method {method.name!r} has one draw, "
                          f"so {name} {value} would be ignored: leave it out")
    if value > MAX_DRAWS:
        raise ConfigError(f"{name} {value} is more than {MAX_DRAWS} (each draw is one more forward per closed "
                          f"head); lower it")
    return value


def method_names(methods: Any, name: str = "methods") -> list[str]:
    """`methods` as a list of registered names, each once; UsageError for a string (which would be read
    letter by letter) or anything that is not a sequence of strings, ConfigError for an unknown name."""
    given = list(methods) if isinstance(methods, Iterable) and not isinstance(methods, (str, bytes, dict)) else None
    if given is None or not all(isinstance(m, str) for m in given):
        raise UsageError(f"{name} must be a list of method names such as ['zero', 'mean'], got {methods!r:.60}"
                         + (" (split the string: methods.split(','))" if isinstance(methods, str) else ""))
    names = list(dict.fromkeys(given))
    for n in names:
        get_method(n)
    return names


def check_compared_draws(names: Sequence[str], draws: int | None, name: str = "draws") -> None:
    """ConfigError for a `draws` given to a comparison of methods none of which is a random fill (it would
    be ignored), or one that is not a valid draws for the random ones."""
    if draws is None:
        return
    random = [m for m in (get_method(n) for n in names) if not m.foldable]
    if not random:
        which = f"method {names[0]!r} is not" if len(names) == 1 else f"none of {', '.join(names)} is"
        raise ConfigError(f"{name} applies to a random fill such as resample; {which} one, "
                          f"so {name} {draws!r:.20} would be ignored: leave it out or use resample")
    for m in random:
        check_draws(m, draws, name)


def check_seed(seed: Any, name: str = "seed") -> int:
    """`seed` if it is a whole number from 0 to 2**63 - 1 (what the donors' and the bootstrap's generators take)."""
    value = _whole(seed)
    if value is None or not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{name} must be a whole number from 0 to 2**63 - 1, got {seed!r:.40}")
    return value


def _whole(value: Any) -> int | None:
    """value as an int when it is a whole number (a Python or numpy integer; not a bool, float or string)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def install(method: AblationMethod, state: Any, gates: Sequence[Any]) -> None:
    """Set `method`'s fill, with a state `prepare` returned, on each gate (gates in site order)."""
    for s, gate in enumerate(gates):
        gate.fill = _bound(method.fill, state, s)


def _bound(fill: Fill, state: Any, site: int) -> Callable[["torch.Tensor", "torch.Tensor | None", int], Any]:
    def bound(head_out, rows, draw):
        return fill(state, site, head_out, rows, draw)
    return bound


# ---- the entries ---------------------------------------------------------------------------------


def _zero_fill(state: Any, site: int, head_out, rows, draw):
    return None


def _mean_fill(state: Any, site: int, head_out, rows, draw):
    return state[site]  # [H, D]


def _mean_outputs(data_pass: DataPass) -> list:
    """Each head's output averaged over the data set's real tokens, examples and positions pooled.

    One [H, D] per site: a per-position mean would leak position information the head did not carry.
    """
    import torch

    from .batches import padding_mask
    from .observe import observe_heads

    sweep = data_pass.sweep
    sums: list[torch.Tensor | None] = [None] * len(sweep.sites)
    counts = [0.0] * len(sweep.sites)
    mask_now: list[torch.Tensor | None] = [None]

    def observer(s: int):
        def observe(head_out: torch.Tensor) -> None:  # [B, T, H, D]
            x = head_out.detach().float()
            mask = mask_now[0]
            if mask is not None and tuple(mask.shape) == tuple(x.shape[:2]):
                w = mask.to(x.dtype)[:, :, None, None]  # [B, T, 1, 1]
                total, n = (x * w).sum((0, 1)), float(w.sum())
            else:
                total, n = x.sum((0, 1)), float(x.shape[0] * x.shape[1])
            sums[s] = total if sums[s] is None else sums[s] + total  # [H, D]
            counts[s] += n
        return observe

    def before(inputs: Any, rows: torch.Tensor) -> None:
        mask_now[0] = padding_mask(inputs)

    observe_heads(sweep, data_pass.batches, data_pass.first, observer, before, data_pass.tick)
    if data_pass.reduce is not None:
        sums, counts = data_pass.reduce(sums, counts)
    for s, total in enumerate(sums):
        if total is None:
            sweep.silent(s)
    return [total / max(n, 1.0) for total, n in zip(sums, counts)]


_BUILTINS = (
    AblationMethod("zero", "head output set to 0", _zero_fill, foldable=True),
    AblationMethod("mean", "replaced by its mean over the data", _mean_fill, prepare=_mean_outputs, foldable=True),
    AblationMethod("resample", "replaced by its output on another example of the data, averaged over --draws donors",
                   resample_fill, prepare=resample_outputs, draws=DRAWS),
)


def method_help(names: Sequence[str]) -> str:
    """'zero: head output set to 0; mean: ...' for `--help`."""
    return "; ".join(f"{name}: {REGISTRY.get(name).help}" for name in names) + "."
