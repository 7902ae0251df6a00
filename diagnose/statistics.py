"""The per-head attention statistics: one registry that computing, the JSON, the CLI and the report all read.

Each `Statistic` says how to compute it from a chunk of attention rows (a function of a `Chunk`,
see attention_stats.py), over which query rows it is averaged (its denominator, a named count),
whether it needs the batch's token ids, and where it is shown: the `diagnose heads` table ("cli"),
the report's head tables ("table"), the report's grid beside the causal effects ("effect_grid"),
its grid of attention statistics ("grid") and its scatter against the effect ("scatter").

Adding a statistic is one `register(Statistic(...))` call (a `Registry`, diagnose/registry.py) (with its test and a line in
docs/heads.md): HeadStats accumulates it, the heads JSON carries it under each head's `attention`,
the rank correlations include it, and every table and plot that its `show` names draws it.

A statistic that measures where a head's weight goes (the first token, the previous token, ...) may
also name a head's *role*: its `role` (a `Role`: the words, the letter in the report's role grid,
the phrase in a flag's reason) makes it one of the shares that roles.py clusters heads on, a
pattern contrast.py calls striking, and a role the CLI and the report name. `roles()` is that
table, read from the registry at each use.

Torch-free on purpose, so that the report (which reads only files) and `--help` can import it:
the compute functions below use only the methods of the tensors they are handed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from .errors import ConfigError
from .registry import Registry

LOCAL = 2  # "local": keys at most this many positions away (not the query itself)
PLACES = ("cli", "table", "effect_grid", "grid", "scatter")  # where a statistic can be shown


@dataclass(frozen=True)
class Role:
    """What a head is called when most of its weight goes where a statistic measures."""

    label: str  # "previous token": the CLI's role column, the report's tables and its role key
    letter: str  # one character, the head's cell in the report's role grid
    phrase: str = ""  # "on the previous token", in a flag's reason (default: "on the " + label)
    within: tuple[str, ...] = ()  # statistics whose mass this one includes, counted there (local: prev, next)
    one_key: bool = True  # one key per query (a position): a lone head far out of the crowd may take it

    def __post_init__(self) -> None:
        if len(self.letter) != 1:
            raise ConfigError(f"role {self.label!r}: letter must be one character, got {self.letter!r}")
        if not self.phrase:
            object.__setattr__(self, "phrase", f"on the {self.label}")


BROAD = "broad"  # the role of a head whose weight goes nowhere in particular: what no role statistic holds
BROAD_ROLE = Role("broad", "B", "broadly", one_key=False)


@dataclass(frozen=True)
class Statistic:
    """One per-head attention statistic.

    compute(chunk) -> [B, H, c]: the value on each query row of a chunk of attention rows (see
    attention_stats.Chunk); HeadStats averages it over the real rows that its `denominator` counts.
    """

    name: str  # the key in the heads JSON's `attention` and in `attention_summary` stats
    label: str  # what it measures, in words (plot titles and axes)
    column: str  # the header of its column in the CLI and report tables
    compute: Callable[[Any], Any]
    denominator: str = "rows"  # a key of DENOMINATORS: the query rows it is averaged over
    fmt: str = ".3f"  # format spec of its values in tables
    show: frozenset[str] = frozenset()  # a subset of PLACES
    needs_tokens: bool = False  # reads chunk.query_ids / chunk.key_ids; NaN where the data has no token ids
    role: Role | None = None  # the role a head has when its weight goes here (roles.py); None: names no role


def entropy(p: Any) -> Any:
    """-sum p log p over the last dim (p = 0 adds 0).  # [..., K] -> [...]

    Two to three times faster than special.entr(p).sum(-1) on CPU, which is not vectorised
    (einsum was faster still on a few long rows but twice as slow on many short ones)."""
    return -p.clamp_min(1e-30).log_().mul_(p).sum(-1)


def _self(c: Any) -> Any:
    return c.at(c.q_pos) if c.offset >= 0 else c.zeros()


def _padding(c: Any) -> Any:
    if c.batch.key_mask is None:
        return c.zeros()
    pad = (1.0 - c.keys)[:, None, :c.K, None]  # [B, 1, K, 1]
    return (c.p @ pad)[..., 0]


def _mean_distance(c: Any) -> Any:
    dist = (c.q_pos[:, None] - c.k_pos[None, :]).abs().float()  # [c, K]
    return (c.p * dist).sum(-1)


def _local(c: Any) -> Any:
    return sum(c.at(c.q_pos + d) + c.at(c.q_pos - d) for d in range(1, LOCAL + 1))


def _duplicates(c: Any) -> Any:
    """Earlier keys holding the query's own token  # [B, c, K] bool (no token ids: None)."""
    q, k = c.query_ids, c.key_ids
    if q is None or k is None:
        return None
    earlier = c.k_pos[None, :] < c.q_pos[:, None]  # [c, K]
    return (k[:, None, :] == q[:, :, None]) & earlier


def _induction_targets(c: Any) -> Any:
    """Keys just after an earlier occurrence of the query's token  # [B, c, K] bool (None without ids).

    Key k is a target when token k-1 equals the query's token and k-1 is earlier than the query
    (prefix matching, Olsson et al. 2022: on "A B ... A" the second A looks at B)."""
    dup = _duplicates(c)
    if dup is None:
        return None
    shifted = dup.new_zeros(dup.shape)
    shifted[..., 1:] = dup[..., :-1]  # key k is a target when key k-1 is a duplicate
    return shifted & (c.k_pos[None, :] <= c.q_pos[:, None])[None]


def _mass_on(targets: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def compute(c: Any) -> Any:
        m = targets(c)
        return c.zeros() if m is None else (c.p * m[:, None].to(c.p.dtype)).sum(-1)  # [B, H, c]
    return compute


def _rows_with(targets: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def weight(c: Any) -> Any:
        m = targets(c)
        return c.zeros()[:, :1] if m is None else m.any(-1)[:, None].to(c.p.dtype)  # [B, 1, c]
    return weight


# The query rows a statistic is averaged over, as a weight per row of the chunk ([c]; None: every
# real row). HeadStats counts each, so shards merge their sums and counts by name.
DENOMINATORS: dict[str, Callable[[Any], Any]] = {
    "rows": lambda c: None,
    "with_prev": lambda c: ((c.q_pos >= 1) & (c.q_pos - 1 < c.Tk)).float(),  # rows with a previous position
    "with_next": lambda c: (c.q_pos + 1 < c.Tk).float(),  # rows with a next position
    # rows whose token occurred earlier (per example, [B, 1, c]; needs token ids)
    "with_duplicate": _rows_with(_duplicates),
    "with_induction_target": _rows_with(_induction_targets),  # ... and has a key after that occurrence
}

def _check(stat: Statistic) -> None:
    if stat.denominator not in DENOMINATORS:
        raise ConfigError(f"attention statistic {stat.name!r}: denominator {stat.denominator!r} is not one of "
                          f"{', '.join(DENOMINATORS)}")
    unknown = set(stat.show) - set(PLACES)
    if unknown:
        raise ConfigError(f"attention statistic {stat.name!r}: {', '.join(sorted(unknown))} is not a place to "
                          f"show it; places: {', '.join(PLACES)}")
    if stat.role is not None:
        _check_role(stat)


# name -> entry, in the order they are computed and written; the built-ins are _BUILTINS below
REGISTRY: Registry[Statistic] = Registry("attention statistic", check=_check, builtins=lambda: _BUILTINS)
STATISTICS: Mapping[str, Statistic] = REGISTRY.mapping()  # the same, read as a dict


def register(stat: Statistic) -> Statistic:
    """Add a statistic to the registry (a ConfigError for a taken name, an unknown place or denominator,
    or a role that clashes with another's)."""
    return REGISTRY.register(stat)


def unregister(name: str) -> Statistic:
    """Remove a statistic (a test's toy entry); ConfigError for a name that is not registered."""
    return REGISTRY.unregister(name)


def _check_role(stat: Statistic) -> None:
    taken = {BROAD: BROAD_ROLE, **roles()}
    if stat.name == BROAD:
        raise ConfigError(f"attention statistic {BROAD!r} cannot name a role: {BROAD!r} is what no role holds")
    for name, role in taken.items():
        if role.letter == stat.role.letter or role.label == stat.role.label:
            raise ConfigError(f"attention statistic {stat.name!r}: role {stat.role.label!r} ({stat.role.letter}) "
                              f"clashes with {name!r}'s ({role.label}, {role.letter}); pick another label and letter")
    missing = [w for w in stat.role.within if w not in taken]
    if missing:
        raise ConfigError(f"attention statistic {stat.name!r}: its role counts within {', '.join(missing)}, which "
                          "names no role; register those first")


def roles() -> dict[str, Role]:
    """name -> Role of every statistic that names a role, in registry order (not `broad`, which is the rest)."""
    return {s.name: s.role for s in STATISTICS.values() if s.role is not None}


def role_label(name: str | None) -> str:
    """A role's words, for a head's role name as the heads JSON writes it ("" for none; an unknown name,
    from a file written with another registry, with its underscores as spaces)."""
    if not name:
        return ""
    known = {BROAD: BROAD_ROLE, **roles()}
    return known[name].label if name in known else name.replace("_", " ")


def shown(place: str) -> list[Statistic]:
    """The statistics shown at `place` (one of PLACES), in registry order."""
    assert place in PLACES, f"unknown place {place!r}"
    return [s for s in REGISTRY if place in s.show]


class _Names(Sequence):
    """The registered statistics' names, read from the registry at each use (so a statistic
    registered after import is seen by everything that iterates them)."""

    def __getitem__(self, i: Any) -> Any:
        return REGISTRY.names()[i]

    def __len__(self) -> int:
        return len(REGISTRY)

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY.names())

    def __contains__(self, name: object) -> bool:
        return name in REGISTRY

    def __repr__(self) -> str:
        return repr(REGISTRY.names())


ATTENTION_STATS: Sequence[str] = _Names()  # every name, in registry order


_ALL = frozenset({"cli", "table", "grid", "scatter"})
_BUILTINS = (
    Statistic("entropy", "entropy (nats)", "entropy", lambda c: entropy(c.p), show=_ALL),
    Statistic("max_weight", "max weight", "max weight", lambda c: c.p.amax(-1),
              show=frozenset({"cli", "table", "effect_grid", "scatter"})),
    Statistic("first_token", "mass on first token", "first token", lambda c: c.p[..., 0], show=_ALL,
              role=Role("first token", "F")),
    Statistic("self", "mass on itself", "itself", _self, show=frozenset({"grid"}),
              role=Role("itself", "S", "on itself")),
    Statistic("prev_token", "mass on previous token", "previous", lambda c: c.at(c.q_pos - 1),
              denominator="with_prev", show=frozenset({"grid"}), role=Role("previous token", "P")),
    Statistic("padding", "mass on padding", "padding", _padding),
    Statistic("mean_distance", "mean distance", "mean distance", _mean_distance, fmt=".2f"),
    Statistic("next_token", "mass on next token", "next", lambda c: c.at(c.q_pos + 1), denominator="with_next",
              role=Role("next token", "N")),
    Statistic("last_token", "mass on last token", "last token", lambda c: c.at(c.last),
              role=Role("last token", "L", "on the last real token ([SEP] in BERT-style inputs)")),
    Statistic("local", f"mass within {LOCAL} positions", "local", _local,
              role=Role("local window", "W", f"within {LOCAL} positions", within=("prev_token", "next_token"),
                        one_key=False)),
    Statistic("duplicate_token", "mass on earlier copies of the token", "duplicate", _mass_on(_duplicates),
              denominator="with_duplicate", needs_tokens=True,
              role=Role("duplicate token", "D", "on earlier copies of its own token")),
    Statistic("induction", "mass after earlier copies (induction)", "induction", _mass_on(_induction_targets),
              denominator="with_induction_target", needs_tokens=True, show=frozenset({"grid"}),
              role=Role("induction", "I", "on the token after an earlier copy of its own (induction)")),
)
