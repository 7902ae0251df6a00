"""One registry pattern for every plug-in point: a statistic, an ablation method, a monitor
measurement, an alert detector, a model-family adapter, a folder kind.

A `Registry` holds named entries in a stable order (registration order; `newest_first` for the
adapters, where a user's entry is tried before the built-ins). Its built-ins are declared once, as
a function that returns them, and registered through the same `register` (the same checks) the
first time the registry is used: so a registry's module can list entries defined further down or
in modules it must not import at load time (the adapters import their families then). A user's
entry is `register(entry)`; a test's toy entry is removed with `unregister(name)` in `finally`.
An unknown or duplicate name is a ConfigError that names the registered ones.

Torch-free and importing only `errors`, so any layer (the report and `--help` included) can use it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterable, Iterator, Mapping, TypeVar

from .errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind. what: the kind in words ("ablation method"), for messages;
    key(entry) -> its name (default: its `name`); check(entry): raises ConfigError for an entry
    that is not valid (run before its name is read); builtins() -> the built-in entries, in order;
    newest_first: a later registration goes before every earlier one (built-ins stay last)."""

    def __init__(self, what: str, *, key: Callable[[T], str] = lambda e: e.name,  # type: ignore[attr-defined]
                 check: Callable[[T], None] | None = None, builtins: Callable[[], Iterable[T]] | None = None,
                 newest_first: bool = False):
        self.what = what
        self._key, self._check, self._builtins, self._newest_first = key, check, builtins, newest_first
        self._entries: dict[str, T] = {}
        self._builtin: tuple[T, ...] = ()
        self._loaded = builtins is None

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # first, so that a built-in's own module may read the registry
        assert self._builtins is not None, "a registry without built-ins starts loaded"
        self._builtin = tuple(self._builtins())
        for entry in self._builtin:
            self._add(entry, replace=False, front=False)

    def _add(self, entry: T, *, replace: bool, front: bool) -> str:
        if self._check is not None:
            self._check(entry)
        name = self._key(entry)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a {self.what} needs a name (a non-empty string), got {name!r}")
        if name in self._entries and not replace:
            raise ConfigError(f"{self.what} {name!r} is already registered (registered: {self._listed()}); "
                              "unregister it first, or register with replace=True")
        if front:
            rest = {k: v for k, v in self._entries.items() if k != name}
            self._entries.clear()
            self._entries.update({name: entry, **rest})
        else:
            self._entries[name] = entry  # a replaced entry keeps its place
        return name

    def _listed(self) -> str:
        return ", ".join(self._entries) or "none"

    def register(self, entry: T, *, replace: bool = False) -> T:
        """Add `entry` (replace=True overwrites an entry of the same name); returns it, so it can decorate."""
        self._load()
        self._add(entry, replace=replace, front=self._newest_first)
        return entry

    def unregister(self, name: str, *, missing_ok: bool = False) -> T | None:
        """Remove the entry called `name` and return it (tests remove their toy entries with it);
        ConfigError naming the registered ones when there is none, unless missing_ok."""
        self._load()
        if name not in self._entries:
            if missing_ok:
                return None
            raise ConfigError(f"{self.what} {name!r} is not registered (registered: {self._listed()})")
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        """The entry called `name`; ConfigError naming the registered ones when there is none."""
        self._load()
        if name not in self._entries:
            raise ConfigError(f"{self.what} {name!r:.60} is not one of {self._listed()} (the registered ones)")
        return self._entries[name]

    @contextmanager
    def without(self, names: Iterable[str]) -> Iterator[None]:
        """The registry without the entries called `names` inside the `with` block, then as it was
        (the same entries in the same order), also when the block raises."""
        self._load()
        names, saved = tuple(names), dict(self._entries)
        missing = [n for n in names if n not in saved]
        if missing:
            raise ConfigError(f"{self.what} {missing[0]!r} is not registered (registered: {self._listed()})")
        for name in names:
            del self._entries[name]
        try:
            yield
        finally:
            self._entries.clear()
            self._entries.update(saved)

    def names(self) -> tuple[str, ...]:
        """Every name, in order."""
        self._load()
        return tuple(self._entries)

    def entries(self) -> tuple[T, ...]:
        """Every entry, in order."""
        self._load()
        return tuple(self._entries.values())

    def builtin(self) -> tuple[T, ...]:
        """The built-in entries still registered (not removed or replaced), in their declared order."""
        self._load()
        return tuple(e for e in self._builtin if any(e is v for v in self._entries.values()))

    def mapping(self) -> Mapping[str, T]:
        """A read-only live view name -> entry, in order (for code that reads the registry as a dict)."""
        return _View(self)

    def __iter__(self) -> Iterator[T]:
        return iter(self.entries())

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self.names())})"


class _View(Mapping):
    """Registry.mapping(): reads go to the registry at each use, so a later entry is seen."""

    def __init__(self, registry: Registry[Any]):
        self._registry = registry

    def __getitem__(self, name: str) -> Any:
        if name not in self._registry:
            raise KeyError(name)
        return self._registry.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry.names())

    def __len__(self) -> int:
        return len(self._registry)

    def __repr__(self) -> str:
        return repr(dict(zip(self._registry.names(), self._registry.entries())))
