"""Things registered by name: a duplicate name raises, an unknown name lists the valid ones.

Used by the trainer's algorithms (advantage and KL estimators), its built-in rewards (`--rm-type`)
and the log doctor's rules. No torch here, so the diagnose commands can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

_F = TypeVar("_F", bound=Callable)


class Registry(Generic[_F]):
    """Functions (or classes) registered by name; a duplicate name raises, an unknown name lists the
    valid ones."""

    def __init__(self, kind: str, flag: str | None = None) -> None:
        self.kind = kind
        self.flag = flag
        self._fns: dict[str, _F] = {}

    def register(self, name: str) -> Callable[[_F], _F]:
        """Decorator registering `fn` under `name`. Raises ValueError if `name` is taken."""

        def decorator(fn: _F) -> _F:
            if name in self._fns:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered ({self._fns[name].__qualname__})"
                )
            self._fns[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> _F:
        """The function registered as `name`. Raises ValueError listing the valid names."""
        if name not in self._fns:
            flag = f" ({self.flag})" if self.flag else ""
            raise ValueError(f"unknown {self.kind} {name!r}{flag}; valid: {', '.join(self.names())}")
        return self._fns[name]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._fns)

    def values(self) -> list[_F]:
        """The registered functions (or classes), in registration order."""
        return list(self._fns.values())

    def items(self) -> list[tuple[str, _F]]:
        """(name, function or class) pairs, in registration order."""
        return list(self._fns.items())
